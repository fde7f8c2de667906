"""A batch's records in and out: the by-head records the featurizer consumes (:class:`InMessage`,
with the :class:`Origin` the router gave them), what one batch decided (:class:`BatchOutcome`), and
the messages that carries to Kafka (:class:`OutMessage`: auto contracts, deltas, dead letters,
receipts, each with its requests' trace context).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unlearn.infra import tracing
from unlearn.schemas.deadletter import DeadLetter, encode_deadletter_bounded
from unlearn.schemas.delta_codec import Delta, encode_delta
from unlearn.schemas.head_contract import HeadContract, encode_contract
from unlearn.schemas.receipts import Receipt, encode_receipt
from unlearn.streams.featurizer.cache_view import CacheMutations
from unlearn.streams.featurizer.core_config import CoreConfig

__all__ = [
    "STAGE",
    "Origin",
    "InMessage",
    "OutMessage",
    "BatchOutcome",
]


STAGE = "featurizer"
"""``stage`` of every dead letter this service writes."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a routed record was produced: its ``requests`` partition and offset, and ``previous``,
    the origin offset of the record the router forwarded before it from the same requests
    partition to the same by-head partition in the same router session (None: the first of
    the session). The featurizer uses it to drop re-forwarded copies (``admit_routed``)."""

    partition: int
    offset: int
    previous: int | None = None


@dataclass(frozen=True, slots=True)
class InMessage:
    """One consumed record of the by-head topic (``partition``/``offset`` are its place there)
    with the request it carries and the place in ``requests`` it was routed from (``origin``;
    None for a record nobody routed: then the record is its own origin), and its headers (the
    producer's, forwarded by the router: signed requests carry their signature there)."""

    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    origin: Origin | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None  # the record's timestamp (the producer's, forwarded); None: not available


@dataclass(frozen=True, slots=True)
class OutMessage:
    """A message to produce (an outbox row before it has a sequence number)."""

    topic: str
    key: bytes | None
    value: bytes | None  # None only for a changelog tombstone
    partition: int | None = None  # None: the producer's partitioner (by key); set for changelog records
    phase: int = 1  # delivery phase: every message of phase 0 is acknowledged before phase 1 is sent
    headers: tuple[tuple[str, bytes | None], ...] = ()  # Kafka headers (trace context: infra/tracing.py)


@dataclass
class BatchOutcome:
    """What one micro-batch of one partition decided."""

    partition: int
    last_offset: int
    deltas: list[Delta]
    deadletters: list[DeadLetter]
    receipts: list[Receipt]
    mutations: CacheMutations
    accepted: int = 0  # events that became rows
    rows: int = 0  # rows over all deltas (a delete_subject may give many)
    origin_offsets: dict[int, int] = field(default_factory=dict)  # requests partition -> last origin offset judged
    reforwarded: int = 0  # records dropped as copies the router forwarded again (routing.admit_routed)
    gaps: int = 0  # records dropped because a predecessor's delivery failed (forwarded again later)
    contracts: list[HeadContract] = field(default_factory=list)  # auto contracts of heads this batch created
    traces: dict[str, bytes] = field(default_factory=dict)  # event id -> its request's valid traceparent

    def reasons(self) -> dict[str, int]:
        """Dead-letter reason -> count (for logs and tests)."""
        out: dict[str, int] = {}
        for d in self.deadletters:
            out[d.reason] = out.get(d.reason, 0) + 1
        return out

    def messages(self, config: CoreConfig) -> list[OutMessage]:
        """Encoded messages, in produce order: auto contracts (when ``config.registry_topic``),
        deltas, dead letters, receipts; each carries its requests' trace context (``traces``,
        infra/tracing.py) as headers."""
        out = [OutMessage(config.registry_topic, c.head_id.encode(), encode_contract(c))
               for c in self.contracts if config.registry_topic]
        out += [OutMessage(config.deltas_topic, d.head_id.encode(), encode_delta(d), headers=self._delta_headers(d))
                for d in self.deltas]
        out += [
            OutMessage(config.deadletter_topic, d.key if d.key is not None else STAGE.encode(),
                       encode_deadletter_bounded(d, config.max_message_bytes),
                       headers=self._event_headers("featurizer.deadletter", d.event_id))
            for d in self.deadletters
        ]
        out += [OutMessage(config.receipts_topic, r.subject_id.encode(), encode_receipt(r),
                           headers=self._event_headers("featurizer.receipt", r.event_id)) for r in self.receipts]
        return out

    def _event_headers(self, span: str, event_id: str | None) -> tuple[tuple[str, bytes | None], ...]:
        """One event's output: its request's context as parent (nothing when it had none)."""
        tp = self.traces.get(event_id) if self.traces and event_id is not None else None
        if tp is None:
            return ()
        return tracing.headers_with(tracing.span_header(span, [tp], {"unlearn.event_id": event_id}))

    def _delta_headers(self, d: Delta) -> tuple[tuple[str, bytes | None], ...]:
        """A delta: the first traced delete's context as parent (else the first traced add's), the
        others linked, and every covered traced event named (infra/tracing.py)."""
        if not self.traces:
            return ()
        named = [(e, self.traces[e]) for entry in sorted(d.entries, key=lambda x: getattr(x, "sign", 1))
                 for e in entry.event_ids if e in self.traces]
        if not named:
            return ()
        tp = tracing.span_header("featurizer.delta", [t for _, t in named], {"unlearn.head_id": d.head_id})
        return tracing.headers_with(tp, ((tracing.EVENTS_HEADER, tracing.encode_events(named)),))
