"""The client SDK and the add/delete/delete-subject CLI, against a real broker and (for receipts)
the real featurizer + ledger workers; plus an upstream app written from the JSON Schema alone."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from unlearn.infra.settings import HeadSettings, Settings
from unlearn.schemas import SCHEMA_DIR
from unlearn.schemas.head import HeadUpdate
from unlearn.schemas.receipts import Receipt, encode_receipt

D = 5


@pytest.fixture(scope="module")
def pipeline(broker_target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A featurizer and a ledger worker on their own topic prefix, shared by this module's tests
    (each test uses its own head ids). Worker logs are in the module's tmp dir."""
    from unlearn.infra.processes import ServiceProcess
    from unlearn.runtime.topics import create_topics, delete_topics, topic_names

    tmp = tmp_path_factory.mktemp("pipeline")
    s = Settings.from_env(bootstrap=broker_target.bootstrap, profile=broker_target.profile,
                          topic_prefix=f"t.client.{uuid.uuid4().hex[:8]}.", data_dir=str(tmp / "data"),
                          reset_every_seconds=1.0, checkpoint_every_seconds=1.0, batch_max_ms=20)
    create_topics(s)
    from tests.sealed_support import register

    register(s)
    procs = [ServiceProcess("featurizer", ["featurizer"], s, tmp).start(),
             ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp).start()]
    try:
        yield s
    finally:
        for p in procs:
            p.stop()
        with contextlib.suppress(Exception):
            delete_topics(s, topic_names(s).values())


def features(seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, D))


def exact_head_from(settings: Settings, head: str, version: int) -> HeadUpdate:
    """The head's first exact update at ``version`` or later: a receipt names the version that
    applied its delete; head updates are coalesced per poll, and only exact ones carry a digest."""
    from unlearn.services.client.head_reader import wait_for_head

    return wait_for_head(settings, head, lambda u: u.version >= version and u.mode == "exact", timeout=60)


