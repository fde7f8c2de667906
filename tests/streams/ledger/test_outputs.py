"""What the ledger worker produces (streams/ledger/outputs.py).

A head update says what its own data holds: which classes hold retained samples (from the
ledger's exact per-class counts, fast updates included) and what ``drift`` means (0.0 on an exact
update; the fast path's measured error on a fast one, never the 1.0 of a rebuilt head).

Dead letters of refused deltas against a real broker (docs/erasure.md section 10,
``schemas/redaction.redact_delta``): with ``UNLEARN_DEADLETTER_INPUTS=redact`` (the default) a
refused plaintext delta, corrupt or well-formed (wrong message key, unknown head, another
dimension), leaves a dead letter with its reason, ids and source offset but none of its row or
label values, and the worker keeps applying the next deltas; with ``keep`` the bytes stay as sent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer

from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.ledger import Quantizer, l2_normalize
from unlearn.runtime.clients import producer_config
from unlearn.runtime.topic_reader import read_topic
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.delta_codec import Delta, RowsEntry, encode_delta
from unlearn.schemas.head import HeadUpdate, decode_head, encode_head
from unlearn.schemas.redaction import is_redacted
from unlearn.services.client.head_reader import wait_for_head
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime
from unlearn.streams.ledger.outputs import PollOutputs, head_update

D = 8


CFG = HeadConfig(gamma=1.0, reset_every=1000, drift_threshold=1.0)  # no drift-triggered resets


def entry(sign: int, tag: str, labels: list[int] | np.ndarray, seed: int) -> RowsEntry:
    Q = Quantizer().quantize(l2_normalize(np.random.default_rng(seed).normal(size=(len(labels), D))))
    ids = [f"{tag}{i}" for i in range(len(labels))]
    return RowsEntry(sign, [f"e-{i}" for i in ids], ids, ["u"] * len(ids), np.asarray(labels, np.int64), Q)


def neg(e: RowsEntry) -> RowsEntry:
    return RowsEntry(-1, e.event_ids, e.sample_ids, e.subject_ids, e.labels, e.q)


def delta(src: int, *entries: RowsEntry, classes: int = 10) -> Delta:
    return Delta("h", f"requests/0@{src}", D, 30, 0, tuple(entries), classes, 1)


def update(rt: HeadRuntime) -> HeadUpdate:
    """The update the worker publishes for ``rt`` (with its posterior, the default), through the codec."""
    return decode_head(encode_head(head_update(rt, posterior=True)))


def test_retained_classes_follow_the_exact_counts_through_deletes_fast_and_exact() -> None:
    a = entry(+1, "a", [0, 1, 2, 2], seed=1)
    rt = HeadRuntime.new("h", delta(1, a), CFG)
    rt.apply(delta(1, a), 0, 0)
    rt.sync()  # 4 rows >= d/2: rebuilt, exact
    u = update(rt)
    assert u.mode == "exact" and u.c == 10
    assert np.flatnonzero(u.retained_classes).tolist() == [0, 1, 2]
    gone = RowsEntry(-1, a.event_ids[2:], a.sample_ids[2:], a.subject_ids[2:], a.labels[2:], a.q[2:])
    rt.apply(delta(2, gone), 1, 0)  # every sample of class 2 deleted
    rt.sync()  # 2 rows < d/2: tracked, fast
    u = update(rt)
    assert u.mode == "fast" and np.flatnonzero(u.retained_classes).tolist() == [0, 1]
    rt.apply(delta(3, neg(RowsEntry(1, a.event_ids[:2], a.sample_ids[:2], a.subject_ids[:2], a.labels[:2],
                                    a.q[:2]))), 2, 0)
    rt.sync()
    u = update(rt)
    assert u.n_retained == 0 and u.retained_classes is not None and not u.retained_classes.any()


def test_a_poll_publishes_the_heads_with_deletes_first() -> None:
    """Adds to a, then to b and c, then a delete in c: c is brought up and published first (its
    receipt waits for no other head), then a and b in the order first touched."""
    Q = Quantizer().quantize(l2_normalize(np.random.default_rng(5).normal(size=(4, D))))
    y = np.array([0, 1, 0, 1])
    poll = PollOutputs()
    heads = {}
    for offset, (h, entries) in enumerate([
            ("a", (RowsEntry(+1, ["ea"], ["sa"], ["u"], y[:1], Q[:1]),)),
            ("b", (RowsEntry(+1, ["eb"], ["sb"], ["u"], y[1:2], Q[1:2]),)),
            ("c", (RowsEntry(+1, ["ec", "ed"], ["sc", "sd"], ["u", "v"], y[2:], Q[2:]),)),
            ("c", (RowsEntry(-1, ["del"], ["sd"], ["v"], y[3:], Q[3:]),))]):
        delta = Delta(h, f"requests/0@{offset}", D, 30, 0, entries)
        heads[h] = heads.get(h) or HeadRuntime.new(h, delta, CFG)
        poll.add(0, heads[h], heads[h].apply(delta, offset=offset, partition=0))
    assert [h for h, _ in poll.publish_order()] == ["c", "a", "b"]
    assert [d.event_id for o in poll.outcomes["c"] for d in o.deletes] == ["del"]


def test_a_head_of_target_vectors_marks_no_classes() -> None:
    Q = entry(+1, "v", [0, 0], seed=2).q
    vec = RowsEntry(1, ["e1", "e2"], ["v1", "v2"], ["u", "u"], np.array([[3, -1, 0], [0, 2, 5]], np.int64), Q)
    rt = HeadRuntime.new("h", Delta("h", "requests/0@1", D, 30, 0, (vec,)), CFG)
    rt.apply(Delta("h", "requests/0@1", D, 30, 0, (vec,)), 0, 0)
    rt.sync()
    assert rt.retained_classes() is None and update(rt).retained_classes is None


def test_drift_is_zero_on_exact_updates_and_measured_only_on_a_tracked_fast_head() -> None:
    first = entry(+1, "a", list(range(10)) * 2, seed=3)  # 20 rows >= d/2: rebuilt, not tracked
    rt = HeadRuntime.new("h", delta(1, first), CFG)
    rt.apply(delta(1, first), 0, 0)
    rt.sync()
    # the rebuild replaced an all-zero head that never took a row: the old code published drift 1.0
    assert rt.mode == "exact" and rt.fast_drift == 0.0 and update(rt).drift == 0.0
    for i in range(3):  # small updates: the fast head tracks them
        e = entry(+1, f"b{i}", [i], seed=10 + i)
        rt.apply(delta(2 + i, e), 1 + i, 0)
        rt.sync()
    assert rt.mode == "fast"
    rt.reset("timer")  # replaces a fast head that had taken every row: measured
    measured = rt.fast_drift
    assert 0.0 < measured < 1e-9
    assert update(rt).drift == 0.0  # exact: the canonical solve itself
    e = entry(+1, "c", [4], seed=20)
    rt.apply(delta(9, e), 9, 0)
    rt.sync()
    assert rt.mode == "fast" and update(rt).drift == measured
    big = entry(+1, "d", list(range(10)), seed=21)
    rt.apply(delta(10, big), 10, 0)
    rt.sync()  # rebuilt (coalesced rows): the stale fast head is not measured
    assert rt.mode == "exact" and rt.fast_drift == measured
    again = HeadRuntime.from_snapshot(rt.state(), CFG)  # snapshots keep it
    assert again.fast_drift == measured


SECRET = np.array([[987654301, -987654302, 987654303], [987654304, 987654305, -987654306]], dtype=np.int64)


def _delta(head: str, sign: int, q: np.ndarray, tag: str) -> bytes:
    n = q.shape[0]
    return encode_delta(Delta(head, "test", q.shape[1], 30, 0, (RowsEntry(
        sign, [f"{tag}-e{i}" for i in range(n)], [f"{tag}-x{i}" for i in range(n)], ["victim"] * n,
        np.arange(n), q),)))


def _values() -> list[bytes]:
    """SECRET's values as int64 bytes and as decimal text."""
    return [v for x in SECRET.ravel() for v in (np.int64(x).astype("<i8").tobytes(), str(int(x)).encode())]


