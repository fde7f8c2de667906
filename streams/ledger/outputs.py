"""What the ledger worker produces: head updates, receipts and dead letters.

Everything goes through the worker's producer, and a failed delivery stops the worker
(:class:`DeliveryError`): an output that cannot be delivered must not be covered by a checkpoint,
so the restart replays from the last floor instead (nothing lost, nothing doubled). A head too
large for one message is published without its posterior, and if still too large dead-lettered
(the size policy), never a crash loop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from unlearn.infra.settings import ErasureSettings, Settings
from unlearn.ledger.tracked import HeadMode
from unlearn.schemas.deadletter import DeadLetter, encode_deadletter_bounded
from unlearn.schemas.delta_codec import Delta
from unlearn.schemas.head import HeadUpdate, encode_head
from unlearn.schemas.receipts import Receipt, encode_receipt
from unlearn.schemas.redaction import redact_delta
from unlearn.streams.ledger.settings import LedgerSettings

from .head_runtime import ApplyOutcome, HeadRuntime, Rejection, group_by_event
from .state_store import ChangelogStore

__all__ = ["STAGE", "DeliveryError", "Outputs", "PollOutputs", "head_update"]

log = logging.getLogger("unlearn.ledger")

STAGE = "ledger"


class DeliveryError(RuntimeError):
    """An output was not delivered: the worker stops before any checkpoint could cover it."""


@dataclass
class PollOutputs:
    """What one poll's applied messages owe, per head in the order first touched: the head
    (published once, at its last version, to its partition's heads topic) and its messages'
    outcomes in log order (receipts)."""

    heads: dict[str, tuple[int, HeadRuntime]] = field(default_factory=dict)
    outcomes: dict[str, list[ApplyOutcome]] = field(default_factory=dict)

    def add(self, part: int, head: HeadRuntime, outcome: ApplyOutcome) -> None:
        self.heads[head.head_id] = (part, head)
        self.outcomes.setdefault(head.head_id, []).append(outcome)


def head_update(head: HeadRuntime, mode: HeadMode | None = None, *, posterior: bool = False) -> HeadUpdate:
    """The head's update at its version. Only an exact update carries the ledger digest (the
    certificate, O(d^2)) and, with ``posterior``, T; a fast one carries the retained-rows hash
    alone. ``drift`` is this W's deviation from the canonical solve as the ledger knows it: 0.0 on
    an exact update (it is the canonical solve), the fast path's last measured deviation on a fast
    one. ``retained_classes`` comes from the ledger's exact per-class counts."""
    mode = mode or head.mode
    exact = mode == "exact"
    return HeadUpdate(
        head_id=head.head_id, version=head.version, mode=mode, digest=head.digest() if exact else None,
        n_retained=head.ledger.count, events_covered=head.events_covered,
        offsets=((head.input_partition, head.applied_offset),), drift=0.0 if exact else float(head.fast_drift),
        gamma=head.config.gamma, created_ts=time.time(), weights=head.weights,
        posterior=head.posterior if (exact and posterior) else None,
        retained_hash=head.retained_hash(), contract_version=head.contract_version,
        retained_classes=head.retained_classes())


