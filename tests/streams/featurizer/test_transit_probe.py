"""Sampling log ends for transit-key destruction (streams/featurizer/erasure.py, "Probe cost"): one
consumer and one pass per tick for every epoch that needs the ends, however many epochs and
partitions are due. No broker: a fake assign-only consumer answers partition EOF at the reported
end."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from confluent_kafka import KafkaError

from unlearn.infra.settings import Settings
from unlearn.schemas.sealed import new_transit_key
from unlearn.streams.featurizer.transit_keys import Epoch, TransitKeys

REQ, BY_HEAD = "t.requests", "t.requests.by-head"


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
