"""The featurizer's data types: what goes into a batch, what the cache looks like to the core,
and what comes out (no I/O, no decisions: those are in core.py; reason codes: reasons.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol

import numpy as np

from unlearn.features.backbones import BackboneError, EncodeResult
from unlearn.features.contract import (
    quantizer,
)
from unlearn.infra.between_stages import routed_topic_name
from unlearn.infra.settings import ErasureSettings, HeadSettings, Settings
from unlearn.schemas.deadletter import DeadLetter, encode_deadletter_bounded
from unlearn.schemas.delta_codec import Delta, encode_delta
from unlearn.schemas.envelope import source_stream
from unlearn.schemas.head import HeadContract, encode_contract
from unlearn.schemas.receipts import Receipt, encode_receipt
from unlearn.streams.featurizer.settings import FeaturizerSettings
from unlearn.streams.featurizer.tombstones import Tombstone, TombstoneKey, TombstonePolicy

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
    event_us: int = 0  # the add's event time (tombstones.py; 0: dated before every tombstone)

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
    drop_tombstones: tuple[TombstoneKey, ...] = ()  # expired (tombstones.TombstonePolicy.retention)

    @property
    def empty(self) -> bool:
        return not (self.put_samples or self.drop_samples or self.put_heads or self.put_tombstones
                    or self.drop_tombstones)


@dataclass(frozen=True, slots=True)
class OutMessage:
    """A message to produce (an outbox row before it has a sequence number)."""

    topic: str
    key: bytes | None
    value: bytes | None  # None only for a changelog tombstone
    partition: int | None = None  # None: the producer's partitioner (by key); set for changelog records
    phase: int = 1  # delivery phase: every message of phase 0 is acknowledged before phase 1 is sent


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
        """Remove wins' clock bounds (tombstones.py)."""
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

    def reasons(self) -> dict[str, int]:
        """Dead-letter reason -> count (for logs and tests)."""
        out: dict[str, int] = {}
        for d in self.deadletters:
            out[d.reason] = out.get(d.reason, 0) + 1
        return out

    def messages(self, config: CoreConfig) -> list[OutMessage]:
        """Encoded messages, in produce order: auto contracts (when ``config.registry_topic``),
        deltas, dead letters, receipts."""
        out = [OutMessage(config.registry_topic, c.head_id.encode(), encode_contract(c))
               for c in self.contracts if config.registry_topic]
        out += [OutMessage(config.deltas_topic, d.head_id.encode(), encode_delta(d)) for d in self.deltas]
        out += [
            OutMessage(config.deadletter_topic, d.key if d.key is not None else STAGE.encode(),
                       encode_deadletter_bounded(d, config.max_message_bytes))
            for d in self.deadletters
        ]
        out += [OutMessage(config.receipts_topic, r.subject_id.encode(), encode_receipt(r)) for r in self.receipts]
        return out


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