# --------------------------------------------------------------------------- an app from the schema alone
def test_plain_producer_from_the_json_schema_gets_its_receipt(pipeline: Settings) -> None:
    """An upstream app that knows only schemas/request.v1.schema.json (no SDK): JSON envelopes by
    hand, keyed by subject id, a plain confluent-kafka producer; it reads its receipt itself."""
    import jsonschema

    from unlearn.features.contract import quantize_feature_row
    from unlearn.ledger import ExactLedger, MultisetHash

    s = pipeline
    request_schema = json.loads((SCHEMA_DIR / "request.v1.schema.json").read_text())
    receipt_schema = json.loads((SCHEMA_DIR / "receipt.v3.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(request_schema)
    F = features(1, 4)
    labels = [0, 1, 2, 1]
    envelopes = [
        {"schema": "unlearn.request/v1", "event_id": f"plain-add-{i}", "op": "add", "head_id": "plain",
         "client_id": "plain-app", "subject_id": "alice", "sample_id": f"a{i}", "label": labels[i],
         "input": {"kind": "features", "values": F[i].tolist()}, "ts": time.time()}
        for i in range(4)
    ]
    delete = {"schema": "unlearn.request/v1", "event_id": "plain-del-1", "op": "delete", "head_id": "plain",
              "client_id": "plain-app", "subject_id": "alice", "sample_id": "a1"}
    for env in [*envelopes, delete]:
        validator.validate(env)
    p = Producer({"bootstrap.servers": s.bootstrap, "enable.idempotence": True, "acks": "all"})
    for env in [*envelopes, delete]:
        p.produce(s.topic("requests"), key=env["subject_id"].encode(), value=json.dumps(env).encode())
    assert p.flush(30) == 0

    c = Consumer({"bootstrap.servers": s.bootstrap, "group.id": f"plain-{uuid.uuid4().hex}",
                  "enable.auto.commit": False})
    md = c.list_topics(timeout=10)
    topic = s.topic("receipts")
    c.assign([TopicPartition(topic, q, OFFSET_BEGINNING) for q in md.topics[topic].partitions])
    receipt = None
    deadline = time.monotonic() + 120
    try:
        while receipt is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            r = json.loads(m.value())
            if r["event_id"] == "plain-del-1":
                receipt = r
    finally:
        c.close()
    assert receipt is not None, "no receipt within 120 s"
    jsonschema.Draft202012Validator(receipt_schema).validate(receipt)
    assert receipt["status"] == "applied" and receipt["sample_ids"] == ["a1"] and receipt["subject_id"] == "alice"
    # the receipt's retained-rows hash, and the exact head's digest at that version, are those of
    # what is retained: anyone can recompute them
    Q = np.stack([quantize_feature_row(F[i], HeadSettings.of(s).frac_bits) for i in (0, 2, 3)])
    y = np.array([labels[i] for i in (0, 2, 3)])
    ref = ExactLedger(D, HeadSettings.of(s).default_classes)  # columns: the auto contract's class count
    ref.add(Q, y)
    assert "digest" not in receipt and receipt["retained_hash"] == MultisetHash.of_rows(Q, y).fingerprint()
    head = exact_head_from(s, "plain", receipt["head_version"])
    assert head.version == receipt["head_version"]  # nothing came after the delete
    assert head.digest == ref.digest() and head.retained_hash == receipt["retained_hash"]


# --------------------------------------------------------------------------- the SDK
def test_sdk_adds_deletes_and_waits_for_receipts(pipeline: Settings) -> None:
    from unlearn.services.client.errors import ClientError
    from unlearn.services.client.sdk import UnlearnClient

    s = pipeline
    F = features(2, 6)
    with UnlearnClient(s, client_id="sdk-test") as client:
        adds = [client.add("sdk", f"u{i % 2}", f"x{i}", i % 3, features=F[i]) for i in range(6)]
        for h in adds:
            h.wait_delivered(30)
            assert h.delivered and h.op == "add" and h.partition is not None
        with pytest.raises(ClientError, match="only delete and delete_subject get receipts"):
            adds[0].wait_receipt(1)
        d1 = client.delete("sdk", "x0", "u0")
        ds = client.delete_subject("sdk", "u1")
        ghost = client.delete("sdk", "never-added", "u0")
        r1 = d1.wait_receipt(120)
        rs = ds.wait_receipt(60)
        rg = ghost.wait_receipt(60)
    assert isinstance(r1, Receipt) and r1.event_id == d1.event_id
    assert r1.status == "applied" and r1.sample_ids == ("x0",) and r1.head_id == "sdk"
    assert rs.status == "applied" and sorted(rs.sample_ids) == ["x1", "x3", "x5"] and rs.subject_id == "u1"
    # a delete of a sample never added removes nothing and says so; nothing of it can enter later
    assert rg.status == "tombstoned" and rg.reason is None and rg.head_version is None and not rg.removed
    assert rg.sample_ids == ("never-added",) and rg.tombstone_ts is not None and rg.tombstone_expires is not None
    assert r1.digest is None and rs.digest is None  # exact head updates carry the digest
    last = max(r1, rs, key=lambda r: r.head_version or 0)
    head = exact_head_from(s, "sdk", last.head_version or 0)
    assert head.version == last.head_version and head.retained_hash == last.retained_hash is not None


def test_routing_by_head_skips_the_router_and_still_gets_receipts(pipeline: Settings) -> None:
    """UNLEARN_ROUTE_BY_HEAD (issue 29): requests land in the head's by-head partition, never in
    ``requests``, and the featurizer judges them as routed ones: the delete is applied."""
    from unlearn.common.by_head import head_partition, routed_topic_name
    from unlearn.services.client.sdk import UnlearnClient

    s = pipeline.with_(route_by_head=True)
    F = features(3, 3)
    with UnlearnClient(s, client_id="sdk-direct") as client:
        adds = [client.add("direct", "u0", f"x{i}", i % 3, features=F[i]) for i in range(3)]
        for h in adds:
            h.wait_delivered(30)
        assert client._target("direct") == {"topic": routed_topic_name(s.topic("requests")),
                                            "partition": head_partition("direct", s.partitions)}
        assert {h.partition for h in adds} == {head_partition("direct", s.partitions)}
        r = client.delete("direct", "x1", "u0").wait_receipt(120)
    assert r.status == "applied" and r.sample_ids == ("x1",) and r.head_id == "direct"


def test_routing_by_head_without_the_by_head_topic_is_a_client_error(settings: Settings) -> None:
    from unlearn.services.client.errors import ClientError
    from unlearn.services.client.sdk import UnlearnClient

    s = settings.with_(route_by_head=True, transit_seal="off", topic_prefix=settings.topic_prefix + "nothing.")
    with UnlearnClient(s, client_id="sdk-direct") as client, pytest.raises(ClientError, match="by-head"):
        client.add("direct", "u0", "x0", 0, features=[0.5] * D)


def test_binary_features_give_the_rows_and_digest_of_json_features(pipeline: Settings) -> None:
    """The same vectors through the real pipeline as JSON numbers, as features_bin '<f8' (the
    client's default here) and '<f4' (per call): '<f8' gives the featurizer's rows and the
    ledger's digest of JSON numbers bit for bit; '<f4' those of the float32-rounded vectors."""
    from tests.sealed_support import plain_delta
    from unlearn.features.contract import quantize_feature_row
    from unlearn.ledger import ExactLedger
    from unlearn.runtime.topic_reader import keys_in, read_topic
    from unlearn.schemas.delta_codec import RowsEntry
    from unlearn.services.client.head_reader import wait_for_head
    from unlearn.services.client.sdk import UnlearnClient

    s = pipeline
    F = np.random.default_rng(9).normal(size=(5, 768))
    labels = [0, 1, 2, 1, 0]
    heads = {"enc-json": "json", "enc-f64": None, "enc-f32": "f32"}  # None: the client's encoding
    with pytest.raises(ValueError, match="features_encoding"):
        UnlearnClient(s, features_encoding="f16")  # type: ignore[arg-type]
    rows: dict[str, dict[str, np.ndarray]] = {head: {} for head in heads}

    def read_added_rows() -> bool:
        for r in read_topic(s, s.topic("deltas"), keep=keys_in(heads), timeout=30):
            assert r.value is not None
            delta = plain_delta(r.value, r.topic)
            for e in delta.entries:
                assert isinstance(e, RowsEntry)
                if e.sign > 0:
                    rows[delta.head_id].update(zip(e.sample_ids, e.q, strict=True))
        return all(len(rows[head]) == 5 for head in heads)

    with UnlearnClient(s, client_id="enc-test", features_encoding="f64") as client:
        for head, enc in heads.items():
            for i in range(5):
                client.add(head, "u", f"x{i}", labels[i], features=F[i], features_encoding=enc)  # type: ignore[arg-type]
        # The rows are read before x1 is deleted: once it is, its key may be destroyed (crypto-
        # shredding) before this test reads the topic, and x1's rows are then unreadable by design.
        deadline = time.monotonic() + 60
        while not read_added_rows() and time.monotonic() < deadline:
            time.sleep(0.5)
        deletes = {head: client.delete(head, "x1", "u") for head in heads}
        receipts = {head: h.wait_receipt(120) for head, h in deletes.items()}
    for head in heads:
        assert sorted(rows[head]) == [f"x{i}" for i in range(5)]
        assert receipts[head].status == "applied"
    heads = HeadSettings.of(s)
    for i in range(5):
        np.testing.assert_array_equal(rows["enc-f64"][f"x{i}"], rows["enc-json"][f"x{i}"])
        np.testing.assert_array_equal(rows["enc-json"][f"x{i}"], quantize_feature_row(F[i], heads.frac_bits))
        np.testing.assert_array_equal(rows["enc-f32"][f"x{i}"],
                                      quantize_feature_row(F[i].astype(np.float32), heads.frac_bits))
    # the ledger: the same retained-rows hash on the receipts, the same digest on the exact heads
    assert receipts["enc-json"].retained_hash == receipts["enc-f64"].retained_hash != receipts["enc-f32"].retained_hash
    kept = [0, 2, 3, 4]
    for head, X in (("enc-json", F), ("enc-f64", F), ("enc-f32", F.astype(np.float32))):
        ref = ExactLedger(768, heads.default_classes)
        ref.add(np.stack([quantize_feature_row(X[i], heads.frac_bits) for i in kept]),
                np.array([labels[i] for i in kept]))
        wait_for_head(s, head, lambda u, ref=ref: u.mode == "exact" and u.digest == ref.digest(), timeout=60)


def test_a_receipt_right_after_the_request_is_never_missed(settings: Settings) -> None:
    """The listener fixes its offsets before the request is produced: a pipeline answering
    instantly (here: the test itself, right after the request is acknowledged) is still seen."""
    from unlearn.runtime.clients import producer_config
    from unlearn.services.client.sdk import UnlearnClient

    p = Producer(producer_config(settings, **{"linger.ms": 0}))
    # old receipts of other events already on the topic are skipped
    p.produce(settings.topic("receipts"), key=b"s", value=encode_receipt(
        Receipt.rejected("someone-else", "s", "h", ["z"], "unknown_sample", time.time())))
    p.flush(10)
    with UnlearnClient(settings) as client:
        handles = []
        for i in range(20):
            h = client.delete("h", f"x{i}", f"s{i}")
            h.wait_delivered(10)
            p.produce(settings.topic("receipts"), key=f"s{i}".encode(), value=encode_receipt(
                Receipt.applied(h.event_id, f"s{i}", "h", [f"x{i}"], i + 1, f"{i:064x}", time.time())))
            p.poll(0)
            handles.append(h)
        assert p.flush(10) == 0
        got = [h.wait_receipt(20) for h in handles]
    assert [r.head_version for r in got] == list(range(1, 21))
    assert [r.event_id for r in got] == [h.event_id for h in handles]


def test_wait_receipt_timeout_names_the_event_and_head(settings: Settings, capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    from unlearn.services.client.cli import delete_main
    from unlearn.services.client.errors import ReceiptTimeout
    from unlearn.services.client.sdk import UnlearnClient

    with UnlearnClient(settings) as client:
        h = client.delete("lonely-head", "x", "s")
        with pytest.raises(ReceiptTimeout) as exc:
            h.wait_receipt(1.0)
    assert isinstance(exc.value, TimeoutError)
    assert h.event_id in str(exc.value) and "lonely-head" in str(exc.value)
    assert exc.value.event_id == h.event_id and exc.value.head_id == "lonely-head"
    code = delete_main(["--bootstrap", settings.bootstrap, "--prefix", settings.topic_prefix, "--head", "lonely-head",
                        "--subject", "s", "--sample", "y", "--event-id", "ev-timeout", "--wait", "--timeout", "1"])
    err = capsys.readouterr().err
    assert code == 1 and "timed out" in err and "ev-timeout" in err and "lonely-head" in err


# --------------------------------------------------------------------------- the CLI
def test_cli_files_arguments_and_wait(pipeline: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from unlearn.services.client.cli import add_main, delete_main, delete_subject_main

    s = pipeline
    common = ["--bootstrap", s.bootstrap, "--prefix", s.topic_prefix]
    F = features(3, 5)
    lines = [json.dumps({"subject_id": f"c{i % 2}", "sample_id": f"f{i}", "label": i % 2,
                         "features": F[i].tolist()}) for i in range(4)]
    lines.insert(2, "# comments and blank lines are skipped")
    lines.insert(3, "")
    adds = tmp_path / "adds.jsonl"
    adds.write_text("\n".join(lines) + "\n")
    assert add_main([*common, "--head", "cli", "--file", str(adds), "--client-id", "cli-test"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["sample_id"] for o in out] == ["f0", "f1", "f2", "f3"] and all(o["offset"] is not None for o in out)
    # one request from arguments
    assert add_main([*common, "--head", "cli", "--subject", "c9", "--sample", "f9", "--label", "1",
                     "--features", ",".join(map(str, F[4]))]) == 0
    capsys.readouterr()

    # a bad line: nothing is produced, the error names the line
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"sample_id": "f0", "subject_id": "c0"}) + "\n"
                   + json.dumps({"sample_id": 3, "subject_id": "c0"}) + "\n")
    assert delete_main([*common, "--head", "cli", "--file", str(bad), "--wait"]) == 1
    assert f"{bad}:2: bad_field:sample_id" in capsys.readouterr().err

    dels = tmp_path / "dels.jsonl"
    dels.write_text(json.dumps({"subject_id": "c0", "sample_id": "f0", "event_id": "cli-del-0"}) + "\n"
                    + json.dumps({"subject_id": "c9", "sample_id": "f9", "event_id": "cli-del-9"}) + "\n")
    assert delete_main([*common, "--head", "cli", "--file", str(dels), "--wait", "--timeout", "120"]) == 0
    receipts = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["event_id"], r["status"], r["sample_ids"]) for r in receipts] == [
        ("cli-del-0", "applied", ["f0"]), ("cli-del-9", "applied", ["f9"])]
    assert delete_subject_main([*common, "--head", "cli", "--subject", "c1", "--wait", "--timeout", "60"]) == 0
    (r,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert r["status"] == "applied" and sorted(r["sample_ids"]) == ["f1", "f3"]
    # a delete of what is no longer there removes nothing, says so and succeeds (its tombstone
    # keeps older adds of f0 out)
    assert delete_main([*common, "--head", "cli", "--subject", "c0", "--sample", "f0", "--wait",
                        "--timeout", "60"]) == 0
    captured = capsys.readouterr()
    tomb = json.loads(captured.out)
    assert (tomb["status"], tomb["schema"]) == ("tombstoned", "unlearn.receipt/v3") and "tombstone_ts" in tomb
    assert "removed nothing" in captured.err
    # a rejected delete (f2 is c0's): the receipt is printed and the exit code says so
    assert delete_main([*common, "--head", "cli", "--subject", "c1", "--sample", "f2", "--wait",
                        "--timeout", "60"]) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out)["reason"] == "subject_mismatch" and "rejected" in captured.err


