"""The poll loop both stages run, apart from what they decide (Kafka Streams' StreamThread is the
model: the thread owns the consumer and the loop, the tasks own the processing).

A :class:`Processor` is told, in this order: ``assign`` (restore the partitions' state, seek), then
per turn of the loop ``process`` (a batch of records) or ``idle`` (nothing came), and ``tick`` (its
timers), ``revoke``/``lost`` on rebalances, and at the end ``finish`` (a clean stop: make what is
done durable) or ``abandon`` (a failure: touch nothing, the restart recovers), then ``close``.

Why the loop keeps failures of the rebalance callbacks: librdkafka calls them from inside
``poll``/``consume``, where an exception is fragile (it can leave the client half-assigned), so
the loop keeps it, unassigns, and raises it from the loop after the poll returns. Readiness (the
first assignment applied) is an event and a callback, for tests, health checks and the demo.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["PollLoop", "Poller", "Processor", "coalesce", "records"]

log = logging.getLogger("unlearn.runtime")

#: A turn whose work (processing its batch, then the timers), or whose poll that returned
#: records, took longer than this is logged with its parts: every record behind it in the
#: worker's partitions waited that long. A poll that brought partitions up (their restore runs
#: inside it) is not a slow poll; a poll that returned nothing is a wait, not a stall.
SLOW_TURN_S = 0.5


class Processor(Protocol):
    def assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Bring the partitions' state up and ``consumer.assign`` them (offsets set)."""

    def revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Make the partitions' work durable where it can, then drop their state."""

    def lost(self, consumer: Any, partitions: list[Any]) -> None:
        """Drop the partitions' state: another member owns them already."""

    def process(self, batch: list[Any]) -> None:
        """One batch of records (no error records: :func:`records`)."""

    def idle(self) -> None:
        """A turn without records."""

    def tick(self) -> None:
        """After every turn: timers (checkpoints, erasure, trimming)."""

    def finish(self) -> None:
        """A clean stop: make what was processed durable."""

    def abandon(self) -> None:
        """A failure: leave state as a kill -9 would (the restart recovers from it)."""

    def close(self, clean: bool) -> None:
        """After the consumer left the group: release everything."""


class Poller(Protocol):
    def poll(self, consumer: Any, stop: threading.Event, check: Callable[[], None]) -> list[Any]:
        """The next batch ([] when idle); ``check`` runs after every client call."""


def records(messages: Sequence[Any], where: str) -> list[Any]:
    """The records among ``messages``: partition EOF skipped, a transient error logged (the client
    retries the fetch itself), a fatal one raised (the client cannot go on: the restart recovers)."""
    from confluent_kafka import KafkaError, KafkaException

    out = []
    for m in messages:
        err = m.error()
        if err is None:
            out.append(m)
        elif err.fatal():
            raise KafkaException(err)
        elif err.code() != KafkaError._PARTITION_EOF:
            log.warning("%s consumer: %s", where, err.str())
    return out


def coalesce(consumer: Any, most: int, wait_s: float) -> list[Any]:
    """Whatever is already fetched, up to ``most``, waiting at most ``wait_s`` for the first. A
    single ``consume(most, wait_s)`` would hold a lone message for the whole wait (librdkafka waits
    for a full batch or the timeout); this takes what is pending only."""
    first = consumer.consume(num_messages=1, timeout=wait_s)
    if not first or most <= 1:
        return list(first)
    return list(first) + list(consumer.consume(num_messages=most - 1, timeout=0))


class PollLoop:
    """Subscribe ``consumer`` to ``topics`` and run ``processor`` until ``stop`` is set (see the
    module docstring); :meth:`run` raises what failed, after abandoning and closing."""

    def __init__(self, consumer: Any, processor: Processor, poller: Poller,
                 on_ready: Callable[[], None] | None = None) -> None:
        self.consumer, self.processor, self.poller = consumer, processor, poller
        self.on_ready = on_ready
        self.ready = threading.Event()
        self.fatal: BaseException | None = None
        self.rebalances = 0  # assignments, revocations and losses so far (their work runs inside a poll)

    def subscribe(self, topics: list[str]) -> None:
        self.consumer.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)

    def run(self, stop: threading.Event) -> None:
        clean = False
        try:
            while not stop.is_set():
                self.turn(stop)
            self.processor.finish()
            clean = True
        except BaseException as exc:
            if self.fatal is None:
                self.fatal = exc
            raise
        finally:
            if not clean:
                self.processor.abandon()
            try:
                self.consumer.close()  # leaves the group: the others rebalance at once
            except Exception as exc:  # closing after a failure: report, do not mask it
                log.warning("consumer close: %s", exc)
            self.processor.close(clean)

    def turn(self, stop: threading.Event) -> None:
        """One poll, its batch processed (or the idle hook), the processor's timers."""
        t0, rebalances = time.monotonic(), self.rebalances
        batch = self.poller.poll(self.consumer, stop, self.check)
        self.check()
        t1 = time.monotonic()
        if batch:
            self.processor.process(batch)
        else:
            self.processor.idle()
        t2 = time.monotonic()
        self.processor.tick()
        t3 = time.monotonic()
        slow_poll = batch and t1 - t0 > SLOW_TURN_S and rebalances == self.rebalances  # not waits, nor restores
        if t3 - t1 > SLOW_TURN_S or slow_poll:
            log.warning("slow turn: %s %.0f ms (%d records), timers %.0f ms, after a poll of %.0f ms",
                        "processing" if batch else "idle", 1000 * (t2 - t1), len(batch), 1000 * (t3 - t2),
                        1000 * (t1 - t0))

    def check(self) -> None:
        """Raise what a rebalance callback failed with."""
        if self.fatal is not None:
            raise self.fatal

    def _rebalance(self, step: Callable[[Any, list[Any]], None], consumer: Any, partitions: list[Any]) -> bool:
        """Run one rebalance step of the processor; keep what it raised for the loop (the first
        failure wins) and say whether it succeeded."""
        self.rebalances += 1
        try:
            step(consumer, partitions)
        except BaseException as exc:  # raised by the loop after the poll returns
            self.fatal = self.fatal or exc
            return False
        return True

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        if not self._rebalance(self.processor.assign, consumer, partitions):
            with contextlib.suppress(Exception):  # never process a partition not brought up
                consumer.unassign()
            return
        if not self.ready.is_set():
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready()

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._rebalance(self.processor.revoke, consumer, partitions)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self._rebalance(self.processor.lost, consumer, partitions)
