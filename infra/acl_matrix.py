"""The broker ACL matrix: one principal per service, as data (the one source of truth).

``docs/security.md`` shows :func:`docs_table`; ``unlearn kafka-init`` (``infra/kafka_init.py``, run by
``infra/kafka/init.sh``: the compose deployment's init service and the secured-Kafka tests) creates
these grants over the admin API; :func:`render_commands` prints them as ``kafka-acls.sh`` lines
for a cluster administered with Kafka's own tools. Tests check each against :data:`MATRIX`, and
each service's needs, named from the code's topic and group names, against :func:`allows`
(``tests/infra/test_acl_matrix.py``); ``tests/infra/test_secured_kafka.py`` runs the pipeline
under them on a real broker. Change the matrix here, then run ``unlearn acls docs`` (paste the
table) and ``unlearn kafka-init`` on the deployment.

Names are relative to the deployment prefix ``P`` (``UNLEARN_TOPIC_PREFIX``): a grant of
``requests`` is the topic ``P requests``. ``prefixed`` grants are Kafka ``PREFIXED`` resource
patterns: every name that starts with ``P`` + the name (the rotated topic families
``heads.``, ``ledger-state.``, ``subject-keys.``, ``transit-private.``, the change topics ``cdc.``, and consumer
group ids that end in a random suffix). Kafka's implication rules apply: READ, WRITE, DELETE and ALTER imply DESCRIBE.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "MATRIX",
    "PRINCIPALS",
    "Grant",
    "acls_main",
    "allows",
    "docs_table",
    "grants_of",
    "render_commands",
]

Resource = Literal["topic", "group", "cluster"]
Pattern = Literal["literal", "prefixed"]
Operation = Literal["READ", "WRITE", "CREATE", "DELETE", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER"]

PRINCIPALS: tuple[str, ...] = ("operator", "featurizer", "ledger", "serving", "verifier", "client", "cdc")
"""One SCRAM user per service (``User:<name>``). ``client`` stands for upstream apps (SDK, CLI);
``cdc`` for `unlearn cdc` and the Kafka Connect standalone worker it runs (docs/cdc.md)."""

@dataclass(frozen=True)
class Grant:
    """ALLOW ``operations`` on one resource pattern to ``User:<principal>`` (any host)."""

    principal: str
    resource: Resource
    name: str  # relative to the prefix; "" with prefixed = everything under the prefix
    operations: tuple[Operation, ...]
    pattern: Pattern = "literal"
    why: str = ""

    def full_name(self, prefix: str) -> str:
        return "kafka-cluster" if self.resource == "cluster" else prefix + self.name


def _t(principal: str, name: str, *ops: Operation, why: str, prefixed: bool = False) -> Grant:
    return Grant(principal, "topic", name, ops, "prefixed" if prefixed else "literal", why)


def _g(principal: str, name: str, *ops: Operation, why: str, prefixed: bool = True) -> Grant:
    return Grant(principal, "group", name, ops, "prefixed" if prefixed else "literal", why)


MATRIX: tuple[Grant, ...] = (
    # operator: topic administration and the two registries.
    _t("operator", "", "CREATE", "DELETE", "DESCRIBE", "DESCRIBE_CONFIGS", prefixed=True,
       why="`unlearn topics create|list`; deleting superseded or test topics"),
    _t("operator", "head-registry", "READ", "WRITE", why="`unlearn heads create|extend|show|list`"),
    _t("operator", "client-registry", "READ", "WRITE", why="`unlearn clients ...`: whoever writes it grants rights"),
    _g("operator", "", "READ", "DELETE", why="registry readers' group ids; deleting a stale worker group"),
    Grant("operator", "cluster", "", ("DESCRIBE",), why="cluster metadata"),
    # featurizer
    _t("featurizer", "requests", "READ", "DELETE",
       why="its input; DeleteRecords of what it has durably taken over (`streams/featurizer/raw_input_trim.py`)"),
    _t("featurizer", "requests.by-head", "READ", "WRITE", "CREATE", "DELETE",
       why="its repartition topic (created at start if missing: `ensure_topic`); DeleteRecords as for `requests`"),
    _t("featurizer", "featurizer-cache", "READ", "WRITE", why="the feature cache's changelog"),
    _t("featurizer", "head-registry", "READ", "WRITE", why="contracts; auto-created heads"),
    _t("featurizer", "client-registry", "READ", why="signed requests: keys and rights"),
    _t("featurizer", "deltas", "READ", "WRITE", why="its output (read: log ends, for keys awaiting destruction)"),
    _t("featurizer", "receipts", "WRITE", why="rejected deletes"),
    _t("featurizer", "deadletter", "WRITE", why="refused requests"),
    _t("featurizer", "subject-keys.", "READ", "WRITE", "CREATE", "DELETE", prefixed=True,
       why="the subject-keys family it creates and rotates"),
    _t("featurizer", "transit-private.", "READ", "WRITE", "CREATE", "DELETE", prefixed=True,
       why="the private halves of its transit keys: a family it creates and rotates"),
    _t("featurizer", "transit-keys", "WRITE", "CREATE", why="the public halves of its transit keys"),
    _t("featurizer", "ledger-state.", "READ", prefixed=True,
       why="the ledger's checkpoint floors: when a deleted sample's key may be destroyed"),
    _g("featurizer", "featurizer", "READ",
       why="its group `P featurizer` (`.client` when federated) and `P featurizer-restore-*`"),
    _g("featurizer", "registry-", "READ", why="head-registry follower"),
    _g("featurizer", "clients-", "READ", why="client-registry follower"),
    _g("featurizer", "log-probe", "READ", prefixed=False, why="log-end probe (`runtime/log_position.py`)"),
    # ledger
    _t("ledger", "deltas", "READ", why="its input"),
    _t("ledger", "receipts", "WRITE", why="applied deletes"),
    _t("ledger", "deadletter", "WRITE", why="refused deltas"),
    _t("ledger", "head-registry", "READ", why="a new head's gamma from its contract"),
    _t("ledger", "ledger-state.", "READ", "WRITE", "CREATE", "DELETE", prefixed=True,
       why="its state topics (created, trimmed with DeleteRecords or rotated by the ledger)"),
    _t("ledger", "heads.", "READ", "WRITE", "CREATE", "DELETE", prefixed=True,
       why="head-update topics (created, trimmed with DeleteRecords or rotated by the ledger)"),
    _t("ledger", "subject-keys.", "READ", prefixed=True, why="the subject-keys family"),
    *(_t("ledger", name, "DESCRIBE", why="at start it ensures every project topic exists (`create_topics`)"
         + ("; its partition count names a head's key partition (`streams/ledger/row_opener.py`)"
            if name == "requests.by-head" else ""))
      for name in ("requests", "requests.by-head", "featurizer-cache", "client-registry", "transit-keys")),
    _g("ledger", "ledger", "READ", why="its group `P ledger`, `P ledger-recovery-*` and its key follower's "
       "`P ledger-keytail-*`"),
    _g("ledger", "registry-", "READ", why="head-registry follower"),
    _g("ledger", "log-probe", "READ", prefixed=False, why="log-end probe (`runtime/log_position.py`)"),
    # serving
    _t("serving", "heads.", "READ", prefixed=True, why="the heads it serves"),
    _t("serving", "head-registry", "READ", why="contracts (quantization, classes)"),
    _g("serving", "serving-", "READ", why="heads follower"),
    _g("serving", "registry-", "READ", why="head-registry follower"),
    # verifier
    _t("verifier", "deltas", "READ", why="the deltas it replays"),
    _t("verifier", "heads.", "READ", prefixed=True, why="the published head it certifies"),
    _t("verifier", "receipts", "READ", why="receipts it checks"),
    _t("verifier", "subject-keys.", "READ", prefixed=True, why="the subject-keys family"),
    _t("verifier", "featurizer-cache", "READ", why="`unlearn erasure-report`: no plaintext record of the subject"),
    _t("verifier", "transit-private.", "READ", prefixed=True,
       why="`unlearn erasure-report`: which transit keys still exist"),
    _t("verifier", "deadletter", "READ", why="`unlearn erasure-report`: no readable original of the subject"),
    *(_t("verifier", name, "READ", why="`unlearn erasure-report`: no readable raw input of the subject")
      for name in ("requests", "requests.by-head")),
    _t("verifier", "head-registry", "READ", why="`unlearn audit`: a head's contract"),
    _t("verifier", "cdc.", "READ", prefixed=True,
       why="`unlearn erasure-report`: no change record of `unlearn cdc` holds a row of the subject"),
    _g("verifier", "verifier-", "READ", why="its readers"),
    _g("verifier", "head-reader-", "READ", why="`unlearn audit`: the latest heads (`read_heads`)"),
    _g("verifier", "registry-", "READ", why="`unlearn audit`: head-registry reader"),
    # client
    _t("client", "requests", "WRITE", why="add, delete, delete_subject"),
    _t("client", "receipts", "READ", why="the SDK's receipt listener (`--wait`)"),
    _t("client", "transit-keys", "READ", why="the SDK seals adds under the published transit keys"),
    _t("client", "requests.by-head", "DESCRIBE", why="the SDK routes a head to its transit key's partition"),
    _t("client", "heads.", "READ", prefixed=True, why="`unlearn head`"),
    _t("client", "deltas", "DESCRIBE", why="`unlearn head` tells 'no such deployment' from 'no head yet'"),
    _g("client", "client-receipts-", "READ", why="receipt listener"),
    _g("client", "head-reader-", "READ", why="`unlearn head`"),
    _g("client", "head-follower-", "READ", why="the SDK's `HeadFollower`"),
    _g("client", "client-transit-", "READ", why="the SDK's transit key reader"),
    # cdc: `unlearn cdc` and its Kafka Connect standalone worker, one principal (docs/cdc.md). Standalone
    # keeps Connect's source offsets in a local file: no config/offset/status topics, no worker group;
    # Debezium's PostgreSQL connector here writes no heartbeat, schema or transaction topic.
    _t("cdc", "cdc.", "READ", "WRITE", "CREATE", "DELETE", prefixed=True,
       why="its change topics `P cdc.<schema>.<table>`: created by `unlearn cdc` (one partition), written by "
           "Connect's producer, read by the bridge, trimmed with DeleteRecords once forwarded"),
    _t("cdc", "requests", "WRITE", why="the adds and deletes it maps the changes to"),
    _t("cdc", "deadletter", "WRITE", why="changes that cannot become a request"),
    _g("cdc", "cdc.", "READ", why="the bridge's group `P cdc.<slot>` (Connect standalone uses none)"),
)
"""Every ALLOW rule of the deployment; nothing else is allowed (allow.everyone.if.no.acl.found=false)."""

_IMPLIES_DESCRIBE = frozenset({"READ", "WRITE", "DELETE", "ALTER", "DESCRIBE"})


def grants_of(principal: str) -> list[Grant]:
    return [g for g in MATRIX if g.principal == principal]


def allows(principal: str, operation: Operation, resource: Resource, full_name: str, prefix: str,
           matrix: Iterable[Grant] = MATRIX) -> bool:
    """Would the matrix let ``principal`` do ``operation`` on the named resource (Kafka's rules:
    literal or prefix match, and DESCRIBE implied by READ, WRITE, DELETE, ALTER)?"""
    for g in matrix:
        if g.principal != principal or g.resource != resource:
            continue
        name = g.full_name(prefix)
        if resource != "cluster" and not (full_name == name if g.pattern == "literal"
                                          else full_name.startswith(name)):
            continue
        ops = set(g.operations)
        if operation in ops or (operation == "DESCRIBE" and ops & _IMPLIES_DESCRIBE):
            return True
    return False


def render_commands(prefix: str = "${P}", bootstrap: str = "${BOOTSTRAP}",
                    command_config: str = "${ADMIN_CONFIG}") -> list[list[str]]:
    """One ``kafka-acls.sh --add`` argv per grant (shell variables stay unexpanded when given)."""
    out = []
    for g in MATRIX:
        argv = ["kafka-acls.sh", "--bootstrap-server", bootstrap, "--command-config", command_config,
                "--add", "--allow-principal", f"User:{g.principal}"]
        for op in g.operations:
            argv += ["--operation", _CLI_OP[op]]
        if g.resource == "cluster":
            argv.append("--cluster")
        else:
            argv += [f"--{g.resource}", g.full_name(prefix), "--resource-pattern-type", g.pattern.upper()]
        out.append(argv)
    return out


_CLI_OP = {"READ": "Read", "WRITE": "Write", "CREATE": "Create", "DELETE": "Delete", "DESCRIBE": "Describe",
           "DESCRIBE_CONFIGS": "DescribeConfigs", "ALTER": "Alter"}


def docs_table() -> str:
    """The markdown table in docs/security.md (one row per grant)."""
    rows = ["| principal | resource | pattern | operations | why |", "|---|---|---|---|---|"]
    for g in MATRIX:
        res = "cluster" if g.resource == "cluster" else f"{g.resource} `P {g.name}`"
        if g.resource != "cluster" and not g.name:
            res = f"{g.resource} `P`"
        why = g.why.replace("|", "\\|")  # a pipe would end the cell
        rows.append(f"| {g.principal} | {res} | {g.pattern} | {', '.join(g.operations)} | {why} |")
    return "\n".join(rows) + "\n"


def acls_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn acls docs|commands [--prefix P] [--bootstrap B] [--command-config F]``."""
    ap = argparse.ArgumentParser(prog="unlearn acls", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("what", choices=("docs", "commands"),
                    help="docs: the docs/security.md table; commands: kafka-acls.sh lines for one prefix "
                         "and broker (`unlearn kafka-init` applies the matrix over the admin API)")
    ap.add_argument("--prefix", default="unlearn.", help="topic prefix for `commands` (default unlearn.)")
    ap.add_argument("--bootstrap", default="localhost:9092")
    ap.add_argument("--command-config", default="admin.properties")
    args = ap.parse_args(argv)
    if args.what == "docs":
        sys.stdout.write(docs_table())
    else:
        for cmd in render_commands(args.prefix, args.bootstrap, args.command_config):
            print(shlex.join(cmd))
    return 0


if __name__ == "__main__":
    sys.exit(acls_main())