def test_cli_argument_errors(settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from unlearn.services.client.cli import add_main, load_requests

    common = ["--bootstrap", settings.bootstrap, "--prefix", settings.topic_prefix]
    assert add_main([*common, "--head", "h", "--subject", "s", "--sample", "x", "--label", "1"]) == 1
    assert "missing_field:input" in capsys.readouterr().err
    assert add_main([*common, "--head", "h", "--subject", "s", "--sample", "x", "--label", "[0.5, 1]",
                     "--features", "nan,1"]) == 1
    assert "non_finite_feature" in capsys.readouterr().err
    assert add_main([*common, "--file", str(tmp_path / "missing.jsonl")]) == 1
    reqs = load_requests(['{"head_id": "h", "subject_id": "s", "sample_id": "x", "label": 2, "text": "hi"}',
                          '{"schema": "unlearn.request/v1", "event_id": "e", "op": "add", "head_id": "h", '
                          '"client_id": "c", "subject_id": "s", "sample_id": "y", "label": [1.5], '
                          '"input": {"kind": "features", "values": [1]}}'], "add", {"client_id": "cli"})
    assert [r.input.kind for r in reqs] == ["text", "features"] and reqs[0].client_id == "cli"
    assert reqs[1].event_id == "e" and reqs[1].label == (1.5,)


# --------------------------------------------------------------------------- the receipt listener
def test_listener_without_its_topic_is_a_client_error(settings: Settings) -> None:
    from unlearn.services.client.errors import ClientError
    from unlearn.services.client.receipt_listener import ReceiptListener

    missing = settings.with_(topic_prefix=settings.topic_prefix + "nothing-here.")
    listener = ReceiptListener(missing)
    with pytest.raises(ClientError, match=r"does not exist.*unlearn topics create"):
        listener.start(timeout=2.0)
    assert not listener.running


def test_a_dead_listener_fails_its_waiters(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reading thread dying is reported to every waiter (not a silent timeout)."""
    from unlearn.runtime.clients import producer_config
    from unlearn.services.client import receipt_listener
    from unlearn.services.client.errors import ClientError

    def broken(_value: bytes) -> Receipt:
        raise RuntimeError("decoder exploded")

    monkeypatch.setattr(receipt_listener, "decode_receipt", broken)
    listener = receipt_listener.ReceiptListener(settings).start()
    try:
        listener.register("ev-1")
        p = Producer(producer_config(settings))
        p.produce(settings.topic("receipts"), key=b"s", value=b"{}")
        assert p.flush(10) == 0
        with pytest.raises(ClientError, match="decoder exploded"):
            listener.wait("ev-1", 30)
        with pytest.raises(ClientError, match="not registered"):
            listener.wait("ev-unknown", 1)
    finally:
        listener.close()


def test_the_sdk_is_importable_from_the_package() -> None:
    import unlearn.services.client as client_pkg
    from unlearn.services.client import UnlearnClient, sdk

    assert UnlearnClient is sdk.UnlearnClient
    assert set(sdk.__all__) <= set(client_pkg.__all__)
    assert all(getattr(client_pkg, name) is not None for name in client_pkg.__all__)
    with pytest.raises(AttributeError):
        _ = client_pkg.NoSuchThing  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- trace context (issue 32)
def _records_with_headers(s: Settings, topic: str) -> list[tuple[bytes | None, dict[str, bytes]]]:
    """(key, headers) of every record now on ``topic`` (all partitions, from the beginning)."""
    from unlearn.runtime.clients import consumer_config

    c = Consumer(consumer_config(s, f"t-{uuid.uuid4().hex}", **{"enable.partition.eof": True,
                                                                "enable.auto.commit": False}))
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[tuple[bytes | None, dict[str, bytes]]] = []
        eof: set[int] = set()
        deadline = time.monotonic() + 30
        while len(eof) < len(parts) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                eof.add(m.partition())
                continue
            out.append((m.key(), {k: bytes(v) for k, v in (m.headers() or ()) if v is not None}))
        return out
    finally:
        c.close()


def test_a_delete_traceparent_reaches_its_deltas_receipt_and_head_update(pipeline: Settings) -> None:
    """The SDK sends a delete with a traceparent; its trace id is on the delta, the receipt and the
    head update it produced (Kafka headers, read back from the broker), and an invalid traceparent
    on an add is ignored: the add is applied, never dead-lettered."""
    from unlearn.infra import tracing
    from unlearn.services.client.sdk import UnlearnClient

    s = pipeline
    trace_id = uuid.uuid4().hex
    tp = f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"
    F = features(7, 2)
    with UnlearnClient(s, client_id="trace-test") as client:
        adds = [client.add("trace", "tu", "t0", 1, features=F[0], traceparent=b"00-not-a-trace"),
                client.add("trace", "tu", "t1", 0, features=F[1])]
        for h in adds:
            h.wait_delivered(30)
        assert adds[1].traceparent is not None and tracing.parse(adds[1].traceparent) is not None  # the SDK sets one
        d = client.delete("trace", "t0", "tu", traceparent=tp)
        r = d.wait_receipt(120)
    assert r.status == "applied" and r.sample_ids == ("t0",)  # the invalid traceparent broke nothing

    def trace_ids(records: list[tuple[bytes | None, dict[str, bytes]]]) -> set[str]:
        return {p[0] for _, h in records if (p := tracing.parse(h.get(tracing.TRACEPARENT))) is not None}

    deltas = [x for x in _records_with_headers(s, s.topic("deltas")) if x[0] == b"trace"]
    assert trace_id in trace_ids(deltas)
    named = [tracing.events_of(list(h.items())) for _, h in deltas]
    assert any(ev.get(d.event_id) == tp.encode() for ev in named)  # the delete's own context, named
    receipts = [x for x in _records_with_headers(s, s.topic("receipts")) if x[0] == b"tu"]
    assert trace_id in trace_ids(receipts)
    exact_head_from(s, "trace", r.head_version or 0)
    from confluent_kafka.admin import AdminClient

    from unlearn.runtime.clients import admin_config

    topics = AdminClient(admin_config(s)).list_topics(timeout=10).topics
    heads = [x for t in topics if t.startswith(s.topic_prefix) and "heads" in t
             for x in _records_with_headers(s, t) if x[0] == b"trace"]
    assert trace_id in trace_ids(heads)
    reasons = [x for x in _records_with_headers(s, s.topic("deadletter"))]
    assert not any(tracing.TRACEPARENT in h and b"not-a-trace" in h[tracing.TRACEPARENT] for _, h in reasons)
