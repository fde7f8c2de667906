"""The featurizer's data types and its routing of requests by head, without I/O but for
:class:`Router`'s forwarding.

**Data types**: what goes into a batch, what the cache looks like to the core (:class:`CacheView`)
and what comes out (:class:`BatchOutcome`); no decisions: those are in ``core.py`` (reason codes:
``reasons.py``).

**Routing** (the ``<requests>.by-head`` repartition topic; docs/featurizer.md, "Routing"). The
feature cache is per partition, so every request that must be judged against another one has to
meet it in one partition: a delete its add (and the subject that added the sample), a
delete_subject every sample of its subject, an add any earlier add of the same sample id and the
head's first add (which fixes its backbone, dimension and grids). Producers cannot be trusted to
put them there: Java's default partitioner (murmur2) and librdkafka's (crc32) disagree, keys may
differ from the subject or be absent, and partitions may be chosen explicitly. So the featurizer
process first *routes*: every ``requests`` record is forwarded, value, key, headers and timestamp
unchanged, to the by-head topic at the partition its head id hashes to, a hash this project owns
(``infra.between_stages.head_partition``), which the ledger and the SDK use too. The featurizer
stage reads only the by-head topic, so everything it decides about a head is decided in one
place, whatever partitions the producers chose. (By subject would not do: a delete naming another
subject than the one that added the sample would land where the sample is not, and a sample id
added by two subjects would be cached twice.)

Each forwarded record carries headers naming its origin (:data:`ORIGIN_HEADER`,
``"<stream>/<partition>@<offset>"`` of the record in ``requests``) and :data:`PREVIOUS_HEADER`,
the origin offset of the record this router session forwarded before it from the same requests
partition to the same by-head partition. The router is at-least-once (it commits its offsets
after delivery), so after a crash it forwards some records again; the featurizer drops the
copies exactly with ``core.admit_routed``. :class:`Router` forwards a batch's records through the
featurizer's producer (``delivery.Delivery``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import orjson

from unlearn.features.backbones import BackboneError, EncodeResult
from unlearn.features.contract import quantizer
from unlearn.infra import tracing
from unlearn.infra.between_stages import head_partition, routed_topic_name
from unlearn.infra.settings import ErasureSettings, HeadSettings, Settings
from unlearn.schemas.deadletter import DeadLetter, encode_deadletter_bounded
from unlearn.schemas.delta_codec import Delta, encode_delta
from unlearn.schemas.envelope import ID_CHARS, ID_MAX_CHARS, is_valid_id
from unlearn.schemas.head_contract import HeadContract, encode_contract
from unlearn.schemas.receipts import Receipt, encode_receipt
from unlearn.schemas.source_id import format_source_id, parse_source, source_stream
from unlearn.streams.featurizer.settings import FeaturizerSettings

if TYPE_CHECKING:  # core.py, which holds the remove-wins rule, imports this module
    from unlearn.streams.featurizer.core import Tombstone, TombstoneKey, TombstonePolicy
    from unlearn.streams.featurizer.events import EventKey, EventMark

__all__ = [
    "ORIGIN_HEADER",
    "PREVIOUS_HEADER",
    "Headers",
    "Router",
    "RouterSession",
    "might_delete",
    "read_origin",
    "route_partition",
    "routing_head",
    "KeyStoreError",
]

STAGE = "featurizer"
"""``stage`` of every dead letter this service writes."""

_DELETE_OPS = ("delete", "delete_subject")


# --------------------------------------------------------------------------- data types
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
class HeadInfo:
    """What the featurizer fixes per head at its first accepted add."""

    head_id: str
    backbone: str  # backbone cache key, e.g. "features", "minilm", "efficientnet-lite0@112px"
    input_kind: str  # features | text | image
    dim: int
    label_kind: Literal["class", "vector"]
    label_width: int  # c of vector labels; 0 for class indices
    frac_bits: int
    label_frac_bits: int


@dataclass(frozen=True, slots=True, eq=False)
class CachedSample:
    """A cached added sample: the exact q (and label) its delete must reuse."""

    head_id: str
    sample_id: str
    subject_id: str
    client_id: str
    event_id: str  # the add's event id
    label: int | np.ndarray  # class index, or int64 quantized target vector (c,)
    q: np.ndarray  # int64 (d,)
    event_us: int = 0  # the add's event time (core.py, remove wins; 0: dated before every tombstone)

    @property
    def label_kind(self) -> str:
        return "class" if isinstance(self.label, int) else "vector"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CachedSample):
            return NotImplemented
        same_label = (
            self.label == other.label
            if isinstance(self.label, int) and isinstance(other.label, int)
            else (not isinstance(self.label, int) and not isinstance(other.label, int)
                  and np.array_equal(self.label, other.label))
        )
        return (
            (self.head_id, self.sample_id, self.subject_id, self.client_id, self.event_id, self.event_us)
            == (other.head_id, other.sample_id, other.subject_id, other.client_id, other.event_id, other.event_us)
            and same_label
            and np.array_equal(self.q, other.q)
        )

    __hash__ = None  # type: ignore[assignment]


class CacheView(Protocol):
    """Read side of the feature cache (``FeatureCache`` implements it)."""

    def get_sample(self, head_id: str, sample_id: str) -> CachedSample | None: ...

    def subject_samples(self, head_id: str, subject_id: str) -> list[CachedSample]: ...

    def get_head(self, head_id: str) -> HeadInfo | None: ...

    def tombstones(self, head_id: str, kind: str, id_: str, subject_id: str) -> list[Tombstone]: ...


@dataclass(frozen=True)
class CacheMutations:
    """Net effect of a batch on the cache (apply all in one transaction)."""

    put_samples: tuple[CachedSample, ...] = ()
    drop_samples: tuple[tuple[str, str], ...] = ()  # (head_id, sample_id)
    put_heads: tuple[HeadInfo, ...] = ()
    put_tombstones: tuple[Tombstone, ...] = ()
    drop_tombstones: tuple[TombstoneKey, ...] = ()  # expired (core.TombstonePolicy.retention)
    put_events: tuple[EventMark, ...] = ()  # event-id marks (events.py)
    drop_events: tuple[EventKey, ...] = ()  # expired marks

    @property
    def empty(self) -> bool:
        return not (self.put_samples or self.drop_samples or self.put_heads or self.put_tombstones
                    or self.drop_tombstones or self.put_events or self.drop_events)


@dataclass(frozen=True, slots=True)
class OutMessage:
    """A message to produce (an outbox row before it has a sequence number)."""

    topic: str
    key: bytes | None
    value: bytes | None  # None only for a changelog tombstone
    partition: int | None = None  # None: the producer's partitioner (by key); set for changelog records
    phase: int = 1  # delivery phase: every message of phase 0 is acknowledged before phase 1 is sent
    headers: tuple[tuple[str, bytes | None], ...] = ()  # Kafka headers (trace context: infra/tracing.py)


Encoder = Callable[[str, Sequence[Any]], EncodeResult]
"""``encoder(backbone_name, items) -> EncodeResult`` (per-item errors, like
``Backbone.encode_checked``); raises ``BackboneError`` with ``index=None`` when the backbone
cannot be loaded. Only text and image inputs reach it: feature vectors are passed through here
in float64."""


class RegistryEncoder:
    """The production encoder: ``features.backbones.get_backbone(name, device)``, cached."""

    def __init__(self, device: str = "auto") -> None:
        self.device = device
        self._announced: set[str] = set()

    def __call__(self, name: str, items: Sequence[Any]) -> EncodeResult:
        from unlearn.features.backbones import get_backbone

        try:
            backbone = get_backbone(name, self.device)
        except BackboneError:
            raise
        except (ImportError, OSError, RuntimeError) as exc:  # package/weights missing, bad device
            raise BackboneError(f"cannot load backbone {name!r}: {type(exc).__name__}: {exc}") from exc
        if name not in self._announced:  # "auto" resolves per machine: say where the model runs
            self._announced.add(name)
            logging.getLogger(__name__).info("backbone %s loaded on %s", backbone.cache_key, backbone.device)
        return backbone.encode_checked(items)


@dataclass(frozen=True)
class CoreConfig:
    """Everything ``featurize_batch`` needs besides the data (built from Settings by the shell)."""

    requests_topic: str
    deltas_topic: str
    deadletter_topic: str
    receipts_topic: str
    stream: str = "requests"
    routed_topic: str = ""  # the by-head topic read; "" = requests_topic itself (no routing)
    federated: bool = False
    client_id: str | None = None
    contracts: Mapping[str, HeadContract] = field(default_factory=dict)  # declared heads (the registry, per batch)
    registry_topic: str = ""  # where auto contracts are published; "" = not published
    head_backbones: Mapping[str, str] = field(default_factory=dict)  # this batch's: the settings', then contracts'
    heads: HeadSettings = field(default_factory=HeadSettings)  # a new head's contract defaults
    featurizer: FeaturizerSettings = field(default_factory=FeaturizerSettings)  # admission: sealing, remove wins
    max_message_bytes: int = 100_000_000  # UNLEARN_MAX_MESSAGE_BYTES
    redact_deadletter_inputs: bool = True  # UNLEARN_DEADLETTER_INPUTS=redact (schemas/redaction.py)

    def __post_init__(self) -> None:
        if self.federated and not self.client_id:
            raise ValueError("federated mode needs a client_id (the data owner this site serves)")
        quantizer(self.heads.frac_bits, self.heads.feature_bound)  # raises on an impossible grid

    @cached_property
    def tombstones(self) -> TombstonePolicy:
        """Remove wins' clock bounds (``core.TombstonePolicy``)."""
        from unlearn.streams.featurizer.core import TombstonePolicy  # core imports this module

        return TombstonePolicy(self.featurizer.max_clock_skew_seconds, self.featurizer.tombstone_retention_seconds)

    @property
    def input_topic(self) -> str:
        """The topic this featurizer consumes: the by-head topic, or ``requests_topic``."""
        return self.routed_topic or self.requests_topic

    @classmethod
    def from_settings(cls, settings: Settings, *, requests_topic: str | None = None, federated: bool = False,
                      client_id: str | None = None) -> CoreConfig:
        """From the settings (``requests_topic`` default: ``<prefix>requests``); the featurizer
        reads ``routed_topic_name(requests_topic)`` and names its source ids after it."""
        topic = requests_topic or settings.topic("requests")
        routed = routed_topic_name(topic)
        return cls(
            requests_topic=topic,
            deltas_topic=settings.topic("deltas"),
            deadletter_topic=settings.topic("deadletter"),
            receipts_topic=settings.topic("receipts"),
            stream=source_stream(routed, settings.topic_prefix, client_id if federated else None),
            routed_topic=routed,
            head_backbones=HeadSettings.of(settings).backbone_overrides(),
            federated=federated,
            client_id=client_id if federated else None,
            max_message_bytes=settings.max_message_bytes,
            registry_topic=settings.topic("head-registry"),
            heads=HeadSettings.of(settings),
            featurizer=FeaturizerSettings.of(settings),
            redact_deadletter_inputs=ErasureSettings.of(settings).deadletter_inputs == "redact",
        )


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
    reforwarded: int = 0  # records dropped as copies the router forwarded again (core.admit_routed)
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


