"""The secured deployment, started for real: the project's Apache Kafka with the compose broker's
security (SASL_SSL/SCRAM-SHA-512 listener with a throwaway CA, controllers over mutual TLS,
StandardAuthorizer, nothing allowed without an ACL), the
compose init script itself (infra/kafka/init.sh: a SCRAM user per service and the ACL matrix),
then the whole pipeline with each service as its own principal: a client's adds and delete reach
an exact head, a receipt, a served prediction and a verifier's certificate. And the matrix
refuses: a client may not write ``deltas``, read the ledger's state or change ACLs; only the
featurizer writes ``deltas``; a wrong password gets nothing.

One secured broker for the module (its own, not the session's); one topic prefix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from unlearn.common.families import heads_family, state_family
from unlearn.infra.acl_matrix import PRINCIPALS
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.runtime.topic_family import TopicFamily

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
D = 6
HEAD = "secured"


@dataclass
class Secured:
    bootstrap: str
    prefix: str
    admin_password: str
    ca: str
    passwords: dict[str, str]
    init_output: str
    tmp: Path

    def settings(self, principal: str, password: str | None = None, **changes: Any) -> Settings:
        """The Settings a service running as ``principal`` gets: like compose, its own Kafka
        client properties file in ``UNLEARN_KAFKA_PROPERTIES``."""
        password = self.passwords[principal] if password is None else password
        path = self.tmp / f"{principal}-{uuid.uuid4().hex[:8]}.properties"
        path.write_text(f"# {principal}: as docker-compose.yml's kafka-{principal} config\n"
                        f"security.protocol=SASL_SSL\nssl.ca.location={self.ca}\nsasl.mechanism=SCRAM-SHA-512\n"
                        f"sasl.username={principal}\nsasl.password={password}\n")
        return Settings.from_env(bootstrap=self.bootstrap, profile="kafka", topic_prefix=self.prefix,
                                 kafka_properties=str(path), **changes)

    def admin_conf(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": self.ca,
                "ssl.endpoint.identification.algorithm": "https", "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "admin", "sasl.password": self.admin_password}


def run_init(bootstrap: str, prefix: str, admin_password: str, ca: str,
             passwords: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """infra/kafka/init.sh, as the compose kafka-init service runs it (its env), with this venv's CLI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNLEARN_")}
    env.update(BOOTSTRAP=bootstrap, KAFKA_ADMIN_PASSWORD=admin_password, UNLEARN_TOPIC_PREFIX=prefix,
               KAFKA_SSL_CA_LOCATION=ca,
               UNLEARN_CLI=str(Path(sys.executable).parent / "unlearn"),
               **{f"UNLEARN_{p.upper()}_PASSWORD": pw for p, pw in passwords.items()})
    return subprocess.run(["bash", str(ROOT / "infra/kafka/init.sh")], env=env, capture_output=True, text=True,
                          timeout=120)


def start_secured_broker(admin_password: str, log: Path,
                         timeout: float = 120.0) -> tuple[subprocess.Popen[str], str, str]:
    """``unlearn broker --engine kafka --secure`` as an operator runs it (the admin password in
    KAFKA_ADMIN_PASSWORD); returns the process, the ``ca=`` and the ``bootstrap=`` it prints when ready."""
    import queue
    import threading

    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNLEARN_", "KAFKA_"))}
    env["KAFKA_ADMIN_PASSWORD"] = admin_password
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "unlearn.services.cli", "broker", "--engine", "kafka",
                                 "--secure"], env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()], daemon=True).start()
    deadline = time.monotonic() + timeout
    ca = ""
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if line.startswith("ca="):
            ca = line.strip().split("=", 1)[1]
        if line.startswith("bootstrap="):
            assert ca, "no ca= line before bootstrap="
            return proc, ca, line.strip().split("=", 1)[1]
    proc.kill()
    raise AssertionError(f"`unlearn broker --engine kafka --secure` not ready in {timeout:g}s:\n"
                         + log.read_text(errors="replace")[-3000:])


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    from unlearn.runtime.topics import create_topics

    tag = uuid.uuid4().hex[:8]
    admin_password = f"admin-{tag}"
    passwords = {p: f"{p}-{uuid.uuid4().hex[:12]}" for p in PRINCIPALS}
    prefix = f"t.secured.{tag}."
    tmp = tmp_path_factory.mktemp("secured")
    broker, ca, bootstrap = start_secured_broker(admin_password, tmp / "broker.log")
    try:
        done = run_init(bootstrap, prefix, admin_password, ca, passwords)
        assert done.returncode == 0, done.stdout + done.stderr
        secured = Secured(bootstrap, prefix, admin_password, ca, passwords, done.stdout, tmp)
        create_topics(secured.settings("operator"))  # compose: the `topics` service, as operator
        yield secured
    finally:
        broker.terminate()
        try:
            broker.wait(60)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait()


