"""Which deltas the ledger worker takes next (:class:`DeltasPoller`, step 2 of the worker): one
deltas partition at a time, the partition holding a delete lane's delta first.

Why: a poll's messages are folded and published as one turn, so a delete lane's delta fetched
with the adds of several heads waited for all of them (issue 29: with the adds over four heads a
poll took over 20 ms half of the time; bench/results/pipeline_bench.md section 28). Deltas
partitions share no state (a head lives in one), so their order changes no version, digest or
receipt; within a partition the order is the log's. Each partition's turn is processed and
published like a poll of its own, so a rebalance between turns finds nothing half done.

The rest of what was fetched waits in the poller (``carry``); the worker drops a partition's
carried messages when it is assigned, revoked or lost (they would be read again from its
floor). A partition waits at most ``FAIR_S`` behind lanes of others: then its oldest message
goes first, so a stream of deletes cannot starve the adds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from unlearn.runtime.poll_loop import coalesce, records
from unlearn.schemas.source_id import LANE_SUFFIX

__all__ = ["FAIR_S", "DeltasPoller", "next_partition"]

#: The longest a fetched message waits while other partitions' lanes go first.
FAIR_S = 0.1

_LANE = LANE_SUFFIX.encode()


def next_partition(carried: list[tuple[int, bool, float]], now: float, fair_s: float = FAIR_S) -> int:
    """The partition to process next, from the carried messages' (partition, holds a lane's delta,
    fetched at) in fetch order: the oldest's partition once it waited ``fair_s``, else the first
    partition holding a lane's delta, else the oldest's (pure)."""
    oldest_part, _, oldest_at = carried[0]
    if now - oldest_at >= fair_s:
        return oldest_part
    return next((part for part, lane, _ in carried if lane), oldest_part)


class DeltasPoller:
    """Up to ``most`` deltas messages fetched per poll, waiting at most ``wait_s`` for the first
    when nothing is carried (``poll_loop.coalesce``); one partition's messages handed out per
    poll (module docstring)."""

    def __init__(self, most: int = 500, wait_s: float = 0.05) -> None:
        self.most, self.wait_s = most, wait_s
        self.carry: list[tuple[Any, bool, float]] = []  # (message, holds a lane's delta, fetched at)

    def poll(self, consumer: Any, stop: threading.Event, check: Callable[[], None]) -> list[Any]:
        self.fetch(consumer, 0.0 if self.carry else self.wait_s)
        if not self.carry:
            return []
        part = next_partition([(m.partition(), lane, at) for m, lane, at in self.carry], time.monotonic())
        batch = [m for m, _, _ in self.carry if m.partition() == part]
        self.carry = [c for c in self.carry if c[0].partition() != part]
        return batch

    def fetch(self, consumer: Any, wait_s: float) -> None:
        """Carry what the consumer has fetched, up to ``most`` carried, waiting at most ``wait_s``
        for the first message."""
        room = self.most - len(self.carry)
        if room > 0:
            got = records(coalesce(consumer, room, wait_s), "deltas")
            now = time.monotonic()
            self.carry += [(m, _LANE in (m.value() or b""), now) for m in got]

    def drop(self, partitions: Collection[int]) -> None:
        """Forget the carried messages of ``partitions`` (assigned, revoked or lost)."""
        self.carry = [c for c in self.carry if c[0].partition() not in partitions]
