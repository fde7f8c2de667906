"""The ledger's dead letters of refused deltas against a real broker (docs/erasure.md section 10,
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
from unlearn.infra.settings import Settings, producer_config
from unlearn.infra.topic_reader import read_topic
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.delta_codec import Delta, RowsEntry, encode_delta
from unlearn.schemas.redaction import is_redacted
from unlearn.services.client.head_reader import wait_for_head

pytestmark = pytest.mark.broker

SECRET = np.array([[987654301, -987654302, 987654303], [987654304, 987654305, -987654306]], dtype=np.int64)


def _delta(head: str, sign: int, q: np.ndarray, tag: str) -> bytes:
    n = q.shape[0]
    return encode_delta(Delta(head, "test", q.shape[1], 30, 0, (RowsEntry(
        sign, [f"{tag}-e{i}" for i in range(n)], [f"{tag}-x{i}" for i in range(n)], ["victim"] * n,
        np.arange(n), q),)))


def _values() -> list[bytes]:
    """SECRET's values as int64 bytes and as decimal text."""
    return [v for x in SECRET.ravel() for v in (np.int64(x).astype("<i8").tobytes(), str(int(x)).encode())]


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