def _auth_error(exc: BaseException | KafkaError | None) -> str:
    err = exc.args[0] if isinstance(exc, KafkaException) else exc
    return err.name() if isinstance(err, KafkaError) else repr(err)


# --------------------------------------------------------------------------- the init script
def test_broker_security_is_the_compose_brokers() -> None:
    """SecuredLocalKafka's security settings are broker.sh's (host and ports aside)."""
    from unlearn.infra.local.secured_kafka import SECURITY_PROPERTIES

    props = dict(line.split("=", 1) for line in (ROOT / "infra/kafka/broker.sh").read_text().splitlines()
                 if re.match(r"^[a-z][a-z0-9._-]*=", line) and not line.startswith(("jaas=", "umask", "keystore_")))
    props["super.users"] = props["super.users"].replace("${KAFKA_TLS_PRINCIPAL:-", "").replace("}", "")
    assert {k: props[k] for k in SECURITY_PROPERTIES} == SECURITY_PROPERTIES
    assert "--add-scram \"SCRAM-SHA-512=[name=admin,password=${KAFKA_ADMIN_PASSWORD}]\"" in \
        (ROOT / "infra/kafka/broker.sh").read_text()


def test_init_script_creates_the_users_and_exactly_the_matrix(secured: Secured) -> None:
    from unlearn.infra.kafka_init import acl_bindings

    assert "scram: SCRAM-SHA-512 users operator featurizer ledger serving verifier client cdc" in secured.init_output
    assert re.search(r"acls: \d+ rules \(\d+ bindings\) for prefix " + re.escape(secured.prefix), secured.init_output)
    admin = AdminClient(secured.admin_conf())
    every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                             AclPermissionType.ANY)
    have = admin.describe_acls(every, request_timeout=30).result()
    assert sorted(map(str, have)) == sorted(map(str, acl_bindings(secured.prefix)))  # no more, no less
    users = admin.describe_user_scram_credentials(request_timeout=30).result()
    assert set(users) == {"admin", *PRINCIPALS}  # admin's from format time (--add-scram), the rest from init
    for desc in (users[p] for p in PRINCIPALS):
        assert [(i.mechanism.name, i.iterations) for i in desc.scram_credential_infos] == [("SCRAM_SHA_512", 8192)]
    # idempotent: a second run (password rotation) changes nothing but the passwords
    again = run_init(secured.bootstrap, secured.prefix, secured.admin_password, secured.ca, secured.passwords)
    assert again.returncode == 0, again.stderr
    assert sorted(map(str, admin.describe_acls(every, request_timeout=30).result())) == sorted(map(str, have))


def test_waiting_for_bindings_names_what_is_missing(secured: Secured) -> None:
    """The read-back waits for the broker to serve the bindings, and past its timeout names what
    is still missing (here a prefix nobody granted)."""
    from unlearn.infra.kafka_init import InitError, wait_for_bindings

    admin = AdminClient(secured.admin_conf())
    wait_for_bindings(admin, secured.prefix, timeout=30.0)  # all there: returns
    with pytest.raises(InitError, match=r"\d+ ACLs missing 1s after creating them, e.g. .*t\.nobody\."):
        wait_for_bindings(admin, "t.nobody.", timeout=1.0)


def test_init_script_without_a_password_names_it(secured: Secured) -> None:
    passwords = {**secured.passwords, "ledger": ""}
    done = run_init(secured.bootstrap, secured.prefix, secured.admin_password, secured.ca, passwords)
    assert done.returncode != 0 and "UNLEARN_LEDGER_PASSWORD" in done.stderr


