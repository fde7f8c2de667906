"""The shred tick's reads off the poll loop (streams/featurizer/erasure.py): a read is asked only
once its condition holds and starts after it was asked, so an answer sampled before a condition
started is never used for it. No broker: reads are fakes gated by events."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from unlearn.infra.settings import Settings
from unlearn.schemas.sealed import new_transit_key
from unlearn.streams.featurizer import erasure
from unlearn.streams.featurizer.erasure import FLOORS, Erasure, _Pending
from unlearn.streams.featurizer.probes import Probes
from unlearn.streams.featurizer.transit_keys import PROBE, Epoch, TransitKeys

WAIT = 30.0


class Closable:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_an_answer_is_sampled_after_it_was_asked_and_its_consumers_are_closed() -> None:
    made: list[Closable] = []
    probes = Probes(lambda: made.append(Closable()) or made[-1])
    gate = threading.Event()
    seen: list[float] = []

    def job(make: Any) -> int:
        make(), make()
        gate.wait(WAIT)
        seen.append(time.monotonic())
        return 7

    try:
        assert probes.ask("x", job)
        assert probes.busy("x") and not probes.ask("x", job)  # one in flight per name
        assert probes.take("x") is None
        gate.set()
        answer = probes.wait("x", WAIT)
        assert answer is not None and answer.result() == 7
        assert answer.asked <= answer.started <= seen[0]
        assert len(made) == 2 and all(c.closed for c in made)
        assert not probes.busy("x")

        def fails(make: Any) -> None:
            raise RuntimeError("broker gone")

        assert probes.ask("x", fails)
        failed = probes.wait("x", WAIT)
        assert failed is not None
        with pytest.raises(RuntimeError, match="broker gone"):
            failed.result()  # re-raised on the tick's thread, as a read on the poll loop raised
    finally:
        probes.close()


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


class EndsConsumer:
    """Assign-only reader whose partitions end at ``ends`` (enough for ``log_ends``)."""

    def __init__(self, ends: dict[tuple[str, int], int]) -> None:
        self.ends: dict[tuple[str, int], int] = ends
        self.queue: list[Any] = []

    def list_topics(self, timeout: float) -> Any:
        parts = {q: None for (t, q) in self.ends if t == "t.requests"}
        return SimpleNamespace(topics={"t.requests": SimpleNamespace(partitions=parts, error=None)})

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return 0, self.ends[(tp.topic, tp.partition)]

    def assign(self, tps: list[Any]) -> None:
        from confluent_kafka import KafkaError

        eof = SimpleNamespace(code=lambda: KafkaError._PARTITION_EOF)
        self.queue = [SimpleNamespace(error=lambda: eof, offset=lambda o=tp.offset: o, topic=lambda t=tp.topic: t,
                                      partition=lambda q=tp.partition: q) for tp in tps]

    def poll(self, timeout: float) -> Any:
        return self.queue.pop() if self.queue else None

    def close(self) -> None:
        pass


def test_transit_stages_use_only_reads_asked_after_the_epoch_reached_them() -> None:
    """An epoch whose grace ends while a read is in flight gets no targets from that read (it was
    asked before (a) held for it); (c)'s by-head end comes from a read that read the committed
    offsets first."""
    s = Settings.from_env(transit_rotate_seconds=10.0, transit_grace_seconds=5.0, shred_every_seconds=0.0)
    now = [1000.0]
    gate = threading.Event()
    ends = {("t.requests", 0): 7, ("t.by-head", 0): 4}

    def make() -> EndsConsumer:
        gate.wait(WAIT)
        return EndsConsumer(ends)

    probes = Probes(make)
    transit = TransitKeys(s, None, "t.requests", "t.by-head", clock=lambda: now[0], probes=probes)  # type: ignore[arg-type]
    first, second = (Epoch(0, new_transit_key(), t, t + 10.0) for t in (980.0, 987.0))
    current = Epoch(0, new_transit_key(), 999.0, 1100.0)  # no rotation in this test
    transit.epochs[0] = {e.pair.key_id: e for e in (first, second, current)}
    try:
        # 1000: only `first` is past its grace (990 + 5); `second`'s (997 + 5) ends at 1002
        assert transit.tick(lambda: None, lambda: {0: 7}, {0: 4}) == {}
        now[0] = 1003.0  # `second` past its grace while the read asked at 1000 is in flight
        assert transit.tick(lambda: None, lambda: {0: 7}, {0: 4}) == {} and probes.busy(PROBE)
        gate.set()
        answer = probes.wait(PROBE, WAIT)
        assert answer is not None
        probes._done[PROBE] = answer
        now[0] += 1.0
        transit.tick(lambda: None, lambda: {0: 7}, {0: 4})  # applies it; asks the next step
        assert set(transit.stages) == {first.ref}  # the read was asked before `second` reached (a)
        assert transit.stages[first.ref].targets == {0: 7} and transit.stages[first.ref].by_head is None
        answer = probes.wait(PROBE, WAIT)  # (b) of `first` met: its by-head end; targets of `second`
        assert answer is not None
        probes._done[PROBE] = answer
        now[0] += 1.0
        due = transit.tick(lambda: None, lambda: {0: 7}, {0: 4})
        assert transit.stages[first.ref].by_head == 4 and transit.stages[second.ref].targets == {0: 7}
        assert due == {0: [first.ref]}
        answer = probes.wait(PROBE, WAIT)  # (b) of `second`, read after its targets were set
        assert answer is not None
        probes._done[PROBE] = answer
        now[0] += 1.0
        due = transit.tick(lambda: None, lambda: {0: 7}, {0: 4})
        assert sorted(due[0]) == sorted([first.ref, second.ref]) and not probes.busy(PROBE)
    finally:
        probes.close()


class FailingEndsConsumer(EndsConsumer):
    """Answers ListOffsets with a broker hiccup (as while a Kafka node's partitions move)."""

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        from confluent_kafka import KafkaError, KafkaException

        raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))