# --------------------------------------------------------------------------- service types
@dataclass(frozen=True)
class Topics:
    """The topics one featurizer follows, and what it read about them at start (ids and
    partition counts: 0 and "" until then)."""

    requests: str  # what producers write
    by_head: str  # what the caches follow (``<requests>.by-head``)
    changelog: str | None  # ``featurizer-cache``; None: the cache has no changelog (federated, own requests topic)
    origin_stream: str  # the stream in origin headers: the requests topic without the prefix
    requests_id: str = ""
    by_head_id: str = ""
    by_head_partitions: int = 0  # what heads are routed by
    requests_partitions: int = 0  # what transit keys are followed by


FaultHook = Callable[[str], None]
"""Test hook, called at "after_route" (forwarded records acknowledged, after the batch's by-head
records were featurized, requests offsets not committed), "after_cache_commit", "after_changelog"
(phase 0 acknowledged, nothing else sent), "after_produce" (phase 1 acknowledged: awaited before
the next batch's sqlite commit, or when idle), "after_outbox_ack" and "after_offset_commit";
raising there simulates a crash at that point."""

ReadyHook = Callable[[], object]
"""Called once, after the first partition assignment is in place (caches opened, seeks done)."""


class FeaturizerError(RuntimeError):
    """The featurizer cannot go on (the process should exit non-zero and be restarted)."""