def test_kafka_init_names_every_missing_password(capsys: pytest.CaptureFixture[str]) -> None:
    """`unlearn kafka-init` run directly (not through init.sh) checks its environment first."""
    from unlearn.infra.kafka_init import kafka_init_main

    env = {"KAFKA_ADMIN_PASSWORD": "x", "UNLEARN_LEDGER_PASSWORD": "y"}
    assert kafka_init_main(["--bootstrap", "127.0.0.1:1"], env=env) == 2
    err = capsys.readouterr().err
    assert all(f"UNLEARN_{p.upper()}_PASSWORD" in err for p in PRINCIPALS if p != "ledger")
    assert "LEDGER" not in err and "KAFKA_ADMIN_PASSWORD" not in err


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--secure"], {"KAFKA_ADMIN_PASSWORD": "x"}, "--secure needs --engine kafka"),
    (["--engine", "kafka", "--secure"], {}, "--secure needs KAFKA_ADMIN_PASSWORD"),
    (["--engine", "kafka", "--tls-dir", "/x"], {"KAFKA_ADMIN_PASSWORD": "x"}, "--tls-dir needs --secure"),
])
def test_broker_secure_usage_errors(argv: list[str], env: dict[str, str], message: str,
                                    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from unlearn.services.cli import main

    monkeypatch.delenv("KAFKA_ADMIN_PASSWORD", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exc:
        main(["broker", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


# --------------------------------------------------------------------------- the pipeline, one principal each
def _served(port: int, version: int, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    got: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/heads/{HEAD}", timeout=10) as resp:
                got = json.loads(resp.read())
            if got.get("version", -1) >= version:
                return got
        except OSError as exc:
            got = {"error": str(exc)}
        time.sleep(0.5)
    raise AssertionError(f"serving never served version {version} of {HEAD}: {got}")


def _assert_never_refused(procs: list[Any]) -> None:
    """Each service exited cleanly and its log shows no refusal by the broker."""
    for p in procs:
        assert p.proc is not None and p.proc.returncode == 0, p.log_tail()
        log = p.log_path.read_text(errors="replace")
        assert not re.search(r"AUTHORIZATION_FAILED|not authorized|Authorization failed", log, re.I), \
            f"{p.name} was refused something the matrix should grant:\n{p.log_tail()}"


def test_pipeline_runs_with_each_service_as_its_own_principal(secured: Secured) -> None:
    from unlearn.features.contract import quantize_feature_row
    from unlearn.infra.local.tansu import free_port
    from unlearn.infra.processes import ServiceProcess
    from unlearn.ledger import ExactLedger
    from unlearn.services.client.head_reader import wait_for_head
    from unlearn.services.client.sdk import UnlearnClient
    from unlearn.services.erasure.report import erasure_report
    from unlearn.services.verifier import verify_head

    t0 = time.monotonic()
    worker = {"data_dir": str(secured.tmp / "data"), "checkpoint_every_seconds": 1.0, "reset_every_seconds": 1.0,
              "batch_max_ms": 20}
    port = free_port()
    as_ = secured.settings
    procs = [ServiceProcess("featurizer", ["featurizer"], as_("featurizer", **worker), secured.tmp).start(),
             ServiceProcess("ledger", ["ledger"], as_("ledger", **worker), secured.tmp).start(),
             ServiceProcess("serve", ["serve"], as_("serving", serve_port=port), secured.tmp).start()]
    client = secured.settings("client")
    F = np.random.default_rng(7).normal(size=(5, D))
    labels = [0, 1, 2, 1, 0]
    try:
        with UnlearnClient(client, client_id="secured-app") as sdk:
            adds = [sdk.add(HEAD, f"u{i % 2}", f"s{i}", labels[i], features=F[i]) for i in range(5)]
            for h in adds:
                h.wait_delivered(60)
            # every add applied before the delete: the subjects' requests are in different
            # partitions, so without this an add could be applied after the delete (a batch ends
            # at its last delete) and the receipt's retained hash would be that of fewer rows
            wait_for_head(client, HEAD, lambda u: u.n_retained == 5, timeout=120)
            receipt = sdk.delete(HEAD, "s1", "u1").wait_receipt(180)
        assert receipt.status == "applied" and receipt.sample_ids == ("s1",) and receipt.head_version is not None
        kept = [0, 2, 3, 4]
        ref = ExactLedger(D, HeadSettings.of(client).default_classes)
        ref.add(np.stack([quantize_feature_row(F[i], HeadSettings.of(client).frac_bits) for i in kept]),
                np.array([labels[i] for i in kept]))
        head = wait_for_head(client, HEAD, lambda u: u.mode == "exact" and u.version >= receipt.head_version,
                             timeout=120)  # `unlearn head`, as the client
        assert head.digest == ref.digest() and head.n_retained == 4
        assert head.retained_hash == receipt.retained_hash
        served = _served(port, head.version)  # serving, as serving
        assert served["version"] >= head.version
        cert = verify_head(secured.settings("verifier"), HEAD, orders=2, partitions=2)  # the verifier, as verifier
        assert cert["ok"], cert
        # `unlearn erasure-report` as verifier reads every store a subject's data can be in (a
        # refused read raises); u1 still has s3, so the report is complete but not clear
        t_report = time.monotonic()
        report = erasure_report(secured.settings("verifier", data_dir=worker["data_dir"]), HEAD, "u1", timeout=30)
        assert [c.store for c in report.checks][:6] == ["subject-keys", "transit-private", "deltas",
                                                        "featurizer-cache", "deadletter", "requests"]
        assert report.samples.keys() == {"s1", "s3"} and report.receipts[0]["status"] == "applied"
        wall, report_s = time.monotonic() - t0, time.monotonic() - t_report
    finally:
        for p in procs:
            p.stop()
    _assert_never_refused(procs)
    print(f"secured pipeline: add x5 -> delete -> receipt -> exact head -> served -> certified -> erasure report "
          f"in {wall:.1f}s (the report {report_s:.1f}s)")


# --------------------------------------------------------------------------- what the matrix refuses
def _produce_errors(settings: Settings, topics: list[str], timeout: float = 20.0) -> dict[str, str]:
    """Per topic, the first error a forger's plain producer (no idempotence: an idempotent one of a
    principal with no WRITE anywhere fails earlier, on InitProducerId) gets writing it as
    ``settings``' principal: its delivery report's, or a client-level one (authentication) for all."""
    from unlearn.runtime.clients import producer_config

    got: dict[str, str] = {}
    client_errors: list[str] = []
    p = Producer(producer_config(settings, **{"enable.idempotence": False, "message.timeout.ms": int(timeout * 1000),
                                              "error_cb": lambda err: client_errors.append(err.name())}))
    for topic in topics:
        p.produce(topic, key=b"k", value=b"forged", on_delivery=lambda err, msg, t=topic: got.setdefault(
            t, err.name() if err is not None else "DELIVERED"))
    deadline = time.monotonic() + timeout + 5
    while len(got) < len(topics) and not client_errors and time.monotonic() < deadline:
        p.poll(0.2)
    if client_errors:
        return dict.fromkeys(topics, client_errors[0])
    assert len(got) == len(topics), f"no delivery report within {timeout + 5:g} s for {set(topics) - set(got)}"
    return got


def _produce_error(settings: Settings, topic: str) -> str:
    return _produce_errors(settings, [topic])[topic]


def test_client_may_not_write_deltas(secured: Secured) -> None:
    assert _produce_error(secured.settings("client"), secured.prefix + "deltas") == "TOPIC_AUTHORIZATION_FAILED"


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_the_broker_refuses_every_write_the_matrix_does_not_grant(secured: Secured, principal: str) -> None:
    """Every project topic (and the ledger's state and head topics the pipeline created) that the
    matrix does not let ``principal`` write is refused by the broker: only the featurizer writes
    ``deltas``, only the ledger heads and state, only the operator the client registry..."""
    from unlearn.infra.acl_matrix import allows
    from unlearn.runtime.topics import TOPICS

    P = secured.prefix
    families = [family_topics(secured, f)[0] for f in (heads_family(P), state_family(P))]
    topics = [P + t for t in TOPICS] + families
    forbidden = [t for t in topics if not allows(principal, "WRITE", "topic", t, P)]
    assert forbidden  # every principal is refused somewhere
    got = _produce_errors(secured.settings(principal), forbidden)
    assert got == dict.fromkeys(forbidden, "TOPIC_AUTHORIZATION_FAILED")


def family_topics(secured: Secured, family: TopicFamily) -> list[str]:
    """The family's topics the ledger created in the pipeline test; run alone, one made here by
    the admin, with a record in it."""
    from confluent_kafka.admin import NewTopic

    admin = AdminClient(secured.admin_conf())
    topics = sorted(t for t in admin.list_topics(timeout=30).topics if family.parse(t) is not None)
    if not topics:
        topics = [family.topic(0, 0)]
        admin.create_topics([NewTopic(topics[0], 1, 1)])[topics[0]].result(30)
        p = Producer(secured.admin_conf())
        p.produce(topics[0], b"state")
        assert p.flush(30) == 0
    return topics


def test_client_may_not_read_the_ledger_state(secured: Secured) -> None:
    from unlearn.runtime.clients import consumer_config

    topics = family_topics(secured, state_family(secured.prefix))
    c = Consumer(consumer_config(secured.settings("client"), f"{secured.prefix}head-reader-{uuid.uuid4().hex[:6]}",
                                 **{"enable.auto.commit": False}))
    try:
        md = c.list_topics(topics[0], timeout=30)
        assert md.topics[topics[0]].error.name() == "TOPIC_AUTHORIZATION_FAILED"  # not even its partitions
        c.subscribe([topics[0]])  # a group it may use: the topic is what is refused
        deadline = time.monotonic() + 30
        error = None
        while error is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is not None, "the client read a ledger-state record"
            error = m.error().name()
    finally:
        c.close()
    assert error == "TOPIC_AUTHORIZATION_FAILED"


def test_client_may_not_change_acls_or_users(secured: Secured) -> None:
    from unlearn.runtime.clients import admin_config

    admin = AdminClient(admin_config(secured.settings("client")))
    grant_self = AclBinding(ResourceType.TOPIC, secured.prefix + "deltas", ResourcePatternType.LITERAL, "User:client",
                            "*", AclOperation.WRITE, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as exc:
        admin.create_acls([grant_self], request_timeout=30)[grant_self].result(30)
    assert _auth_error(exc.value) == "CLUSTER_AUTHORIZATION_FAILED"
    mine = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:client", None, AclOperation.ANY,
                            AclPermissionType.ANY)
    with pytest.raises(KafkaException) as exc:
        admin.delete_acls([mine], request_timeout=30)[mine].result(30)
    assert _auth_error(exc.value) == "CLUSTER_AUTHORIZATION_FAILED"
    upsert = UserScramCredentialUpsertion("client", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"x" * 12)
    with pytest.raises(KafkaException) as exc:
        admin.alter_user_scram_credentials([upsert], request_timeout=30)["client"].result(30)
    assert _auth_error(exc.value) == "CLUSTER_AUTHORIZATION_FAILED"
    # and the client's own rights are unchanged: it still cannot write deltas
    assert _produce_error(secured.settings("client"), secured.prefix + "deltas") == "TOPIC_AUTHORIZATION_FAILED"


def test_a_wrong_password_gets_nothing(secured: Secured) -> None:
    s = secured.settings("client", password="not-the-password")
    assert _produce_error(s, secured.prefix + "requests") == "_AUTHENTICATION"


# --------------------------------------------------------------------------- unlearn cdc, as cdc
def test_cdc_runs_as_its_own_principal(secured: Secured, postgres: Any) -> None:
    """`unlearn cdc` as `cdc` (Connect standalone gets the SASL_SSL config from the same properties
    file, in the Java client's names): a row inserted into a table becomes an add, the row deleted a
    delete with an applied receipt; the forwarded change records are trimmed, and the verifier's
    erasure report reads the change topic."""
    import psycopg

    from unlearn.infra.processes import ServiceProcess
    from unlearn.services.cdc.cli import change_topic
    from unlearn.services.client.head_reader import wait_for_head
    from unlearn.services.erasure.report import erasure_report

    def sql(query: str, *args: Any) -> None:
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute(query, args or None)

    tag = uuid.uuid4().hex[:8]
    table, head = f"public.sec_{tag}", f"cdc-sec-{tag}"
    sql(f"CREATE TABLE {table} (id text PRIMARY KEY, owner text NOT NULL, label int, feat real[])")
    sql(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    worker = {"data_dir": str(secured.tmp / f"cdc-data-{tag}"), "checkpoint_every_seconds": 1.0,
              "reset_every_seconds": 1.0, "batch_max_ms": 20}
    logs = secured.tmp / f"cdc-logs-{tag}"
    as_ = secured.settings
    procs = [ServiceProcess("featurizer", ["featurizer"], as_("featurizer", **worker), logs).start(),
             ServiceProcess("ledger", ["ledger"], as_("ledger", **worker), logs).start()]
    cdc = ServiceProcess("cdc", ["cdc", "--dsn", postgres.dsn, "--table", table, "--head", head, "--sample-id", "id",
                                 "--subject-id", "owner", "--label", "label", "--features", "feat"],
                         as_("cdc", trim_every_seconds=1.0, **worker), logs)
    procs.append(cdc)
    client, verifier = as_("client"), as_("verifier", data_dir=worker["data_dir"])
    try:
        cdc.start()
        cdc.wait_for_log("unlearn cdc ready", timeout=120)
        rng = np.random.default_rng(3)
        for i, owner in enumerate(("alice", "bob", "alice")):
            sql(f"INSERT INTO {table} VALUES (%s, %s, %s, %s)", f"r{i}", owner, i, rng.uniform(-1, 1, D).tolist())
        wait_for_head(client, head, lambda u: u.mode == "exact" and u.n_retained == 3, timeout=120)
        sql(f"DELETE FROM {table} WHERE id = 'r1'")
        wait_for_head(client, head, lambda u: u.mode == "exact" and u.n_retained == 2, timeout=120)
        deadline = time.monotonic() + 60
        while True:  # the delete's receipt, and the change topic trimmed of bob's row
            report = erasure_report(verifier, head, "bob", timeout=30)
            change = next(c for c in report.checks if c.store == "cdc change topics")
            if ([r["status"] for r in report.receipts] == ["applied"] and change.clear) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert [(r["status"], r["sample_ids"]) for r in report.receipts] == [("applied", ["r1"])], report.receipts
        assert change.clear and "1 change topics" in change.detail, change
        assert change_topic(as_("cdc"), table).startswith(secured.prefix + "cdc.")
    finally:
        for p in procs:
            p.stop()
    _assert_never_refused(procs)
    state = Path(worker["data_dir"]) / "cdc"
    connect_log = "".join(f.read_text(errors="replace") for f in state.rglob("connect.log"))
    assert "connect start" in connect_log
    assert not re.search(r"AUTHORIZATION_FAILED|not authorized|Authorization failed|Authentication failed",
                         connect_log, re.I), connect_log[-3000:]
    assert secured.passwords["cdc"] not in connect_log  # the JAAS line is never logged
    assert not list(state.rglob("*.properties"))  # the worker's and connector's config left no file


def test_cdc_may_not_write_deltas_or_read_what_it_does_not_own(secured: Secured) -> None:
    from unlearn.runtime.clients import consumer_config

    s = secured.settings("cdc")
    P = secured.prefix
    assert _produce_errors(s, [P + "deltas", P + "receipts"]) == dict.fromkeys([P + "deltas", P + "receipts"],
                                                                                "TOPIC_AUTHORIZATION_FAILED")
    c = Consumer(consumer_config(s, f"{P}cdc.probe-{uuid.uuid4().hex[:6]}"))  # its own group: the topic is refused
    try:
        md = c.list_topics(timeout=30)
        assert P + "deltas" not in md.topics and P + "requests" in md.topics  # it sees only what it may touch
        c.subscribe([P + "requests"])  # it writes requests, and may not read them back
        deadline = time.monotonic() + 30
        error = None
        while error is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is not None, "cdc read a request"
                error = m.error().name()
    finally:
        c.close()
    assert error == "TOPIC_AUTHORIZATION_FAILED"
