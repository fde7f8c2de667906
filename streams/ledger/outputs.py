"""What the ledger worker produces (:class:`Outputs`): head updates, receipts and dead letters, and
the :class:`DeliveryError` that stops the worker when one is not delivered.

Everything goes through the worker's producer, and a failed delivery stops the worker: an output
that cannot be delivered must not be covered by a checkpoint, so the restart replays from the
last floor instead (nothing lost, nothing doubled). Per poll (:class:`PollOutputs`), each touched
head's fast head catches up once, then one head update per head (its last version) and the
receipts of every applied delete. A head too large for one message is published without its
posterior, and if still too large dead-lettered (the size policy), never a crash loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from unlearn.infra import tracing
from unlearn.infra.settings import ErasureSettings, Settings
from unlearn.ledger.tracked_head import HeadMode
from unlearn.runtime.delivery import DeliveryError, produce
from unlearn.runtime.retry import RetryPolicy, flush_within
from unlearn.schemas.deadletter import DeadLetter, encode_deadletter_bounded
from unlearn.schemas.delta_codec import Delta
from unlearn.schemas.head import HeadUpdate, encode_head
from unlearn.schemas.receipts import Receipt, encode_receipt
from unlearn.schemas.redaction import redact_delta
from unlearn.streams.ledger.changelog_store import ChangelogStore
from unlearn.streams.ledger.delta_rules import Rejection, group_by_event
from unlearn.streams.ledger.head_runtime import ApplyOutcome, HeadRuntime
from unlearn.streams.ledger.settings import LedgerSettings

__all__ = [
    "STAGE",
    "Outputs",
    "PollOutputs",
    "head_update",
    "receipt_headers",
]

log = logging.getLogger("unlearn.ledger")


STAGE = "ledger"




@dataclass
class PollOutputs:
    """What one poll's applied messages owe, per head in the order first touched: the head
    (published once, at its last version, to its partition's heads topic) and its messages'
    outcomes in log order (receipts)."""

    heads: dict[str, tuple[int, HeadRuntime]] = field(default_factory=dict)
    outcomes: dict[str, list[ApplyOutcome]] = field(default_factory=dict)
    record_ts: float = 0.0  # the Kafka timestamp (s) of the message being folded
    delete_ts: list[float] = field(default_factory=list)  # one per applied delete: its message's timestamp
    record_trace: bytes | None = None  # the valid traceparent of the message being folded (infra/tracing.py)
    record_events: dict[str, bytes] = field(default_factory=dict)  # its event id -> traceparent header
    traces: dict[str, list[tuple[bool, bytes]]] = field(default_factory=dict)  # head id -> (no deletes, context)
    events: dict[str, bytes] = field(default_factory=dict)  # event id -> its request's context

    def add(self, part: int, head: HeadRuntime, outcome: ApplyOutcome) -> None:
        self.heads[head.head_id] = (part, head)
        self.outcomes.setdefault(head.head_id, []).append(outcome)
        self.delete_ts += [self.record_ts] * len(outcome.deletes)
        if self.record_trace is not None:
            self.traces.setdefault(head.head_id, []).append((not outcome.deletes, self.record_trace))
            self.events.update(self.record_events)

    def publish_order(self) -> list[tuple[str, tuple[int, HeadRuntime]]]:
        """The heads to bring up and publish, those that applied a delete first (a delete's receipt
        waits for no other head's update), each group in the order first touched. The order
        changes no version or receipt: each head's update and receipts are its own."""
        return sorted(self.heads.items(), key=lambda kv: not any(o.deletes for o in self.outcomes[kv[0]]))

    def head_traces(self, head_id: str) -> list[bytes]:
        """The contexts of the head's traced deltas in this poll: those that deleted first (the
        head update's parent is the first), then the others, each in log order."""
        return [tp for _, tp in sorted(self.traces.get(head_id, ()), key=lambda x: x[0])]

    def read_trace(self, headers: Any) -> None:
        """The trace context of the message about to be folded (only header bytes are read)."""
        self.record_trace = tracing.traceparent_of(headers) if headers else None
        self.record_events = tracing.events_of(headers) if self.record_trace is not None else {}


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


def receipt_headers(event_id: str, traces: Mapping[str, bytes] | None) -> tuple[tuple[str, bytes | None], ...]:
    """A receipt's headers: its delete's own trace context as parent (none when it had none)."""
    tp = traces.get(event_id) if traces else None
    if tp is None:
        return ()
    return tracing.headers_with(tracing.span_header("ledger.receipt", [tp], {"unlearn.event_id": event_id}))


class Outputs:
    """The worker's producer and the rules of what it sends (module docstring)."""

    def __init__(self, settings: Settings, producer: Any, store: ChangelogStore,
                 stats: dict[str, int] | None = None) -> None:
        self.settings = settings
        self.stats = stats if stats is not None else {}  # counts its dead letters (the worker's metrics)
        self.producer = producer
        self.store = store  # names each partition's current heads topic and counts its bytes
        self.deltas_topic = settings.topic("deltas")
        self.receipts_topic = settings.topic("receipts")
        self.deadletter_topic = settings.topic("deadletter")
        self.publish_posterior = LedgerSettings.of(settings).publish_posterior
        self.sparse_weights = LedgerSettings.of(settings).head_sparse_weights
        self.redact_inputs = ErasureSettings.of(settings).deadletter_inputs == "redact"
        self.delivery_errors: list[str] = []
        self.retry = RetryPolicy.of(settings)

    # ---------------------------------------------------------------- delivery
    def produce(self, topic: str, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes | None]] = ()) -> None:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                self.delivery_errors.append(f"{topic}: {err}")

        send: dict[str, Any] = {"topic": topic, "key": key, "value": value, "on_delivery": on_delivery}
        if headers:
            send["headers"] = list(headers)
        produce(self.producer, **send)

    def serve(self) -> None:
        """Serve delivery reports; DeliveryError if one failed."""
        self.producer.poll(0)
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self.delivery_errors:
            raise DeliveryError(f"output delivery failed: {self.delivery_errors[:3]}")

    def flush(self, why: str) -> None:
        """Wait until every output produced so far is durable (DeliveryError before ``why`` if not).
        While the broker restarts the outputs wait in the client's queue and the client retries
        them; only ``UNLEARN_BROKER_RETRY_SECONDS`` without delivery stops the worker
        (BrokerUnavailable), as does a failed delivery report (the client gave up on a message)."""
        flush_within(self.producer, self.retry, f"delivering outputs before the {why}")
        self.raise_if_failed()

    # ---------------------------------------------------------------- head updates
    def publish_head(self, part: int, head: HeadRuntime, mode: HeadMode | None = None,
                     traces: Sequence[bytes] = ()) -> bool:
        """Produce the head's update to ``part``'s heads topic; False if it cannot fit in a message
        even without the posterior (``publish_update``)."""
        update = head_update(head, mode, posterior=self.publish_posterior)
        return self.publish_update(part, update, self.encode_update(update), traces)

    def encode_update(self, update: HeadUpdate) -> bytes:
        """``update``'s bytes, without its posterior when they would not fit in a message (a
        thread may call this: it reads only the update and the settings)."""
        value = encode_head(update, self.sparse_weights)
        limit = self.settings.max_message_bytes
        if len(value) > limit and update.posterior is not None:
            value = encode_head(replace(update, posterior=None), self.sparse_weights)
            log.warning("head %r version %d: published without its posterior (%d bytes over the limit)",
                        update.head_id, update.version, len(value) - limit)
        return value

    def publish_update(self, part: int, update: HeadUpdate, value: bytes, traces: Sequence[bytes] = ()) -> bool:
        """Produce ``update`` encoded as ``value`` (``encode_update``) to ``part``'s heads topic;
        False if it is still over the message limit. Then the state stays exact and a dead letter
        says why: a head too large to publish must not stop the worker (and every head on its
        partition) in a crash loop."""
        limit = self.settings.max_message_bytes
        if len(value) > limit:
            detail = (f"head {update.head_id!r} version {update.version} (d={update.d}, c={update.c}) "
                      f"encodes to {len(value)} bytes, over UNLEARN_MAX_MESSAGE_BYTES={limit}: not published")
            self.deadletter(DeadLetter(b"", "head_too_large", detail, STAGE, self.store.heads_topic(part), None,
                                       None, update.head_id.encode(), None, time.time()))
            return False
        key = update.head_id.encode()
        headers = tracing.headers_with(tracing.span_header("ledger.head_update", traces, {
            "unlearn.head_id": update.head_id, "unlearn.version": update.version})) if traces else ()
        self.produce(self.store.heads_topic(part), key, value, headers)
        self.store.count_head_bytes(part, len(key) + len(value))
        self.stats["head_updates"] = self.stats.get("head_updates", 0) + 1
        return True

    def publish_poll(self, poll: PollOutputs) -> None:
        """Per head touched in the poll, those with deletes first (``PollOutputs.publish_order``):
        the fast head catches up once, one head update (the last version), then the receipt of
        every applied delete. A receipt names the version of the message that applied it and
        that version's retained-rows hash, never the published version: those depend on poll
        boundaries, so replays would issue conflicting receipts."""
        for head_id, (part, head) in poll.publish_order():
            head.sync()
            self.publish_head(part, head, traces=poll.head_traces(head_id))
            now = time.time()
            for outcome in poll.outcomes[head_id]:
                for d in outcome.deletes:
                    r = Receipt.applied(d.event_id, d.subject_id, head_id, d.sample_ids, outcome.version, None, now,
                                        retained_hash=outcome.retained_hash)
                    self.produce(self.receipts_topic, d.subject_id.encode(), encode_receipt(r),
                                 receipt_headers(d.event_id, poll.events))

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
                   detail: str, traces: Mapping[str, bytes] | None = None) -> None:
        """Every entry of ``delta`` refused for one ``reason``."""
        original = self.dead_original(raw)
        for i, e in enumerate(delta.entries):
            rej = Rejection(i, e.sign, reason, detail, e.event_ids, e.sample_ids, e.subject_ids)
            self.rejected(delta.head_id, rej, original, part, offset, key, traces)

    def rejected(self, head_id: str, rej: Rejection, original: bytes, part: int, offset: int,
                 key: bytes | None, traces: Mapping[str, bytes] | None = None) -> None:
        """One refused entry: a dead letter, and a rejected receipt per delete event in it (with the
        delete's trace context, ``traces``: event id -> traceparent)."""
        first_event = rej.event_ids[0] if rej.event_ids else None
        kind = "add" if rej.sign > 0 else "delete"
        detail = f"entry {rej.entry_index} ({kind}, {len(rej.event_ids)} rows): {rej.detail}"
        self.deadletter(DeadLetter(original, rej.reason, detail, STAGE, self.deltas_topic, part, offset, key,
                                   first_event, time.time()))
        if rej.sign < 0:
            for d in group_by_event(rej.event_ids, rej.sample_ids, rej.subject_ids):
                r = Receipt.rejected(d.event_id, d.subject_id, head_id, d.sample_ids, rej.reason, time.time())
                self.produce(self.receipts_topic, d.subject_id.encode(), encode_receipt(r),
                             receipt_headers(d.event_id, traces))

    def deadletter(self, rec: DeadLetter) -> None:
        log.warning("deadletter %s: %r", rec.reason, rec.detail)
        self.stats["deadletters"] = self.stats.get("deadletters", 0) + 1
        value = encode_deadletter_bounded(rec, self.settings.max_message_bytes)
        self.produce(self.deadletter_topic, rec.key or b"", value)