def test_a_failed_transit_read_leaves_the_stages_and_is_asked_again() -> None:
    """A read that raised (seen in bench.chaos on 3 Kafka nodes: _UNKNOWN_PARTITION) must not end
    the featurizer: nothing advances, the next tick asks again, and a good read then applies."""
    s = Settings.from_env(transit_rotate_seconds=10.0, transit_grace_seconds=5.0, shred_every_seconds=0.0)
    now = [1000.0]
    ends = {("t.requests", 0): 7, ("t.by-head", 0): 4}
    failing = [True]
    probes = Probes(lambda: FailingEndsConsumer(ends) if failing[0] else EndsConsumer(ends))
    transit = TransitKeys(s, None, "t.requests", "t.by-head", clock=lambda: now[0], probes=probes)  # type: ignore[arg-type]
    old = Epoch(0, new_transit_key(), 980.0, 990.0)
    current = Epoch(0, new_transit_key(), 999.0, 1100.0)
    transit.epochs[0] = {e.pair.key_id: e for e in (old, current)}
    try:
        assert transit.tick(lambda: None, lambda: {0: 7}, {0: 4}) == {}
        answer = probes.wait(PROBE, WAIT)
        assert answer is not None and answer.error is not None
        probes._done[PROBE] = answer
        now[0] += 1.0
        assert transit.tick(lambda: None, lambda: {0: 7}, {0: 4}) == {}  # no raise; asks again
        assert not transit.stages and probes.busy(PROBE)
        failing[0] = False
        probes.wait(PROBE, WAIT)  # the second read (still failing: asked before the switch)
        now[0] += 1.0
        transit.tick(lambda: None, lambda: {0: 7}, {0: 4})
        answer = probes.wait(PROBE, WAIT)
        assert answer is not None and answer.error is None
        probes._done[PROBE] = answer
        now[0] += 1.0
        transit.tick(lambda: None, lambda: {0: 7}, {0: 4})
        assert transit.stages[old.ref].targets == {0: 7}
    finally:
        probes.close()