@pytest.mark.broker
@pytest.mark.parametrize("mode", ["redact", "keep"])
def test_a_refused_plaintext_delta_is_dead_lettered_redacted_and_the_ledger_goes_on(
        settings: Settings, tmp_path: Path, mode: str) -> None:
    s = settings.with_(data_dir=str(tmp_path / "data"), deadletter_inputs=mode)
    ok = np.array([[1 << 20, 3, -5], [7, 1 << 19, 11]], dtype=np.int64)
    good = _delta("ok", 1, ok, "ok1")
    corrupt = bytearray(_delta("victim", 1, SECRET, "bad"))
    corrupt[-1] ^= 0xFF  # checksum mismatch: undecodable, its rows still inside
    refused = {
        "corrupt": ("victim", bytes(corrupt)),  # bad_delta
        "key": ("not-victim", _delta("victim", 1, SECRET, "key")),  # bad_delta: keyed by another head
        "ghost": ("ghost", _delta("ghost", -1, SECRET, "ghost")),  # unknown_head: a delete first
        "dim": ("ok", _delta("ok", 1, SECRET[:, :2], "dim")),  # dimension_mismatch
    }
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path).start()
    try:
        p = Producer(producer_config(s))
        p.produce(s.topic("deltas"), key=b"ok", value=good)
        assert p.flush(30) == 0
        wait_for_head(s, "ok", lambda u: u.version >= 1, timeout=60)
        for key, value in refused.values():
            p.produce(s.topic("deltas"), key=key.encode(), value=value)
        p.produce(s.topic("deltas"), key=b"ok", value=_delta("ok", 1, ok, "ok2"))
        assert p.flush(30) == 0
        head = wait_for_head(s, "ok", lambda u: u.version >= 2 and u.mode == "exact", timeout=60)
        assert head.n_retained == 4  # the refusals did not stop it, nor reach the head
        assert worker.alive
    finally:
        assert worker.stop() == 0
    sent = {(r.partition, r.offset): r.value for r in read_topic(s, s.topic("deltas"))}
    records = read_topic(s, s.topic("deadletter"))
    letters = [decode_deadletter(r.value or b"") for r in records]
    assert sorted(d.reason for d in letters) == ["bad_delta", "bad_delta", "dimension_mismatch", "unknown_head"]
    by_value = {v: name for name, (_, v) in refused.items()}
    for d in letters:
        assert d.stage == "ledger" and d.topic == s.topic("deltas") and d.detail
        assert d.partition is not None and d.offset is not None
        original = sent[(d.partition, d.offset)]  # the dead letter finds its message in deltas
        assert original in by_value
        if mode == "keep":
            assert d.original == original
            continue
        assert is_redacted(d.original)
        summary = json.loads(d.original)
        assert summary["bytes"] == len(original or b"")
        if by_value[original] != "corrupt":  # decodable: the ids stay
            assert summary["entries"][0]["subject_ids"] == ["victim", "victim"]
            assert summary["entries"][0]["event_ids"][0].startswith(by_value[original])
    if mode == "redact":  # nowhere in the topic's records, nor in their decoded originals
        blob = b"".join([r.value or b"" for r in records] + [d.original for d in letters])
        for v in _values():
            assert v not in blob
    else:
        assert any(_values()[0] in d.original for d in letters)