class Outputs:
    """The worker's producer and the rules of what it sends (module docstring)."""

    def __init__(self, settings: Settings, producer: Any, store: ChangelogStore) -> None:
        self.settings = settings
        self.producer = producer
        self.store = store  # names each partition's current heads topic and counts its bytes
        self.deltas_topic = settings.topic("deltas")
        self.receipts_topic = settings.topic("receipts")
        self.deadletter_topic = settings.topic("deadletter")
        self.publish_posterior = LedgerSettings.of(settings).publish_posterior
        self.redact_inputs = ErasureSettings.of(settings).deadletter_inputs == "redact"
        self.delivery_errors: list[str] = []

    # ---------------------------------------------------------------- delivery
    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                self.delivery_errors.append(f"{topic}: {err}")

        while True:
            try:
                self.producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                return
            except BufferError:
                self.producer.poll(0.1)

    def serve(self) -> None:
        """Serve delivery reports; DeliveryError if one failed."""
        self.producer.poll(0)
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self.delivery_errors:
            raise DeliveryError(f"output delivery failed: {self.delivery_errors[:3]}")

    def flush(self, why: str) -> None:
        """Wait until every output produced so far is durable (DeliveryError before ``why`` if not)."""
        if self.producer.flush(self.settings.admin_timeout):
            raise DeliveryError(f"outputs not delivered within the admin timeout; stopping before the {why}")
        self.raise_if_failed()

    # ---------------------------------------------------------------- head updates
    def publish_head(self, part: int, head: HeadRuntime, mode: HeadMode | None = None) -> bool:
        """Produce the head's update to ``part``'s heads topic; False if it cannot fit in a message
        even without the posterior. Then the state stays exact and a dead letter says why: a head
        too large to publish must not stop the worker (and every head on its partition) in a crash
        loop."""
        update = head_update(head, mode, posterior=self.publish_posterior)
        value = encode_head(update)
        limit = self.settings.max_message_bytes
        if len(value) > limit and update.posterior is not None:
            value = encode_head(replace(update, posterior=None))
            log.warning("head %r version %d: published without its posterior (%d bytes over the limit)",
                        head.head_id, head.version, len(value) - limit)
        if len(value) > limit:
            detail = (f"head {head.head_id!r} version {head.version} (d={head.ledger.dim}, c={head.ledger.n_outputs}) "
                      f"encodes to {len(value)} bytes, over UNLEARN_MAX_MESSAGE_BYTES={limit}: not published")
            self.deadletter(DeadLetter(b"", "head_too_large", detail, STAGE, self.store.heads_topic(part), None,
                                       None, head.head_id.encode(), None, time.time()))
            return False
        key = head.head_id.encode()
        self.produce(self.store.heads_topic(part), key, value)
        self.store.count_head_bytes(part, len(key) + len(value))
        return True

    def publish_poll(self, poll: PollOutputs) -> None:
        """Per head touched in the poll: the fast head catches up once, one head update (the last
        version), then the receipt of every applied delete. A receipt names the version of the
        message that applied it and that version's retained-rows hash, never the published
        version: those depend on poll boundaries, so replays would issue conflicting receipts."""
        for head_id, (part, head) in poll.heads.items():
            head.sync()
            self.publish_head(part, head)
            now = time.time()
            for outcome in poll.outcomes[head_id]:
                for d in outcome.deletes:
                    r = Receipt.applied(d.event_id, d.subject_id, head_id, d.sample_ids, outcome.version, None, now,
                                        retained_hash=outcome.retained_hash)
                    self.produce(self.receipts_topic, d.subject_id.encode(), encode_receipt(r))

    # ---------------------------------------------------------------- refusals
    def dead_original(self, raw: bytes) -> bytes:
        """What a dead letter of the refused deltas message ``raw`` keeps: under
        UNLEARN_DEADLETTER_INPUTS=redact (the default) no plaintext row, label or ledger bytes,
        which no delete could reach there (``schemas/redaction.redact_delta``); ``keep``: ``raw``."""
        return redact_delta(raw) if self.redact_inputs else raw

    def bad_delta(self, raw: bytes, part: int, offset: int, key: bytes | None, detail: str) -> None:
        """A deltas message that does not decode or open: one dead letter, no receipt."""
        self.deadletter(DeadLetter(self.dead_original(raw), "bad_delta", detail, STAGE, self.deltas_topic,
                                   part, offset, key, None, time.time()))

    def reject_all(self, delta: Delta, raw: bytes, part: int, offset: int, key: bytes | None, reason: str,
                   detail: str) -> None:
        """Every entry of ``delta`` refused for one ``reason``."""
        original = self.dead_original(raw)
        for i, e in enumerate(delta.entries):
            rej = Rejection(i, e.sign, reason, detail, e.event_ids, e.sample_ids, e.subject_ids)
            self.rejected(delta.head_id, rej, original, part, offset, key)

    def rejected(self, head_id: str, rej: Rejection, original: bytes, part: int, offset: int,
                 key: bytes | None) -> None:
        """One refused entry: a dead letter, and a rejected receipt per delete event in it."""
        first_event = rej.event_ids[0] if rej.event_ids else None
        kind = "add" if rej.sign > 0 else "delete"
        detail = f"entry {rej.entry_index} ({kind}, {len(rej.event_ids)} rows): {rej.detail}"
        self.deadletter(DeadLetter(original, rej.reason, detail, STAGE, self.deltas_topic, part, offset, key,
                                   first_event, time.time()))
        if rej.sign < 0:
            for d in group_by_event(rej.event_ids, rej.sample_ids, rej.subject_ids):
                r = Receipt.rejected(d.event_id, d.subject_id, head_id, d.sample_ids, rej.reason, time.time())
                self.produce(self.receipts_topic, d.subject_id.encode(), encode_receipt(r))

    def deadletter(self, rec: DeadLetter) -> None:
        log.warning("deadletter %s: %r", rec.reason, rec.detail)
        value = encode_deadletter_bounded(rec, self.settings.max_message_bytes)
        self.produce(self.deadletter_topic, rec.key or b"", value)
