"""Transit keys (streams/featurizer/transit_keys.py, docs/erasure.md section 5).

On a real broker: the public half is published after the private half is durable; a superseded
key is destroyed only once its grace has passed AND the router (the group's committed requests
offsets) and the featurizer (its durable by-head position) have passed every record that could
carry it; a request sealed under it afterwards is refused with the documented reason; destroying
it rotates only the ``transit-private`` family, never the sample keys' ``subject-keys``. Time is a
test clock: nothing here waits for a rotation.

Without a broker (the derived keys that open sealed inputs are test_transit_open.py's): sampling
log ends ("Probe cost"): one consumer and one pass per tick for every epoch that needs the ends, however
many epochs and partitions are due. The stages' reads off the poll loop (``probes.Probes``): a
read is asked only once its condition holds, so an answer sampled before is never used for it,
and a failed read leaves the stages to be asked again. Fakes stand in for key families, topic
metadata and assign-only consumers (answering partition EOF at the reported end).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError

from unlearn.common.by_head import head_partition
from unlearn.common.families import keys_family, transit_private_family
from unlearn.common.key_ring import TRANSIT_HEAD, read_partition_keys
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import consumer_config, producer_config
from unlearn.runtime.probes import Probes
from unlearn.runtime.topic_reader import read_topic
from unlearn.schemas.envelope import Request
from unlearn.schemas.request_inputs import TextInput
from unlearn.schemas.transit import (
    decode_public_record,
    new_transit_key,
    seal_request,
)
from unlearn.services.client.sdk import TransitKeyCache
from unlearn.streams.featurizer.key_store import KeyStore
from unlearn.streams.featurizer.transit_keys import PROBE, Epoch, TransitKeys, router_committed
from unlearn.streams.featurizer.transit_open import UnopenedRequest, open_sealed

REQ, BY_HEAD = "t.requests", "t.requests.by-head"
WAIT = 30.0


# --------------------------------------------------------------------------- on the broker

class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _produce(s: Settings, topic: str, partition: int, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer(producer_config(s))
    for i in range(n):
        p.produce(topic, value=b"x%d" % i, partition=partition)
    assert p.flush(30) == 0


@pytest.mark.broker
def test_a_lagging_router_keeps_a_superseded_transit_key_until_everything_is_routed_and_judged(
        settings: Settings) -> None:
    from confluent_kafka import Consumer, TopicPartition

    s = settings.with_(transit_rotate_seconds=10.0, transit_grace_seconds=5.0, shred_every_seconds=0.0)
    requests, by_head = s.topic("requests"), s.topic("requests.by-head")
    n_req = s.partitions
    fam = transit_private_family(s.topic_prefix)
    samples = KeyStore(s)
    keys = KeyStore(s, fam, samples)
    clock = Clock(1_000_000.0)
    transit = TransitKeys(s, keys, requests, by_head, clock=clock)
    group = Consumer(consumer_config(s, f"{s.topic_prefix}featurizer",
                                     **{"enable.auto.commit": False, "enable.partition.eof": True}))
    try:
        samples.load(0)
        transit.load(0)
        (first,) = transit.epochs[0].values()
        # the private half is durable in the transit-private family, the public half published
        stored = read_partition_keys(s, fam, [fam.topic(0, 0)], 0)
        assert stored is not None and first.ref in stored.keys and first.ref[0] == TRANSIT_HEAD
        pubs = [decode_public_record(r.value or b"") for r in read_topic(s, s.topic("transit-keys"), timeout=30)]
        assert [(p.partition, p.key_id) for p in pubs] == [(0, first.pair.key_id)]
        head = next(h for h in (f"h{i}" for i in range(100)) if head_partition(h, s.partitions) == 0)
        sealed = seal_request(Request("ev", "add", head, "c", "alice", "x1", 1, TextInput("secret"), 1.0), first.public)
        cache = TransitKeyCache(s)
        cache.keys[0] = first.public  # what a producer read before the clock moved on
        _produce(s, requests, 1, 3)  # records that could carry the key, not yet routed
        _produce(s, by_head, 0, 2)

        def tick(positions: dict[int, int]) -> dict[int, list[tuple[str, str, str]]]:
            return transit.tick(lambda: group, lambda: router_committed(group, requests, n_req, 30), positions)

        clock.t = first.use_until - 1.0  # the successor is published ahead of use_until
        assert tick({0: 0}) == {} and len(transit.epochs[0]) == 2
        clock.t = first.use_until + 4.0  # within the grace: kept
        assert tick({0: 0}) == {}
        for _ in range(3):  # grace over, but the router has committed nothing: kept
            clock.t += 1.0
            assert tick({0: 99}) == {}
        group.commit(offsets=[TopicPartition(requests, 1, 3)], asynchronous=False)  # the router caught up
        clock.t += 1.0
        assert tick({0: 1}) == {}  # ... but this featurizer has judged only 1 of the 2 by-head records
        clock.t += 1.0
        due = tick({0: 2})
        assert due == {0: [first.ref]}
        assert transit.lookup(0, first.pair.key_id) is not None  # nothing destroyed until the rotation
        assert transit.destroy(0, due[0]) == 1
        assert transit.lookup(0, first.pair.key_id) is None
        # a request sealed under the destroyed key gets the documented dead-letter reason
        (refused,) = open_sealed([sealed], transit.gate(0))
        assert isinstance(refused, UnopenedRequest) and refused.reason == "transit_key_destroyed"
        assert refused.request.event_id == "ev"
        # the new generation no longer holds it; the successor is kept
        topics = [fam.topic(0, g) for g in range(keys.next_gen[0])]
        stored = read_partition_keys(s, fam, topics, 0)
        assert stored is not None and first.ref not in stored.keys
        assert [r for r in stored.keys if r[0] == TRANSIT_HEAD] == [e.ref for e in transit.epochs[0].values()]
        # the sample key family was never rotated: it holds no transit key, still generation 0
        assert samples.next_gen[0] == 1 and samples.live(0) == []
        assert keys_family(s.topic_prefix).generations(samples.topics.listed(), 0) == [0]
        # a featurizer taking the partition over finds only the successor
        again = TransitKeys(s, KeyStore(s, fam), requests, by_head, clock=clock)
        again.load(0)
        assert set(again.epochs[0]) == set(transit.epochs[0])
        again.keys.close()
    finally:
        group.close()
        keys.retire_due(force=True)
        samples.close()


# --------------------------------------------------------------------------- probe cost

class FakeConsumer:
    """Assign-only reader: every assigned partition ends at ``ends`` (ListOffsets says 0 less)."""

    def __init__(self, ends: dict[tuple[str, int], int]) -> None:
        self.ends, self.assigns, self.queue = ends, [], []  # type: ignore[var-annotated]

    def list_topics(self, timeout: float) -> Any:
        parts = {q: None for (t, q) in self.ends if t == REQ}
        return SimpleNamespace(topics={REQ: SimpleNamespace(partitions=parts, error=None)})

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return 0, self.ends[(tp.topic, tp.partition)]

    def assign(self, tps: list[Any]) -> None:
        self.assigns.append(sorted((tp.topic, tp.partition) for tp in tps))
        eof = SimpleNamespace(code=lambda: KafkaError._PARTITION_EOF)
        self.queue = [SimpleNamespace(error=lambda: eof, offset=lambda o=tp.offset: o, topic=lambda t=tp.topic: t,
                                      partition=lambda q=tp.partition: q) for tp in tps]

    def poll(self, timeout: float) -> Any:
        return self.queue.pop() if self.queue else None


def test_one_consumer_and_one_pass_per_tick_for_every_due_epoch() -> None:
    s = Settings.from_env(transit_rotate_seconds=10.0, transit_grace_seconds=5.0, shred_every_seconds=0.0)
    now = [1000.0]
    transit = TransitKeys(s, cast(Any, None), REQ, BY_HEAD, clock=lambda: now[0])
    for p in (0, 1):  # per partition: two superseded epochs past their grace, and a current one
        eps = [Epoch(p, new_transit_key(), t, t + 10.0) for t in (970.0, 980.0, 999.0)]
        transit.epochs[p] = {e.pair.key_id: e for e in eps}
    ends = {(REQ, 0): 7, (REQ, 1): 3, (REQ, 2): 0, (BY_HEAD, 0): 4, (BY_HEAD, 1): 9}
    made: list[FakeConsumer] = []

    def make() -> FakeConsumer:
        made.append(FakeConsumer(ends))
        return made[-1]

    committed_reads = [0]

    def committed() -> dict[int, int]:
        committed_reads[0] += 1
        return {0: 7, 1: 3}

    assert transit.tick(make, committed, {0: 4, 1: 8}) == {}  # (a) met: requests ends sampled once
    assert len(made) == 1 and made[0].assigns == [[(REQ, 0), (REQ, 1), (REQ, 2)]] and committed_reads[0] == 0
    assert all(st.targets == {0: 7, 1: 3, 2: 0} for st in transit.stages.values()) and len(transit.stages) == 4
    now[0] += 1.0
    due = transit.tick(make, committed, {0: 4, 1: 8})  # (b) met for all four: by-head ends of 0 and 1, once
    assert len(made) == 2 and made[1].assigns == [[(BY_HEAD, 0), (BY_HEAD, 1)]] and committed_reads[0] == 1
    assert {p: len(refs) for p, refs in due.items()} == {0: 2}  # partition 1 has judged 8 of 9 records
    now[0] += 1.0
    due = transit.tick(make, committed, {0: 4, 1: 9})  # nothing left to sample
    assert len(made) == 2 and {p: len(refs) for p, refs in due.items()} == {0: 2, 1: 2}


# --------------------------------------------------------------------------- stages off the poll loop

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
