"""Shredding sample keys (streams/featurizer/erasure.py, docs/erasure.md section 4): a pending
shred counts only ledger floors whose read was asked after it started. No broker: reads are fakes
gated by events."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from tests.probe_support import WAIT, Closable
from unlearn.infra.settings import Settings
from unlearn.runtime.probes import Probes
from unlearn.streams.featurizer import erasure
from unlearn.streams.featurizer.erasure import FLOORS, Erasure, _Pending


class FakeKeys:
    """The parts of KeyStore the sample-key shred path uses."""

    def __init__(self) -> None:
        self.gens = {0: SimpleNamespace(keys={}), 1: SimpleNamespace(keys={})}
        self.destroyed: list[tuple[int, list[Any]]] = []

    def retire_due(self) -> None:
        pass

    def destroy(self, partition: int, refs: list[Any]) -> int:
        self.destroyed.append((partition, sorted(refs)))
        return len(refs)


def test_floors_asked_before_a_shred_started_do_not_destroy_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pending shred counts only floors whose read was asked after it started, even when those
    floors are past its offset."""
    gate = threading.Event()
    reads = [0]

    def floors(settings: Settings, consumer: Any) -> dict[int, int]:
        reads[0] += 1
        gate.wait(WAIT)
        return {0: 100}

    monkeypatch.setattr(erasure, "ledger_floors", floors)
    s = Settings.from_env(bootstrap="127.0.0.1:9", shred_every_seconds=0.0)  # never connected to
    e = Erasure(s, "t.deltas")
    e.probes.close()
    e.probes = Probes(Closable)
    e.keys = FakeKeys()  # type: ignore[assignment]
    old, new = ("h", "a", "k1"), ("h", "b", "k2")
    try:
        e.pending[old] = _Pending(0, {0: 5}, time.monotonic())
        assert e.tick({}) == 0  # floors asked (after `old` started); the read runs on the probes' thread
        e.pending[new] = _Pending(1, {0: 6}, time.monotonic())  # starts while that read is in flight
        gate.set()
        answer = e.probes.wait(FLOORS, WAIT)
        assert answer is not None
        e.probes._done[FLOORS] = answer  # give it back to the tick
        assert e.tick({}) == 1  # floor 100 > 5 and > 6, but only `old` started before it was asked
        assert e.keys.destroyed == [(0, [old])] and new in e.pending  # type: ignore[attr-defined]
        answer = e.probes.wait(FLOORS, WAIT)  # that tick asked again: a read after `new` started
        assert answer is not None and answer.asked > e.pending[new].since
        e.probes._done[FLOORS] = answer
        assert e.tick({}) == 1 and not e.pending
        assert e.keys.destroyed[-1] == (1, [new]) and reads[0] >= 2  # type: ignore[attr-defined]
    finally:
        e.probes.close()


def test_a_floors_read_that_times_out_is_asked_again_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A metadata request that timed out while a Kafka node restarted stopped the featurizer
    (chaos): the floors' read now rides transient errors like every other read, and the key is
    destroyed once a read answers."""
    from confluent_kafka import KafkaError, KafkaException

    calls = [0]

    def floors(settings: Settings, consumer: Any) -> dict[int, int]:
        calls[0] += 1
        if calls[0] == 1:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get metadata: Local: Timed out"))
        return {0: 100}

    monkeypatch.setattr(erasure, "ledger_floors", floors)
    s = Settings.from_env(bootstrap="127.0.0.1:9", shred_every_seconds=0.0, broker_retry_seconds=30.0)
    e = Erasure(s, "t.deltas")
    e.probes.close()
    e.probes = Probes(Closable)
    e.keys = FakeKeys()  # type: ignore[assignment]
    ref = ("h", "a", "k1")
    try:
        e.pending[ref] = _Pending(0, {0: 5}, time.monotonic())
        assert e.tick({}) == 0  # the read runs on the probes' thread
        answer = e.probes.wait(FLOORS, WAIT)
        assert answer is not None and answer.error is None and answer.value == {0: 100} and calls[0] == 2
        e.probes._done[FLOORS] = answer
        assert e.tick({}) == 1 and not e.pending
    finally:
        e.probes.close()
