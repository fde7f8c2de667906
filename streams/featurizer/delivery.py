"""Producing the featurizer's outputs so that "sent" means "acknowledged by the broker".

The transactional outbox (``cache_outbox.py``) deletes a row only after its message is durable, and the
changelog's txn and position records (phase 0) must be durable before the downstream messages
(phase 1) exist: both rest on these functions, which raise unless every message was
acknowledged (``runtime.delivery.Acks`` produces now and waits later, where a wait can
overlap work).
``on_acked`` sees each acknowledged message (the shredder learns where a delete landed in
``deltas``).

Broker faults (``runtime.retry``): while a broker restarts, produced messages wait in the client's
queue and the client sends them again itself, so a wait without its own timeout waits up to the
policy's deadline (``UNLEARN_BROKER_RETRY_SECONDS``), then stops the featurizer with
BrokerUnavailable (its outbox re-sends the batch on restart). A failed delivery *report* still
raises: the client already retried that message for ``message.timeout.ms``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from unlearn.runtime.delivery import Acks, OnAcked, produce_acked
from unlearn.runtime.retry import RetryPolicy
from unlearn.streams.featurizer.batch_io import OutMessage
from unlearn.streams.featurizer.cache_outbox import OutboxRow
from unlearn.streams.featurizer.changelog_batches import delivered_record, outputs_of_txn


def produce_kwargs(m: OutMessage | OutboxRow) -> dict[str, Any]:
    """``Producer.produce`` keywords of one message (its headers only when it has some: the trace
    context, infra/tracing.py)."""
    kw: dict[str, Any] = {"topic": m.topic, "value": m.value, "key": m.key}
    if m.partition is not None:
        kw["partition"] = m.partition
    if m.headers:
        kw["headers"] = list(m.headers)
    return kw


def deliver_phases(producer: Any, messages: Sequence[OutMessage | OutboxRow],
                   after_phase: Callable[[int], None] | None = None, on_acked: OnAcked | None = None,
                   policy: RetryPolicy | None = None) -> None:
    """Produce in order, phase by phase (phase 0, the changelog's txn and position records, is
    flushed and fully acknowledged before phase 1 is sent); raise unless every message was
    acknowledged."""
    for phase in sorted({m.phase for m in messages}):
        produce_acked(producer, [produce_kwargs(m) for m in messages if m.phase == phase], on_acked, policy=policy)
        if after_phase is not None:
            after_phase(phase)


def deliver_overlapped(producer: Any, messages: Sequence[OutMessage | OutboxRow],
                       after_phase: Callable[[int], None] | None = None, on_acked: OnAcked | None = None,
                       policy: RetryPolicy | None = None) -> Acks:
    """As :func:`deliver_phases`, but the last phase is only sent: its :class:`Acks` are returned
    for the caller to await before anything that depends on them (the batch's outbox delete, the
    next batch's phase 0). Why: phase 1's round trip then overlaps the next batch's polling and
    judging instead of adding to every batch."""
    phases = sorted({m.phase for m in messages}) or [0]
    deliver_phases(producer, [m for m in messages if m.phase != phases[-1]], after_phase, on_acked, policy)
    last = Acks(producer, on_acked, policy=policy).send([produce_kwargs(m) for m in messages if m.phase == phases[-1]])
    # Serves delivery reports; it does not beat linger.ms (librdkafka drops the flush's "no linger"
    # flag when the call returns), which is why the featurizer's producer has linger.ms=0.
    producer.flush(0)
    return last


def outbox_messages(rows: Sequence[OutboxRow], changelog_topic: str | None,
                    partition: int) -> list[OutboxRow | OutMessage]:
    """What a crash left to deliver: the outbox rows, plus, where the changelog backs the cache,
    the phase 1 rebuilt from their txn (``cache.outputs_of_txn``). Why: there the outbox keeps
    a batch's phase 0 alone (its txn holds phase 1 byte for byte), so q is stored once; without a
    changelog the outbox holds every message and is delivered as it is."""
    if changelog_topic is None or not rows:
        return list(rows)
    return [*rows, *outputs_of_txn(changelog_topic, partition, rows)]


class Delivery:
    """The featurizer's producer as the router, the batch processor and the partitions share it:
    forwards sent now and awaited later, outbox messages delivered phase by phase, and the
    changelog's ``delivered`` marks. ``on_acked`` sees every acknowledged message (the shredder
    learns where a delete landed in ``deltas``). ``policy``: every wait is bounded by its deadline
    (module docstring)."""

    def __init__(self, producer: Any, changelog_topic: str | None, on_acked: OnAcked | None = None,
                 policy: RetryPolicy | None = None) -> None:
        self.producer = producer
        self.changelog_topic = changelog_topic
        self.on_acked = on_acked
        self.policy = policy

    def send(self, sends: Sequence[dict[str, Any]]) -> Acks:
        """Produce ``Producer.produce`` keyword sets now; await the returned :class:`Acks` later."""
        return Acks(self.producer, self.on_acked, policy=self.policy).send(sends)

    def deliver(self, messages: Sequence[OutMessage | OutboxRow],
                after_phase: Callable[[int], None] | None = None) -> None:
        """Every phase produced and acknowledged (:func:`deliver_phases`)."""
        deliver_phases(self.producer, messages, after_phase, self.on_acked, self.policy)

    def deliver_overlapped(self, messages: Sequence[OutMessage | OutboxRow],
                           after_phase: Callable[[int], None] | None = None) -> Acks:
        """Every phase but the last acknowledged; the last one's acks returned (:func:`deliver_overlapped`)."""
        return deliver_overlapped(self.producer, messages, after_phase, self.on_acked, self.policy)

    def mark_delivered(self, partition: int, generation: int) -> None:
        """Tell a future owner generation ``generation`` needs no re-send (best effort, not awaited:
        it rides with the next flush; losing it only costs a duplicate re-send)."""
        if self.changelog_topic is None or generation <= 0:
            return
        m = delivered_record(self.changelog_topic, partition, generation)
        with contextlib.suppress(BufferError):
            self.producer.produce(m.topic, value=m.value, key=m.key, partition=m.partition)