class DeliveryError(FeaturizerError):
    """The broker did not acknowledge every outbox message (they stay in the outbox)."""


class KeyStoreError(RuntimeError):
    """A key could not be made durable (the batch must not be committed)."""


class LostCacheError(FeaturizerError):
    """A partition's cache (local and changelog) is empty but the group already committed offsets
    for it."""


def count_batch(stats: dict[str, int], p: int, msgs: Sequence[InMessage], outcome: BatchOutcome) -> None:
    """Add a batch's outcome to the service's ``stats``; log its dead letters and dropped copies."""
    log = logging.getLogger("unlearn.featurizer")
    skipped = outcome.reforwarded + outcome.gaps
    stats["events"] += len(msgs) - skipped
    stats["reforwarded"] += outcome.reforwarded
    stats["gaps"] += outcome.gaps
    stats["accepted"] += outcome.accepted
    stats["rows"] += outcome.rows
    stats["deltas"] += len(outcome.deltas)
    stats["deadletters"] += len(outcome.deadletters)
    stats["receipts"] += len(outcome.receipts)
    if outcome.deadletters:
        log.info("partition %d offsets %d..%d: dead letters %s", p, msgs[0].offset, outcome.last_offset,
                 outcome.reasons())
    if skipped:
        log.warning("partition %d offsets %d..%d: dropped %d re-forwarded cop%s and %d record(s) after a failed "
                    "forward (forwarded again)", p, msgs[0].offset, outcome.last_offset, outcome.reforwarded,
                    "y" if outcome.reforwarded == 1 else "ies", outcome.gaps)


