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

Within a turn the same holds for heads (``lane_first``): a head's messages up to its last lane
delta are folded and published before the other heads' messages of the turn, which would
otherwise be folded ahead of its update (bench/results/pipeline_bench.md section 29).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from unlearn.runtime.poll_loop import coalesce, records
from unlearn.schemas.source_id import LANE_SUFFIX

__all__ = ["FAIR_S", "DeltasPoller", "holds_lane", "lane_first", "next_partition"]

#: The longest a fetched message waits while other partitions' lanes go first.
FAIR_S = 0.1

_LANE = LANE_SUFFIX.encode()


def holds_lane(value: bytes | None) -> bool:
    """Whether a deltas message came from a delete lane (its source id names one)."""
    return _LANE in (value or b"")


def lane_first(marks: Sequence[tuple[bytes | None, bool]]) -> tuple[list[int], list[int]]:
    """One partition's turn, from its messages' (key, holds a lane's delta) in log order: the
    indices to fold and publish first (each head's messages up to its last lane delta), then the
    rest, each part in log order (pure). A head's messages keep their order (a message is keyed by
    its head id), and heads share no state, so no version, digest or receipt changes. A message
    without a key names its head only inside its value: then nothing moves."""
    last = {key: i for i, (key, lane) in enumerate(marks) if lane}
    if not last or any(key is None for key, _ in marks):
        return list(range(len(marks))), []
    first = [i for i, (key, _) in enumerate(marks) if i <= last.get(key, -1)]
    return first, [i for i, (key, _) in enumerate(marks) if i > last.get(key, -1)]


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
    when nothing is carried and the worker has no idle work (``busy``: ``poll_loop.coalesce``);
    one partition's messages handed out per poll (module docstring)."""

    def __init__(self, most: int = 500, wait_s: float = 0.05, busy: Callable[[], bool] = lambda: False) -> None:
        self.most, self.wait_s, self.busy = most, wait_s, busy
        self.carry: list[tuple[Any, bool, float]] = []  # (message, holds a lane's delta, fetched at)

    def poll(self, consumer: Any, stop: threading.Event, check: Callable[[], None]) -> list[Any]:
        self.fetch(consumer, 0.0 if self.carry or self.busy() else self.wait_s)
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
            self.carry += [(m, holds_lane(m.value()), now) for m in got]

    def drop(self, partitions: Collection[int]) -> None:
        """Forget the carried messages of ``partitions`` (assigned, revoked or lost)."""
        self.carry = [c for c in self.carry if c[0].partition() not in partitions]
