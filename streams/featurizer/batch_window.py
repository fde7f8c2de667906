"""The featurizer's micro-batch window (docs/featurizer.md, "The batch window"): how long a poll
waits for a batch to fill."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from unlearn.streams.featurizer.model import FeaturizerError
from unlearn.streams.featurizer.router import might_delete

__all__ = ["BatchWindow"]

log = logging.getLogger("unlearn.featurizer")


class BatchWindow:
    """Up to ``max_batch`` records, waiting at most ``max_ms`` after the first one; a batch that
    holds a delete closes as soon as what was already fetched is in (``router.might_delete``):
    the window buys adds throughput, a delete only waits in it."""

    def __init__(self, max_batch: int, max_ms: int) -> None:
        if max_batch < 1 or max_ms < 0:
            raise ValueError("max_batch must be >= 1 and max_ms >= 0")
        self.max_batch, self.max_ms = max_batch, max_ms
        self._pending: list[Any] = []  # the batch being polled

    def drop(self, gone: Collection[tuple[str, int]]) -> None:
        """Forget polled records of revoked (topic, partition)s: the cache offset (or the router's
        committed offset) says they are not done, so the next owner reads them again."""
        self._pending = [m for m in self._pending if (m.topic(), m.partition()) not in gone]

    def poll(self, consumer: Any, stop: threading.Event, check: Callable[[], None]) -> list[Any]:
        """The next batch ([] when idle, so the caller can look at ``stop``). ``check`` runs after
        every poll: it raises what a rebalance callback failed with."""
        from confluent_kafka import KafkaError

        self._pending = []
        deadline: float | None = None
        urgent = False
        while len(self._pending) < self.max_batch:
            if deadline is None:
                # consume() blocks for its whole timeout unless the batch fills; poll() returns on
                # the first message, which starts the batch window (latency of a lone delete).
                first = consumer.poll(0.2)
                got = [] if first is None else [first]
            else:
                timeout = 0.0 if urgent else max(0.0, deadline - time.monotonic())
                got = consumer.consume(num_messages=self.max_batch - len(self._pending), timeout=timeout)
            check()
            for m in got:
                err = m.error()
                if err is None:
                    self._pending.append(m)
                    urgent = urgent or might_delete(m.value())
                elif err.code() == KafkaError._PARTITION_EOF:
                    continue
                elif err.fatal():
                    raise FeaturizerError(f"consumer: {err.str()}")
                else:
                    log.warning("consumer: %s", err.str())
            if deadline is None:
                if not self._pending:
                    return []
                deadline = time.monotonic() + self.max_ms / 1000.0
            elif urgent:
                break  # what was already fetched is taken (a non-blocking consume): close now
            if time.monotonic() >= deadline or stop.is_set():
                break
        batch, self._pending = self._pending, []
        return batch