if TYPE_CHECKING:
    from unlearn.streams.featurizer.delivery import Acks, Delivery

ORIGIN_HEADER = "unlearn.origin"
"""Header of a routed record: ``"<stream>/<partition>@<offset>"``, its place in ``requests``."""
PREVIOUS_HEADER = "unlearn.origin-previous"
"""Header of a routed record: the origin offset (decimal) of the record forwarded before it from
the same requests partition to the same by-head partition in this router session; absent for
the session's first."""

Headers = list[tuple[str, bytes | None]]


_WS = rb"[ \t\n\r]*"
_PREFIX = re.compile(  # "{" and members with scalar values, up to the head_id key
    _WS + rb"\{" + _WS + rb'(?:"[^"\\]*"' + _WS + rb":" + _WS
    + rb'(?:"[^"\\]*"|-?[0-9][0-9eE.+-]*|true|false|null)' + _WS + rb"," + _WS + rb")*")
_HEAD_VALUE = re.compile(_WS + rb':' + _WS + rb'"([' + ID_CHARS.encode() + rb"]{1," + str(ID_MAX_CHARS).encode()
                         + rb'})"' + _WS + rb"[,}]")
_HEAD_KEY = b'"head_id"'
_FAST_SCAN_BYTES = 1024
"""How far into a request the cheap head lookup looks (the SDK writes ``head_id`` fourth)."""


def _head_fast(value: bytes) -> str | None:
    """The head id without parsing the whole request, when that is certain: it is a member of
    the top-level object preceded only by members with scalar values, and neither a backslash
    (an escaped spelling of the key) nor a second ``"head_id"`` occurs anywhere. For any JSON
    document this is the head :func:`routing_head`'s full parse finds; None: not certain."""
    at = value.find(_HEAD_KEY, 0, _FAST_SCAN_BYTES)
    if at < 0 or _PREFIX.fullmatch(value, 0, at) is None:
        return None
    m = _HEAD_VALUE.match(value, at + len(_HEAD_KEY))
    if m is None or b"\\" in value or value.find(_HEAD_KEY, at + 1) >= 0:
        return None
    return m.group(1).decode("ascii")


def routing_head(value: bytes | None) -> str | None:
    """The head id a request names, if it names a usable one (an id string in a JSON object),
    else None. Only the head is read: validating the request is the featurizer's job, and it
    dead-letters what is invalid with the reason. Cheap for what producers send (the head id
    before the input: :func:`_head_fast`, no parse of the features); anything else is parsed in
    full. The one difference from a full parse: a record that is not valid JSON after such a
    head id is routed by it (and dead-lettered there, ``not_json``) instead of by its origin."""
    if value is None:
        return None
    if (fast := _head_fast(value)) is not None:
        return fast
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    head = d.get("head_id") if type(d) is dict else None
    return head if is_valid_id(head) else None


def might_delete(value: bytes | None) -> bool:
    """A cheap hint that a record is a delete or delete_subject: its bytes hold ``"delete``
    (the start of either op's JSON string). Only the batch window uses it (a delete closes it
    early, docs/featurizer.md, "The batch window"); a wrong answer costs a smaller batch or a
    longer wait, never a decision, so no parse (an add is ~100 us of JSON)."""
    return value is not None and b'"delete' in value


