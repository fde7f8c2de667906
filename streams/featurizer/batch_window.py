"""The featurizer's batch window: how long a poll waits for a micro-batch, and where it ends
(docs/featurizer.md, "The batch window"). What happens to the batch is ``batch.BatchProcessor``'s."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from unlearn.runtime.poll_loop import records
from unlearn.streams.featurizer.routing import might_delete

__all__ = ["SLICE_S", "BatchWindow"]


#: The longest a batch window waits in one ``consume`` call (seconds).
SLICE_S = 0.002

#: The longest a window with nothing polled waits in slices for the batch in flight to be answered
#: (seconds): then the poll loop's idle turn settles it, waiting as long as it must, and its timers run.
SETTLE_WAIT_S = 0.05


class BatchWindow:
    """Up to ``max_batch`` records, waiting at most ``max_ms`` after the first one. A batch that
    holds a delete closes as soon as what was already fetched is in (``routing.might_delete``),
    and ends at its last delete: the records fetched after it wait for the next batch (issue 29:
    under a flow of adds every fetch fills a batch, and a delete waited for the adds behind it
    too). The window buys adds throughput, a delete only waits in it; ``waiting`` runs between
    its slices (the processor settles the batch in flight there, off the next batch's path), and
    before the first record while it answers true (a batch is still in flight: the wait goes in
    slices until it is settled, so a lone delete does not pay for the settle of the one before)."""

    def __init__(self, max_batch: int, max_ms: int, waiting: Callable[[], bool] | None = None) -> None:
        if max_batch < 1 or max_ms < 0:
            raise ValueError("max_batch must be >= 1 and max_ms >= 0")
        self.max_batch, self.max_ms, self.waiting = max_batch, max_ms, waiting
        self._pending: list[Any] = []  # the batch being polled
        self._carry: list[Any] = []  # fetched after a batch's last delete: the next batch's start
        self._check: Callable[[], None] = lambda: None  # the last poll's: raises a failed rebalance's error
        self._done: set[tuple[str, int, int]] = set()  # carried deletes a lane took already: not urgent

    def drop(self, gone: Collection[tuple[str, int]]) -> None:
        """Forget polled records of revoked (topic, partition)s: the cache offset (or the router's
        committed offset) says they are not done, so the next owner reads them again."""
        self._pending = [m for m in self._pending if (m.topic(), m.partition()) not in gone]
        self._carry = [m for m in self._carry if (m.topic(), m.partition()) not in gone]

    def fetched_since(self, consumer: Any) -> list[Any]:
        """The records beyond the batch, in their order: those the window holds for the next batch
        (fetched behind the batch's last delete) and what the client fetched since, taken without
        waiting (the batch processor looks among them for deletes that may overtake the batch it
        is judging, and :meth:`carry` s them back). Rebalances run inside, as in a poll."""
        got = records(consumer.consume(num_messages=self.max_batch, timeout=0), "featurizer")
        self._check()
        held, self._carry = self._carry, []  # after the poll: a revocation inside it dropped its part
        return [*held, *got]

    def carry(self, msgs: list[Any], done: Collection[tuple[str, int, int]] = ()) -> None:
        """Records fetched and not processed: they start the next batch, after those carried already;
        ``done``: the (topic, partition, offset) of deletes among them a lane took (they close no window)."""
        self._carry.extend(msgs)
        self._done.update(done)

    def _urgent(self, m: Any) -> bool:
        return might_delete(m.value()) and (m.topic(), m.partition(), m.offset()) not in self._done

    def poll(self, consumer: Any, stop: threading.Event, check: Callable[[], None]) -> list[Any]:
        """The next batch ([] when idle, so the caller can look at ``stop``). ``check`` runs after
        every poll: it raises what a rebalance callback failed with."""
        self._check = check
        self._pending, self._carry = self._carry, []
        urgent = any(self._urgent(m) for m in self._pending)
        deadline: float | None = time.monotonic() + self.max_ms / 1000.0 if self._pending else None
        settle_by = time.monotonic() + SETTLE_WAIT_S
        while len(self._pending) < self.max_batch and not (urgent and deadline is not None):
            in_flight = False
            if deadline is None:
                # consume() blocks for its whole timeout unless the batch fills; poll() returns on
                # the first message, which starts the batch window (latency of a lone delete).
                # While the last batch is in flight the wait goes in slices, settling it once answered.
                in_flight = self.waiting is not None and bool(self.waiting()) and time.monotonic() < settle_by
                first = consumer.poll(SLICE_S if in_flight else 0.2)
                got = [] if first is None else [first]
            else:
                # consume() returns only when full or timed out, poll() on the first record: wait in
                # short slices for one record, then take what is fetched behind it, so that a
                # delete fetched in the middle of a long window closes it at once.
                first = consumer.poll(min(SLICE_S, max(0.0, deadline - time.monotonic())))
                room = self.max_batch - len(self._pending) - 1
                behind = consumer.consume(num_messages=room, timeout=0) if first is not None and room else []
                got = [] if first is None else [first, *behind]
            check()
            for m in records(got, "featurizer"):
                self._pending.append(m)
                urgent = urgent or self._urgent(m)
            if deadline is None:
                if not self._pending:
                    if in_flight and not stop.is_set():
                        continue
                    return []
                deadline = time.monotonic() + self.max_ms / 1000.0
                if urgent:  # a lone delete: take what was already fetched behind it, then close
                    got = consumer.consume(num_messages=self.max_batch - len(self._pending), timeout=0.0)
                    check()
                    self._pending.extend(records(got, "featurizer"))
            if time.monotonic() >= deadline or stop.is_set():
                break
            if self.waiting is not None and not urgent:
                self.waiting()
        batch, self._pending = self._pending, []
        if urgent:
            cut = max(i for i, m in enumerate(batch) if self._urgent(m)) + 1
            batch, self._carry = batch[:cut], batch[cut:]
        self._done.intersection_update((m.topic(), m.partition(), m.offset()) for m in self._carry)
        return batch
