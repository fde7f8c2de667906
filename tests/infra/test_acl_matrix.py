"""The broker ACL matrix (infra/acl_matrix.py) is the one source of truth: the admin API bindings
`unlearn kafka-init` creates, the kafka-acls.sh commands and the docs table equal it, and every
service's principal may do what its code does, with names taken from the code (topics, families,
consumer group ids), and no more than its role on the topics that decide exactness and rights.
No broker is involved here: tests/infra/test_secured_kafka.py applies the matrix to a real one."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from unlearn.common.families import heads_family, state_family, transit_private_family
from unlearn.common.registry import CLIENT_REGISTRY_TOPIC, REGISTRY_TOPIC
from unlearn.infra.acl_matrix import MATRIX, PRINCIPALS, Operation, allows, docs_table, render_commands
from unlearn.infra.settings import Settings
from unlearn.runtime.topics import TOPICS

ROOT = Path(__file__).resolve().parents[2]
P = "acme-prod."  # any prefix: the matrix is relative to it


def _command_rules(prefix: str) -> list[tuple[str, str, str, str, frozenset[str]]]:
    """(principal, resource, full name, pattern, operations) of every kafka-acls.sh command."""
    rules = []
    for argv in render_commands(prefix, "broker:9092", "admin.properties"):
        args = shlex.split(shlex.join(argv))  # survives the shell as printed by `unlearn acls commands`
        assert args[0] == "kafka-acls.sh" and "--add" in args and "--deny-principal" not in args
        opts: dict[str, list[str]] = {}
        for i, a in enumerate(args):
            if a.startswith("--") and a not in ("--add", "--cluster"):
                opts.setdefault(a, []).append(args[i + 1])
        (principal,) = opts["--allow-principal"]
        ops = frozenset(o.upper().replace("DESCRIBECONFIGS", "DESCRIBE_CONFIGS") for o in opts["--operation"])
        if "--cluster" in args:
            rules.append((principal, "cluster", "kafka-cluster", "literal", ops))
            continue
        (kind,) = [k for k in ("--topic", "--group") if k in opts]
        (name,) = opts[kind]
        (pattern,) = opts["--resource-pattern-type"]
        rules.append((principal, kind[2:], name, pattern.lower(), ops))
    return rules


def _want(prefix: str) -> list[tuple[str, str, str, str, frozenset[str]]]:
    return [(f"User:{g.principal}", g.resource, g.full_name(prefix), g.pattern, frozenset(g.operations))
            for g in MATRIX]


def test_rendered_commands_cover_exactly_the_matrix() -> None:
    rules = _command_rules(P)
    assert sorted(rules, key=repr) == sorted(_want(P), key=repr)
    assert len(set(rules)) == len(rules)


def test_admin_bindings_cover_exactly_the_matrix() -> None:
    """What `unlearn kafka-init` creates: one ALLOW binding per grant and operation, any host."""
    from unlearn.infra.kafka_init import acl_bindings

    bindings = acl_bindings(P)
    assert len(set(bindings)) == len(bindings) == sum(len(g.operations) for g in MATRIX)
    assert {(b.permission_type.name, b.host) for b in bindings} == {("ALLOW", "*")}
    kinds = {"TOPIC": "topic", "GROUP": "group", "BROKER": "cluster"}
    grouped: dict[tuple[str, str, str, str], set[str]] = {}
    for b in bindings:
        key = (b.principal, kinds[b.restype.name], b.name, b.resource_pattern_type.name.lower())
        grouped.setdefault(key, set()).add(b.operation.name)
    got = [(*k, frozenset(ops)) for k, ops in grouped.items()]
    assert sorted(got, key=repr) == sorted(_want(P), key=repr)


def test_docs_table_equals_the_matrix() -> None:
    text = (ROOT / "docs/security.md").read_text()
    m = re.search(r"<!-- acl-matrix:begin[^>]*-->\n(.*?)<!-- acl-matrix:end -->", text, re.S)
    assert m, "docs/security.md lacks the acl-matrix markers"
    assert m.group(1) == docs_table(), "paste the output of `unlearn acls docs` into docs/security.md"


def test_one_principal_per_service_and_no_wildcards() -> None:
    assert {g.principal for g in MATRIX} == set(PRINCIPALS)
    for g in MATRIX:
        assert g.operations and len(set(g.operations)) == len(g.operations)
        assert "*" not in g.name and "ALL" not in g.operations  # type: ignore[comparison-overlap]
        if g.principal != "operator":  # only the operator holds grants on the whole prefix
            assert g.name or g.resource == "cluster", g


def _group_of(monkeypatch: pytest.MonkeyPatch, make: Any) -> str:
    """The group.id a code path gives its librdkafka consumer (the Consumer is faked)."""
    import confluent_kafka

    seen: list[str] = []

    class FakeConsumer:
        def __init__(self, conf: dict[str, Any]) -> None:
            seen.append(conf["group.id"])

    monkeypatch.setattr(confluent_kafka, "Consumer", FakeConsumer)
    make()
    (group,) = seen
    return group


def _reader_group(monkeypatch: pytest.MonkeyPatch, settings: Settings, role: str) -> str:
    from unlearn.runtime import topic_reader

    return _group_of(monkeypatch, lambda: topic_reader._consumer(settings, role))


def _roles_in_code() -> dict[str, set[str]]:
    """role="..." literals passed to topic readers and followers, per source file."""
    found: dict[str, set[str]] = {}
    for sub in ("infra", "services", "runtime", "common", "streams", "ledger", "features"):
        for path in (ROOT / sub).rglob("*.py"):
            for role in re.findall(r'\brole="([a-z-]+)"', path.read_text()):
                found.setdefault(role, set()).add(str(path.relative_to(ROOT)))
    return found


# Which principal runs the code that uses each reader role (a new role fails the next test until
# it is listed here and granted in the matrix).
ROLE_PRINCIPALS = {
    "serving": {"serving"},                       # services/serving/heads_follower.py
    "registry": {"featurizer", "ledger", "serving", "operator", "verifier"},  # shared/registry.py, unlearn audit
    "clients": {"featurizer", "operator"},        # common/registry.py
    "verifier": {"verifier"},                     # services/verifier/reading.py, services/erasure/report.py
    "featurizer": {"featurizer"},                 # common/ readers of streams/featurizer/key_store.py
    "ledger-keytail": {"ledger"},                 # common/key_tail.py (the ledger's key follower)
    "head-reader": {"client", "verifier"},        # services/client/head_reader.py (verifier: unlearn audit)
    "head-follower": {"client"},                  # services/client/head_reader.py (HeadFollower)
    "client-receipts": {"client"},                # services/client/receipt_listener.py
    "demo-receipts": set(),                       # the demo runs on the embedded broker only
    "reader": set(), "follower": set(),           # defaults of runtime/topic_reader.py
}


def test_every_reader_role_in_the_code_is_known() -> None:
    assert set(_roles_in_code()) <= set(ROLE_PRINCIPALS), _roles_in_code()


@pytest.mark.parametrize("role", sorted(r for r, who in ROLE_PRINCIPALS.items() if who))
def test_reader_groups_are_granted(monkeypatch: pytest.MonkeyPatch, role: str) -> None:
    """librdkafka looks up the coordinator of a consumer's group.id even when it only assigns
    partitions (DESCRIBE on the group), so group-less readers need their group ids granted too."""
    group = _reader_group(monkeypatch, Settings(bootstrap="b:9092", topic_prefix=P), role)
    for principal in ROLE_PRINCIPALS[role]:
        assert allows(principal, "READ", "group", group, P), (principal, group)


# Consumer group ids the workers build from the prefix (f"{...topic_prefix}NAME"), per file, and
# the principal that runs that code (a new group id fails the test until it is listed and granted).
WORKER_GROUP_FILES = {
    "streams/featurizer/service.py": {"featurizer"},
    "streams/featurizer/changelog_reader.py": {"featurizer"},
    "streams/ledger/worker.py": {"ledger"},
    "streams/ledger/changelog_store.py": {"ledger"},
    "runtime/log_position.py": {"featurizer", "ledger"},
    "streams/featurizer/erasure.py": {"featurizer"},
    "services/client/transit_key_cache.py": {"client"},  # its reader of transit-keys (assign only)
    "services/cdc/cli.py": {"cdc"},  # the bridge's group P cdc.<slot>
}


def test_worker_groups_are_granted() -> None:
    found = {}
    for sub in ("infra", "services", "runtime", "common", "streams", "ledger", "features"):
        for path in (ROOT / sub).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            for name in re.findall(r'topic_prefix\}([a-z.-]+)(\{)?"?', path.read_text()):
                if rel not in ("infra/settings.py", "runtime/topic_reader.py"):
                    found.setdefault(rel, set()).add(name[0] + ("x1" if name[1] else ""))
    assert set(found) == set(WORKER_GROUP_FILES), found
    for rel, names in found.items():
        for name in names:
            for principal in WORKER_GROUP_FILES[rel]:
                assert allows(principal, "READ", "group", P + name, P), (rel, principal, name)
    assert allows("featurizer", "READ", "group", f"{P}featurizer.tenant-a", P)  # federated group


WRITES = {  # logical topic -> the only principals that may write it
    "requests": {"client", "cdc"},
    "requests.by-head": {"featurizer"},
    "deltas": {"featurizer"},
    "featurizer-cache": {"featurizer"},
    "receipts": {"featurizer", "ledger"},
    "deadletter": {"featurizer", "ledger", "cdc"},
    REGISTRY_TOPIC: {"operator", "featurizer"},
    CLIENT_REGISTRY_TOPIC: {"operator"},
    "transit-keys": {"featurizer"},  # only the featurizer publishes transit keys: a forged one would be a decoy
}


def test_every_topic_has_its_writers_and_only_them() -> None:
    assert set(WRITES) == set(TOPICS) | {REGISTRY_TOPIC, CLIENT_REGISTRY_TOPIC}
    for logical, writers in WRITES.items():
        got = {p for p in PRINCIPALS if allows(p, "WRITE", "topic", P + logical, P)}
        assert got == writers, logical
    heads, state = heads_family(P).topic(3, 7), state_family(P).topic(3, 7)
    assert {p for p in PRINCIPALS if allows(p, "WRITE", "topic", heads, P)} == {"ledger"}
    assert {p for p in PRINCIPALS if allows(p, "WRITE", "topic", state, P)} == {"ledger"}
    assert {p for p in PRINCIPALS if allows(p, "WRITE", "topic", f"{P}subject-keys.p3.g7", P)} == {"featurizer"}
    transit = transit_private_family(P).topic(3, 7)  # private transit keys: the featurizer's, read by the verifier
    assert {p for p in PRINCIPALS if allows(p, "WRITE", "topic", transit, P)} == {"featurizer"}
    assert {p for p in PRINCIPALS if allows(p, "READ", "topic", transit, P)} == {"featurizer", "verifier"}


NEEDS: dict[str, list[tuple[Operation, str]]] = {  # principal -> (operation, topic relative to P)
    "featurizer": [("READ", "requests"), ("READ", "requests.by-head"), ("WRITE", "requests.by-head"),
                   ("DELETE", "requests"), ("DELETE", "requests.by-head"),  # erasure.Trimmer: DeleteRecords
                   ("CREATE", "requests.by-head"), ("READ", "featurizer-cache"), ("WRITE", "featurizer-cache"),
                   ("READ", REGISTRY_TOPIC), ("WRITE", REGISTRY_TOPIC), ("READ", CLIENT_REGISTRY_TOPIC),
                   ("WRITE", "deltas"), ("WRITE", "receipts"), ("WRITE", "deadletter"),
                   ("CREATE", "subject-keys.p0.g1"), ("DELETE", "subject-keys.p0.g0"),
                   ("READ", "subject-keys.p0.g1"), ("WRITE", "subject-keys.p0.g1")]
    + [(op, "transit-private.p0.g1") for op in ("READ", "WRITE", "CREATE", "DELETE")],
    # run_ledger_worker calls create_topics(settings): every project topic must be visible to it
    "ledger": [("DESCRIBE", t) for t in TOPICS]
    + [("READ", "deltas"), ("WRITE", "receipts"), ("WRITE", "deadletter"), ("READ", REGISTRY_TOPIC),
               ("READ", "subject-keys.p0.g0")]
    + [(op, t) for t in ("heads.p2.g5", "ledger-state.p2.g5") for op in ("READ", "WRITE", "CREATE", "DELETE")],
    "serving": [("READ", "heads.p0.g0"), ("READ", REGISTRY_TOPIC)],
    "verifier": [("READ", "deltas"), ("READ", "heads.p1.g0"), ("READ", "receipts"), ("READ", "subject-keys.p1.g0"),
                 ("READ", "transit-private.p1.g0"), ("READ", REGISTRY_TOPIC)],
    "client": [("WRITE", "requests"), ("READ", "receipts"), ("READ", "heads.p0.g3"), ("DESCRIBE", "deltas")],
    # services/cdc: ensure_topic (CREATE), Connect's producer (WRITE), the bridge (READ), trim (DELETE)
    "cdc": [(op, "cdc.public.items") for op in ("CREATE", "WRITE", "READ", "DELETE")]
    + [("WRITE", "requests"), ("WRITE", "deadletter")],
    "operator": [("CREATE", t) for t in TOPICS] + [("DESCRIBE", t) for t in TOPICS]
    + [("READ", REGISTRY_TOPIC), ("WRITE", REGISTRY_TOPIC), ("READ", CLIENT_REGISTRY_TOPIC),
       ("WRITE", CLIENT_REGISTRY_TOPIC)],
}


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_each_principal_may_do_what_its_code_does(principal: str) -> None:
    for op, topic in NEEDS[principal]:
        full = P + topic
        assert heads_family(P).matches(full) or not topic.startswith("heads.")
        assert allows(principal, op, "topic", full, P), (principal, op, full)
        assert allows(principal, "DESCRIBE", "topic", full, P) or op == "CREATE"


def test_least_privilege_examples() -> None:
    # Nobody but the operator creates the project's fixed topics or touches the client registry.
    assert not allows("featurizer", "CREATE", "topic", P + "deltas", P)
    assert not allows("ledger", "READ", "topic", P + CLIENT_REGISTRY_TOPIC, P)
    assert not allows("client", "READ", "topic", P + "requests", P)  # clients do not read each other's requests
    assert not allows("client", "READ", "topic", P + "deadletter", P)
    # DeleteRecords of raw inputs: the featurizer (erasure.Trimmer) and the operator (topic administration) only
    for raw in ("requests", "requests.by-head"):
        assert {p for p in PRINCIPALS if allows(p, "DELETE", "topic", P + raw, P)} == {"featurizer", "operator"}
    assert not allows("serving", "READ", "topic", P + "deltas", P)
    assert not allows("verifier", "WRITE", "topic", heads_family(P).topic(0, 0), P)
    # Another deployment's prefix is out of reach of everyone, the operator included.
    for principal in PRINCIPALS:
        assert not allows(principal, "READ", "topic", "other.requests", P)
        assert not allows(principal, "CREATE", "topic", "other.requests", P)
    assert not allows("ledger", "CREATE", "topic", P + "heads-evil", P)  # prefixed means "heads." exactly
    # cdc: its change topics and two writes, nothing else (no read of what it produces, no other family)
    assert not allows("cdc", "READ", "topic", P + "requests", P)
    assert not allows("cdc", "DELETE", "topic", P + "requests", P)
    assert not allows("cdc", "READ", "topic", f"{P}subject-keys.p0.g0", P)
    assert not allows("cdc", "CREATE", "topic", P + "cdc-evil", P)
    assert not allows("cdc", "DESCRIBE", "cluster", "kafka-cluster", P)
    assert {p for p in PRINCIPALS if allows(p, "READ", "topic", P + "cdc.public.items", P)} == {"cdc", "verifier"}
    assert {p for p in PRINCIPALS if allows(p, "WRITE", "topic", P + "cdc.public.items", P)} == {"cdc"}
