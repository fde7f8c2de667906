"""Producing so that "sent" means "acknowledged by the broker": the product's one produce call
(a full local queue waits for deliveries instead of failing) and :class:`Acks`, which produces now
and waits later, where a wait can overlap work.

Broker faults (``runtime.retry``): while a broker restarts, produced messages wait in the
client's queue and the client sends them again itself, so a wait without its own timeout waits
up to the policy's deadline (``UNLEARN_BROKER_RETRY_SECONDS``), then raises BrokerUnavailable. A
failed delivery *report* raises :class:`DeliveryError`: the client already retried that message
for ``message.timeout.ms``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from unlearn.runtime.retry import RetryPolicy, flush_within

#: Called with (topic, partition, offset, value) for every acknowledged message.
OnAcked = Callable[[str, int, int, "bytes | None"], None]


class DeliveryError(RuntimeError):
    """A message was not acknowledged: what rests on it (an offset commit, a checkpoint, an
    outbox row's delete) must not happen."""


def produce(producer: Any, *, backoff: float = 0.1, **send: Any) -> None:
    """``producer.produce(**send)``; while the local queue is full, serve delivery reports for
    ``backoff`` seconds and try again (a full queue is back-pressure, not a failure)."""
    while True:
        try:
            producer.produce(**send)
            return
        except BufferError:
            producer.poll(backoff)


class Acks:
    """Messages produced now and awaited later: :meth:`wait` flushes and raises ``error`` unless
    every message :meth:`send` produced was acknowledged. Why: a broker round trip can overlap
    other work (the router's forwards overlap the featurizer's batch, a batch's new keys its
    changelog records) while each guarantee still waits where it is needed."""

    def __init__(self, producer: Any, on_acked: OnAcked | None = None, error: type[Exception] = DeliveryError,
                 policy: RetryPolicy | None = None, what: str = "delivering outputs") -> None:
        self.producer, self.on_acked, self.error, self.policy, self.what = producer, on_acked, error, policy, what
        self.sent = self.acked = 0
        self.failures: list[str] = []

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failures.append(f"{msg.topic()}: {err.str()}")
            return
        self.acked += 1
        if self.on_acked is not None:
            self.on_acked(msg.topic(), msg.partition(), msg.offset(), msg.value())

    def send(self, sends: Sequence[dict[str, Any]]) -> Acks:
        """Produce each ``Producer.produce`` keyword set in order, without waiting."""
        for send in sends:
            produce(self.producer, **send, on_delivery=self._on_delivery)
            self.sent += 1
        return self

    def answered(self) -> bool:
        """Whether every message sent has its delivery report (acknowledged or failed), serving
        the reports due without blocking: a caller with time to spare settles early."""
        if self.acked + len(self.failures) < self.sent:
            self.producer.poll(0)
        return self.acked + len(self.failures) >= self.sent

    def wait(self, timeout: float | None = None) -> int:
        """Flush (within ``timeout`` seconds; without one, the policy's deadline, BrokerUnavailable
        past it, or without bound where there is no policy); raise unless every message sent so
        far was acknowledged. Returns how many were."""
        if timeout is None and self.policy is not None:
            flush_within(self.producer, self.policy, self.what)
            remaining = 0
        else:
            remaining = self.producer.flush() if timeout is None else self.producer.flush(timeout)
        if remaining or self.failures or self.acked != self.sent:
            raise self.error(f"{self.sent - self.acked} message(s) unacknowledged ({remaining} in the queue), "
                             f"{len(self.failures)} failed: {self.failures[:3]}")
        return self.acked


def produce_acked(producer: Any, sends: Sequence[dict[str, Any]], on_acked: OnAcked | None = None,
                  timeout: float | None = None, error: type[Exception] = DeliveryError,
                  policy: RetryPolicy | None = None, what: str = "delivering outputs") -> None:
    """Produce each ``Producer.produce`` keyword set in order and flush (within ``timeout``
    seconds, or as :meth:`Acks.wait`); raise ``error`` unless every message was acknowledged."""
    Acks(producer, on_acked, error, policy, what).send(sends).wait(timeout)