def route_partition(value: bytes | None, origin_partition: int, partitions: int) -> int:
    """Where a request goes: its head's partition; a record with no readable head (bad JSON, no
    head id) goes to ``origin_partition`` modulo the count, so that it still reaches the
    featurizer's dead-letter path, in order with its neighbours."""
    head = routing_head(value)
    if head is None:
        return origin_partition % partitions
    return head_partition(head, partitions)


def read_origin(headers: Sequence[tuple[str, bytes | None]] | None, stream: str) -> Origin | None:
    """The origin a routed record's headers name (the last header of each name wins), or None if
    they name none, or one of another stream (then the record is its own origin)."""
    origin = previous = None
    for name, value in headers or ():
        if name == ORIGIN_HEADER:
            origin = value
        elif name == PREVIOUS_HEADER:
            previous = value
    try:
        parsed = parse_source(origin.decode()) if origin is not None else None
        prev = int(previous) if previous is not None else None
    except (UnicodeDecodeError, ValueError):
        return None
    if parsed is None or parsed[0] != stream or (prev is not None and not -1 < prev < parsed[2]):
        return None
    return Origin(parsed[1], parsed[2], prev)


class RouterSession:
    """What one router session forwarded: per (requests partition, by-head partition), the last
    origin offset, which becomes the next record's :data:`PREVIOUS_HEADER`.

    A session of a requests partition starts when it is assigned (:meth:`reset`): the router
    then resumes at the committed offset and knows nothing earlier.
    """

    def __init__(self, stream: str, partitions: int) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        self.stream = stream
        self.partitions = partitions
        self._last: dict[tuple[int, int], int] = {}

    def reset(self, origin_partition: int) -> None:
        """A new session for ``origin_partition`` (assigned, or assigned again)."""
        self._last = {k: v for k, v in self._last.items() if k[0] != origin_partition}

    def route(self, value: bytes | None, origin_partition: int, origin_offset: int,
              headers: Sequence[tuple[str, bytes | None]] | None = None) -> tuple[int, Headers]:
        """(by-head partition, headers) for one requests record, forwarded in offset order. The
        record's own headers are kept, except any that claim to be ours (an upstream app cannot
        forge an origin)."""
        target = route_partition(value, origin_partition, self.partitions)
        out: Headers = [(k, v) for k, v in headers or () if k not in (ORIGIN_HEADER, PREVIOUS_HEADER)]
        out.append((ORIGIN_HEADER, format_source_id(origin_partition, origin_offset, self.stream).encode()))
        previous = self._last.get((origin_partition, target))
        if previous is not None:
            out.append((PREVIOUS_HEADER, str(previous).encode()))
        self._last[(origin_partition, target)] = origin_offset
        return target, out


class Router:
    """The featurizer's router: forwards ``requests`` records to their heads' by-head partitions
    (value, key, headers and timestamp kept, origin headers added) through ``delivery``."""

    def __init__(self, origin_stream: str, by_head_topic: str, partitions: int, delivery: Delivery) -> None:
        self.session = RouterSession(origin_stream, partitions)
        self.by_head_topic = by_head_topic
        self.delivery = delivery

    def reset(self, origin_partition: int) -> None:
        """``origin_partition`` was assigned: a new router session for it."""
        self.session.reset(origin_partition)

    def forward(self, records: Sequence[Any]) -> tuple[dict[int, int], Acks | None]:
        """Forward consumed requests records in offset order; return requests partition -> last
        offset forwarded, and the forwards' acks to await before committing it (DeliveryError:
        the next session forwards them again)."""
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

        if not records:
            return {}, None
        sends: list[dict[str, Any]] = []
        last: dict[int, int] = {}
        for m in sorted(records, key=lambda r: (r.partition(), r.offset())):
            p, off = m.partition(), m.offset()
            target, headers = self.session.route(m.value(), p, off, m.headers())
            kind, ts = m.timestamp()
            send = {"topic": self.by_head_topic, "value": m.value(), "key": m.key(), "partition": target,
                    "headers": headers}
            if kind != TIMESTAMP_NOT_AVAILABLE and ts > 0:
                send["timestamp"] = ts
            sends.append(send)
            last[p] = off
        return last, self.delivery.send(sends)
