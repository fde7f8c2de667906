"""Producing the featurizer's outputs so that "sent" means "acknowledged by the broker".

The transactional outbox (``cache.py``) deletes a row only after its message is durable, and the
changelog's txn and position records (phase 0) must be durable before the downstream messages
(phase 1) exist: both rest on these two functions, which raise unless every message was
acknowledged. ``on_acked`` sees each acknowledged message (the shredder learns where a delete
landed in ``deltas``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from unlearn.streams.featurizer.cache import OutboxRow
from unlearn.streams.featurizer.changelog import PHASE_CHANGELOG, outputs_of_txn
from unlearn.streams.featurizer.model import DeliveryError, OutMessage

#: Called with (topic, partition, offset, value) for every acknowledged message.
OnAcked = Callable[[str, int, int, "bytes | None"], None]


def produce_acked(producer: Any, sends: Sequence[dict[str, Any]], on_acked: OnAcked | None = None,
                  timeout: float | None = None, error: type[Exception] = DeliveryError) -> None:
    """Produce each ``Producer.produce`` keyword set in order and flush (within ``timeout``
    seconds, or without bound); raise ``error`` unless every message was acknowledged."""
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(f"{msg.topic()}: {err.str()}")
        elif on_acked is not None:
            on_acked(msg.topic(), msg.partition(), msg.offset(), msg.value())

    for send in sends:
        while True:
            try:
                producer.produce(**send, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
    remaining = producer.flush() if timeout is None else producer.flush(timeout)
    if remaining or failures:
        raise error(f"{remaining} message(s) unacknowledged, {len(failures)} failed: {failures[:3]}")


def deliver_phases(producer: Any, messages: Sequence[OutMessage | OutboxRow],
                   after_phase: Callable[[int], None] | None = None, on_acked: OnAcked | None = None) -> None:
    """Produce in order, phase by phase (phase 0, the changelog's txn and position records, is
    flushed and fully acknowledged before phase 1 is sent); raise unless every message was
    acknowledged."""
    for phase in sorted({m.phase for m in messages}):
        produce_acked(producer, [{"topic": m.topic, "value": m.value, "key": m.key,
                                  **({} if m.partition is None else {"partition": m.partition})}
                                 for m in messages if m.phase == phase], on_acked)
        if after_phase is not None:
            after_phase(phase)


def outbox_messages(rows: Sequence[OutboxRow], changelog_topic: str | None,
                    partition: int) -> list[OutboxRow | OutMessage]:
    """What a crash left to deliver: the outbox rows, plus the phase 1 rebuilt from their txn
    (``changelog.outputs_of_txn``) when they hold phase 0 only. Why: where the changelog backs
    the cache, the outbox keeps a batch's phase 0 alone (its txn holds phase 1 byte for byte), so
    q is stored once there; a schema-3 outbox (phase 1 stored too) or one without a changelog is
    delivered as it is."""
    if changelog_topic is None or not rows or any(r.phase != PHASE_CHANGELOG for r in rows):
        return list(rows)
    return [*rows, *outputs_of_txn(changelog_topic, partition, rows)]
