"""The featurizer's decisions, without I/O: one micro-batch of requests in, deltas out.

``featurize_batch`` takes the records of ONE partition of the by-head topic (ascending offsets;
each carries a request and the place in ``requests`` it was routed from), a read-only view of
that partition's feature cache, the last origin offset judged per requests partition, and an
encoder (the frozen backbones), and returns a :class:`BatchOutcome`:

- one exact :class:`~schemas.delta_codec.Delta` per head touched (entries: adds with class
  labels, adds with vector labels, deletes with class labels, deletes with vector labels;
  ROWS, or PACKED ledgers in federated mode),
- dead letters (with reason codes, see :data:`FEATURIZER_REASONS`) and rejected receipts for
  deletes the featurizer refuses,
- the cache mutations (net effect of the batch), the last input offset covered and the new last
  origin offsets (re-forwarded copies of records already judged are dropped first:
  :func:`admit_routed`).

Nothing here touches Kafka or sqlite; ``batch.py`` applies the outcome through the cache's
transactional outbox (``cache.py``; docs/featurizer.md). Events are judged sequentially against
an in-memory overlay of the cache, so "add x, delete x" in one batch works and a duplicate add
within a batch is caught. Exact integer sums commute, so grouping the rows by (sign, label kind)
gives the same ledger as the event order.

The steps, each a function of its own: :func:`check_batch`, :func:`admit_routed`,
:func:`parse_batch`, :func:`open_sealed`, :func:`encode_adds` (:func:`route_adds`,
:func:`encode_group`), :func:`judge_batch` (:func:`judge_add`, :func:`judge_delete`,
:func:`judge_delete_subject`, :func:`refusal`) and :func:`assemble_deltas`. How a feature vector
or label becomes integers, which backbone an input goes through and what dimension it fixes is
the feature contract (:mod:`features.contract`), shared with serving.

**The batch's view of the cache**: one lookup per batch, not one per event. Judging asks the
cache, per add and per delete, for the (head, sample) it names and, per add, for the head's
first-add facts; against sqlite that is two queries per event. The cache does not change while a
batch is judged (the mutations are committed afterwards), so fetching every sample the batch
names in one query, and each head once, gives the same answers: :class:`BatchView` does that in
front of any :class:`~streams.featurizer.model.CacheView`, and uses ``get_samples`` (one query)
when the cache has it (:class:`BulkCacheView`, e.g. ``FeatureCache``). :class:`Overlay` is the
other half: the batch's own effect, laid over that view while its events are judged one after
another.

**Head contracts** (docs/registry.md): which contract an add is judged against, and the checks.
A declared contract (``unlearn heads create``, read from the head registry) wins: the first add
of a head takes its grid from it, and every add must match its backbone, input kind, dimension
and label space. An add to an undeclared head gets, when ``UNLEARN_AUTO_CREATE_HEADS`` is on (the
default), the **auto contract** (:func:`auto_contract`): the head's first-add facts with
``UNLEARN_DEFAULT_CLASSES`` classes (or the first add's vector width) and the settings'
preprocessing and gamma. It is a pure function of those facts and the settings, so it is the same
before and after the featurizer publishes it to the registry (with the head's first delta,
through the outbox). Either way no single add can size a head beyond its contract (the ledger
still sizes columns as the largest class seen plus one, now bounded by the contract).

**Refusals**: the dead letter (and, for a delete, the rejected receipt) of a refused request
(:func:`refusal`). A dead letter names the request's place in ``requests`` and keeps its bytes as
sent, except a plaintext raw input, which is taken out unless ``UNLEARN_DEADLETTER_INPUTS=keep``
(``schemas/redaction.py``, docs/erasure.md).

**Opening sealed inputs** (docs/erasure.md section 5). Right after parsing and before anything is
judged, every add whose input is sealed for transit (``schemas/sealed.py``) is opened under its
by-head partition's transit key (:func:`open_sealed`); one that cannot be opened becomes an
:class:`UnopenedRequest` (an ``InvalidRequest`` that keeps the parsed request, so its dead letter
names the event) with one of :data:`TRANSIT_REASONS`. The dead letter keeps the message as sent,
i.e. the sealed bytes: noise once the transit key is destroyed. With
``UNLEARN_REQUIRE_SEALED_INPUT`` a plaintext add is refused the same way. A producer reuses one
ephemeral key for many requests under one transit key (``schemas/sealed.TransitSealer``), so the
AES key derived for a (transit key id, epk) pair is kept in :class:`DerivedKeys`, a bounded LRU
(``DERIVED_KEYS`` entries): one X25519 exchange and HKDF per producer session and epoch instead
of per request. Its entries for a transit key are dropped when that key is destroyed or its
partition revoked (``erasure.TransitKeys.forget`` / ``drop``): no derived key outlives its
private key.

**Remove wins**: in event time, without I/O: the tombstones deletes leave and the rule adds meet.

Producers are not ordered with each other: the app that adds and the service that erases are
different producers, and the router reads ``requests`` partitions independently, so a delete can
be judged before an add it was produced after (docs/featurizer.md, "Remove wins"). So every
delete and delete_subject that is not refused leaves a **tombstone** of its (head, sample) or
(head, subject) carrying its **event time**, and an add is judged against them:

- event time = the request's ``ts`` when present, else the Kafka record's timestamp (the
  producer's CreateTime, forwarded unchanged by the router; a delete takes the end of its
  millisecond, an add its start), else the featurizer's clock; integer microseconds, so it is
  stored and compared exactly;
- an add whose event time is **not later** than a matching tombstone is refused
  (``deleted_before_arrival``); a later one is a re-add;
- a tombstone matches an add of the same head and subject (and sample, for a delete's), and of
  the same client when the deleting client could only delete its own samples (signed mode without
  ``may_delete_others``); ``client_id`` "" matches every client;
- clocks: an add dated more than ``skew`` ahead of the featurizer's clock is refused
  (``ts_in_future``: it would otherwise outlive every honest delete); a delete is never refused
  for its clock, its tombstone is dated at most ``now + skew`` (so a broken clock cannot block
  later re-adds for long);
- retention: tombstones older than ``retention`` (event time) are dropped, and an add older than
  ``retention`` is refused (``event_too_old``), so a dropped tombstone can never be needed:
  within the window the guarantee is exact, outside it nothing old enters. ``retention`` 0 keeps
  tombstones for ever (no add is too old).

Everything here is a pure function of (request, record timestamp, tombstones, now), so a replay of
the same requests decides the same (``tests/streams/featurizer/test_tombstones.py`` checks the
rule against a from-scratch reference over random interleavings).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import orjson
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from unlearn.features.backbones import BackboneError, backbone_cache_key
from unlearn.features.backbones.images import image_pixels
from unlearn.features.contract import (
    BatchQuantizer,
    FeatureRejected,
    QuantizeRow,
    check_information,
    fixed_dim,
    quantize_feature_row,
    quantize_label,
    resolve_backbone,
)
from unlearn.infra import tracing
from unlearn.ledger import ExactLedger, MultisetHash
from unlearn.schemas.client_record import ClientRecord
from unlearn.schemas.deadletter import DeadLetter
from unlearn.schemas.delta_codec import Delta, PackedEntry, RowsEntry
from unlearn.schemas.envelope import Request, is_valid_id, parse_request
from unlearn.schemas.head_contract import HeadContract
from unlearn.schemas.receipts import Receipt
from unlearn.schemas.redaction import redact_original
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.request_inputs import FeaturesInput, ImageInput, SealedInput, TextInput
from unlearn.schemas.source_id import format_source_id
from unlearn.schemas.transit import TransitError, TransitKeyPair, open_request, opening_key
from unlearn.streams.featurizer.auth import NO_RECEIPT_REASONS, Authorizer, Screened
from unlearn.streams.featurizer.events import (
    ERASED,
    EventKey,
    EventMark,
    expired_events,
    judge_event,
    named_events,
)
from unlearn.streams.featurizer.model import (
    _DELETE_OPS,
    STAGE,
    BatchOutcome,
    CachedSample,
    CacheMutations,
    CacheView,
    CoreConfig,
    Encoder,
    HeadInfo,
    InMessage,
    Origin,
    RegistryEncoder,
)

__all__ = [
    "DEFAULT_MAX_SKEW_SECONDS",
    "DEFAULT_RETENTION_SECONDS",
    "EXPIRE_PER_BATCH",
    "TOMBSTONE_REASONS",
    "AddName",
    "Tombstone",
    "TombstoneKey",
    "TombstonePolicy",
    "add_event_time",
    "add_keys",
    "blocking_tombstone",
    "delete_event_time",
    "event_time_us",
    "expired_tombstones",
    "seconds_to_us",
    "tombstones_of",
    "BatchView",
    "BulkCacheView",
    "Overlay",
    "base_tombstones",
    "named_samples",
    "named_tombstones",
    "auto_contract",
    "auto_contracts",
    "check_contract",
    "judged_contract",
    "with_registry",
    "refusal",
    "salvage_delete_ids",
    "Admitted",
    "EncodedAdds",
    "HeadRows",
    "Judgement",
    "admit_routed",
    "assemble_deltas",
    "check_batch",
    "encode_adds",
    "encode_group",
    "featurize_batch",
    "judge_add",
    "judge_batch",
    "judge_delete",
    "judge_delete_subject",
    "judge_remove_wins",
    "parse_batch",
    "route_adds",
    "use_packed",
    "TRANSIT_REASONS",
    "DerivedKeys",
    "TransitGate",
    "UnopenedRequest",
    "open_sealed",
]

TombstoneKind = Literal["sample", "subject"]
#: (head, kind, id, subject, client): ``id`` is the sample id (kind "sample") or the subject id.
TombstoneKey = tuple[str, str, str, str, str]

DEFAULT_MAX_SKEW_SECONDS = 300.0
"""UNLEARN_MAX_CLOCK_SKEW_SECONDS: how far ahead of the featurizer an add may be dated."""
DEFAULT_RETENTION_SECONDS = 7 * 86_400.0
"""UNLEARN_TOMBSTONE_RETENTION_SECONDS: how long (in event time) a tombstone is kept."""

TOMBSTONE_REASONS: dict[str, str] = {
    "deleted_before_arrival": "an add whose event time is not later than a delete of its (head, sample) or a "
                              "delete_subject of its (head, subject) judged before it (remove wins, in event time)",
    "ts_in_future": "an add dated (ts, else the record timestamp) more than UNLEARN_MAX_CLOCK_SKEW_SECONDS ahead "
                    "of the featurizer's clock: it could outlive honest deletes",
    "event_too_old": "an add dated more than UNLEARN_TOMBSTONE_RETENTION_SECONDS in the past: a tombstone that "
                     "would refuse it may have expired",
}


@dataclass(frozen=True, slots=True)
class TombstonePolicy:
    """The clock bounds (seconds): ``max_skew`` ahead of the featurizer's clock, ``retention``
    (0: tombstones kept for ever)."""

    max_skew: float = DEFAULT_MAX_SKEW_SECONDS
    retention: float = DEFAULT_RETENTION_SECONDS

    def __post_init__(self) -> None:
        if not self.max_skew >= 0 or not self.retention >= 0:
            raise ValueError(f"max_skew and retention must be >= 0, got {self.max_skew}, {self.retention}")

    def horizon_us(self, now_us: int) -> int | None:
        """Event times below this are expired (None: nothing expires)."""
        return None if self.retention == 0 else now_us - seconds_to_us(self.retention)


class AddName(Protocol):
    """What names an add for the rule: a request, or a retained row the verifier re-judges."""

    @property
    def head_id(self) -> str: ...
    @property
    def sample_id(self) -> str | None: ...
    @property
    def subject_id(self) -> str: ...
    @property
    def client_id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A delete's (``kind`` "sample") or delete_subject's (``kind`` "subject") durable mark."""

    head_id: str
    kind: TombstoneKind
    id: str  # the sample id, or the subject id
    subject_id: str
    client_id: str  # "" matches every client
    event_us: int  # event time, microseconds since the epoch
    event_id: str  # the delete's event id

    @property
    def key(self) -> TombstoneKey:
        return (self.head_id, self.kind, self.id, self.subject_id, self.client_id)


def seconds_to_us(seconds: float) -> int:
    """Unix seconds -> integer microseconds (event times are compared exactly)."""
    return round(seconds * 1_000_000)


def event_time_us(r: Request, record_ms: int | None, now: float) -> int:
    """A request's event time: its ``ts``, else the record's timestamp (ms; None or < 0: none),
    else ``now`` (seconds), in integer microseconds. A record timestamp is a whole millisecond:
    an add takes its start, a delete its end (the last microsecond), so a delete produced right
    after an add dated with ``ts`` in the same millisecond is never taken for an older one."""
    if r.ts is not None:
        return seconds_to_us(r.ts)
    if record_ms is not None and record_ms >= 0:
        return int(record_ms) * 1000 + (999 if r.op != "add" else 0)
    return seconds_to_us(now)


def add_event_time(r: Request, record_ms: int | None, now: float, policy: TombstonePolicy) -> int:
    """An add's event time; raises ``FeatureRejected`` (``ts_in_future``, ``event_too_old``)
    outside the clock bounds."""
    t = event_time_us(r, record_ms, now)
    now_us = seconds_to_us(now)
    if t > now_us + seconds_to_us(policy.max_skew):
        raise FeatureRejected("ts_in_future", f"add {r.event_id!r} is dated {t / 1e6:.3f}, more than "
                                              f"{policy.max_skew:g} s after the featurizer's clock {now:.3f}")
    horizon = policy.horizon_us(now_us)
    if horizon is not None and t < horizon:
        raise FeatureRejected("event_too_old", f"add {r.event_id!r} is dated {t / 1e6:.3f}, more than "
                                               f"{policy.retention:g} s (the tombstone retention) before {now:.3f}")
    return t


def delete_event_time(r: Request, record_ms: int | None, now: float, policy: TombstonePolicy) -> int:
    """A delete's tombstone time: its event time, at most ``now + max_skew``."""
    return min(event_time_us(r, record_ms, now), seconds_to_us(now) + seconds_to_us(policy.max_skew))


def tombstones_of(r: Request, client_id: str, event_us: int) -> list[Tombstone]:
    """The tombstone a delete (its sample) or delete_subject (its subject) leaves;
    ``client_id`` "" when it may remove any client's samples."""
    if r.op == "delete":
        assert r.sample_id is not None
        return [Tombstone(r.head_id, "sample", r.sample_id, r.subject_id, client_id, event_us, r.event_id)]
    if r.op == "delete_subject":
        return [Tombstone(r.head_id, "subject", r.subject_id, r.subject_id, client_id, event_us, r.event_id)]
    return []


def add_keys(r: Request) -> list[tuple[str, str, str, str]]:
    """(head, kind, id, subject) of the tombstones that can refuse an add (any client)."""
    assert r.sample_id is not None
    return [(r.head_id, "sample", r.sample_id, r.subject_id), (r.head_id, "subject", r.subject_id, r.subject_id)]


def blocking_tombstone(r: AddName, add_us: int, found: Iterable[Tombstone]) -> Tombstone | None:
    """The latest tombstone among ``found`` that refuses the add ``r`` dated ``add_us`` (same
    head, subject, sample or subject kind, client or "", event time >= ``add_us``), or None."""
    best: Tombstone | None = None
    for t in found:
        if t.head_id != r.head_id or t.subject_id != r.subject_id or t.client_id not in ("", r.client_id):
            continue
        if t.kind == "sample" and t.id != r.sample_id:
            continue
        if t.event_us >= add_us and (best is None or t.event_us > best.event_us):
            best = t
    return best

EXPIRE_PER_BATCH = 256
"""Most expired tombstones one batch drops (retention is a storage bound, not a deadline)."""


def expired_tombstones(cache: object, policy: TombstonePolicy, now: float) -> tuple[TombstoneKey, ...]:
    """Keys of tombstones past the retention (at most :data:`EXPIRE_PER_BATCH`), from a cache
    that lists them (``FeatureCache.expired_tombstones``); none when nothing expires."""
    horizon = policy.horizon_us(seconds_to_us(now))
    lister = getattr(cache, "expired_tombstones", None)
    if horizon is None or lister is None:
        return ()
    return tuple(lister(horizon, EXPIRE_PER_BATCH))


#: (head, kind, id, subject): the tombstones of every client under one name.
TombName = tuple[str, str, str, str]


def named_samples(reqs: Iterable[Request | InvalidRequest]) -> list[tuple[str, str]]:
    """The (head, sample) pairs the valid adds and deletes of a batch name (what they look up)."""
    return [(r.head_id, r.sample_id) for r in reqs
            if isinstance(r, Request) and r.op in ("add", "delete") and r.sample_id is not None]


def named_tombstones(reqs: Iterable[Request | InvalidRequest]) -> list[TombName]:
    """The tombstone names a batch's valid adds (what can refuse them) and deletes (what they
    replace) look up."""
    out: list[TombName] = []
    for r in reqs:
        if not isinstance(r, Request):
            continue
        if r.op == "add" and r.sample_id is not None:
            out += add_keys(r)
        elif r.op == "delete" and r.sample_id is not None:
            out.append((r.head_id, "sample", r.sample_id, r.subject_id))
        elif r.op == "delete_subject":
            out.append((r.head_id, "subject", r.subject_id, r.subject_id))
    return out


def base_tombstones(base: object, name: TombName) -> list[Tombstone]:
    """``base.tombstones(*name)``, or none when ``base`` keeps no tombstones (a test's cache)."""
    get = getattr(base, "tombstones", None)
    return [] if get is None else list(get(*name))


@runtime_checkable
class BulkCacheView(Protocol):
    """A cache that can look up many samples (and tombstones) at once."""

    def get_samples(self, keys: Iterable[tuple[str, str]]) -> Mapping[tuple[str, str], CachedSample]: ...

    def get_tombstones(self, names: Iterable[TombName]) -> Mapping[TombName, list[Tombstone]]: ...


class BatchView:
    """``base`` as seen by one batch: the samples named in ``keys`` fetched up front (one query
    when ``base`` is a :class:`BulkCacheView`), heads memoized; anything else is asked of
    ``base``. Only valid while ``base`` does not change (the judging of one batch)."""

    def __init__(self, base: CacheView, keys: Iterable[tuple[str, str]], tombs: Iterable[TombName] = (),
                 events: Iterable[EventKey] = ()) -> None:
        self.base = base
        wanted = set(keys)
        names = set(tombs)
        if isinstance(base, BulkCacheView):
            found = base.get_samples(wanted)
            marks = base.get_tombstones(names)
        else:
            found = {k: s for k in wanted if (s := base.get_sample(*k)) is not None}
            marks = {n: base_tombstones(base, n) for n in names}
        self._samples: dict[tuple[str, str], CachedSample | None] = {k: found.get(k) for k in wanted}
        self._tombs: dict[TombName, list[Tombstone]] = {n: list(marks.get(n, ())) for n in names}
        self._heads: dict[str, HeadInfo | None] = {}
        get_events = getattr(base, "get_events", None)
        self._events: dict[EventKey, EventMark] = dict(get_events(set(events))) if get_events is not None else {}

    def get_event(self, head_id: str, event_id: str) -> EventMark | None:
        """The event-id mark of (head, event id), fetched with the batch (``events.py``)."""
        return self._events.get((head_id, event_id))

    def get_sample(self, head_id: str, sample_id: str) -> CachedSample | None:
        key = (head_id, sample_id)
        if key in self._samples:
            return self._samples[key]
        return self.base.get_sample(head_id, sample_id)

    def subject_samples(self, head_id: str, subject_id: str) -> list[CachedSample]:
        return self.base.subject_samples(head_id, subject_id)

    def get_head(self, head_id: str) -> HeadInfo | None:
        if head_id not in self._heads:
            self._heads[head_id] = self.base.get_head(head_id)
        return self._heads[head_id]

    def tombstones(self, head_id: str, kind: str, id_: str, subject_id: str) -> list[Tombstone]:
        name = (head_id, kind, id_, subject_id)
        if name in self._tombs:
            return self._tombs[name]
        return base_tombstones(self.base, name)


class Overlay:
    """The cache as seen after the events of this batch judged so far (a :class:`CacheView`), so
    events of one batch see each other without touching the real cache before the commit."""

    def __init__(self, base: CacheView) -> None:
        self.base = base
        self.samples: dict[tuple[str, str], CachedSample | None] = {}  # None: dropped in this batch
        self.heads: dict[str, HeadInfo] = {}
        self.tombs: dict[TombstoneKey, Tombstone] = {}  # put in this batch
        self.expired: tuple[TombstoneKey, ...] = ()  # dropped in this batch (retention)
        self.events: dict[EventKey, EventMark] = {}  # event-id marks put in this batch
        self.expired_events: tuple[EventKey, ...] = ()  # marks dropped in this batch (retention)

    def get_event(self, head_id: str, event_id: str) -> EventMark | None:
        """What (head, event id) already meant: this batch's mark, else the cache's (none when the
        cache keeps no marks: a test's)."""
        key = (head_id, event_id)
        if key in self.events:
            return self.events[key]
        get = getattr(self.base, "get_event", None)
        return None if get is None else get(head_id, event_id)

    def get_sample(self, head_id: str, sample_id: str) -> CachedSample | None:
        key = (head_id, sample_id)
        if key in self.samples:
            return self.samples[key]
        return self.base.get_sample(head_id, sample_id)

    def subject_samples(self, head_id: str, subject_id: str) -> list[CachedSample]:
        found: dict[str, CachedSample] = {}
        for cs in self.base.subject_samples(head_id, subject_id):
            if (head_id, cs.sample_id) not in self.samples:
                found[cs.sample_id] = cs
        for (h, s), put in self.samples.items():
            if h == head_id and put is not None and put.subject_id == subject_id:
                found[s] = put
        return [found[s] for s in sorted(found)]

    def get_head(self, head_id: str) -> HeadInfo | None:
        return self.heads.get(head_id) or self.base.get_head(head_id)

    def tombstones(self, head_id: str, kind: str, id_: str, subject_id: str) -> list[Tombstone]:
        found = {t.key: t for t in base_tombstones(self.base, (head_id, kind, id_, subject_id))}
        for key, t in self.tombs.items():
            if key[:4] == (head_id, kind, id_, subject_id):
                found[key] = t
        return [found[k] for k in sorted(found)]

    def put_tombstone(self, t: Tombstone) -> None:
        """Keep ``t`` unless its key already holds a tombstone at least as late (a tombstone only
        ever moves later)."""
        for old in self.tombstones(t.head_id, t.kind, t.id, t.subject_id):
            if old.key == t.key and old.event_us >= t.event_us:
                return
        self.tombs[t.key] = t

    def mutations(self) -> CacheMutations:
        """The batch's net effect on the cache."""
        return CacheMutations(
            put_samples=tuple(v for v in self.samples.values() if v is not None),
            drop_samples=tuple(k for k, v in self.samples.items() if v is None),
            put_heads=tuple(self.heads.values()),
            put_tombstones=tuple(self.tombs.values()),
            drop_tombstones=tuple(k for k in self.expired if k not in self.tombs),
            put_events=tuple(self.events.values()),
            drop_events=tuple(k for k in self.expired_events if k not in self.events),
        )


def with_registry(config: CoreConfig, contracts: Mapping[str, HeadContract]) -> CoreConfig:
    """``config`` for one batch: the registry's declared contracts, whose backbones also decide
    which backbone a head's inputs are encoded with (over ``UNLEARN_HEAD_BACKBONES``)."""
    backbones = {**config.head_backbones, **{h: c.backbone for h, c in contracts.items()}}
    return replace(config, contracts=dict(contracts), head_backbones=backbones)


def auto_contract(head_id: str, input_kind: str, dim: int, label_kind: str, label_width: int, frac_bits: int,
                  label_frac_bits: int, config: CoreConfig) -> HeadContract:
    """The contract of an undeclared head with these first-add facts (module docstring)."""
    name, _ = resolve_backbone(head_id, input_kind, config.head_backbones.get(head_id))
    vector = label_kind == "vector"
    return HeadContract(
        head_id=head_id, version=1, dimension=dim, backbone=name, input_kind=input_kind,
        normalization="l2" if config.heads.normalize_features else "none", feature_bound=config.heads.feature_bound,
        frac_bits=frac_bits, label_frac_bits=label_frac_bits, label_kind="vector" if vector else "class",
        gamma=config.heads.gamma_for(head_id),
        n_classes=0 if vector else config.heads.default_classes, label_width=label_width if vector else 0,
        origin="auto",
    )


def auto_contracts(new_heads: Iterable[HeadInfo], config: CoreConfig) -> list[HeadContract]:
    """The auto contracts to publish for heads a batch created without a declared contract."""
    return [auto_contract(h.head_id, h.input_kind, h.dim, h.label_kind, h.label_width, h.frac_bits,
                          h.label_frac_bits, config)
            for h in new_heads if h.head_id not in config.contracts]


def delta_contract(head: HeadInfo, config: CoreConfig) -> HeadContract | None:
    """The contract a head's delta names (its class count and version: ``schemas/delta_codec.py``),
    the one its adds were judged against in this batch: the declared one, else the auto one; None
    when neither applies (an undeclared head with auto-creation off: its delta names no contract)."""
    declared = config.contracts.get(head.head_id)
    if declared is not None:
        return declared
    if not config.heads.auto_create_heads:
        return None
    return auto_contract(head.head_id, head.input_kind, head.dim, head.label_kind, head.label_width,
                         head.frac_bits, head.label_frac_bits, config)


def judged_contract(r: Request, head: HeadInfo | None, dim: int, label_kind: str, label_width: int,
                    config: CoreConfig) -> HeadContract:
    """The contract an add is judged against: the declared one, else the auto contract of the
    head's facts (the cached ones, or this add's for a new head). Raises ``FeatureRejected``:
    ``undeclared_head`` when auto-creation is off, ``label_out_of_range`` for a vector wider than
    ``UNLEARN_MAX_CLASSES``."""
    declared = config.contracts.get(r.head_id)
    if declared is not None:
        return declared
    if not config.heads.auto_create_heads:
        raise FeatureRejected("undeclared_head", f"head {r.head_id!r} is not declared (`unlearn heads create`) and "
                                                 "UNLEARN_AUTO_CREATE_HEADS is off")
    assert r.input is not None
    if head is not None:
        return auto_contract(r.head_id, head.input_kind, head.dim, head.label_kind, head.label_width,
                             head.frac_bits, head.label_frac_bits, config)
    if label_width > config.heads.max_classes:
        raise FeatureRejected("label_out_of_range", f"a label vector of {label_width} values is wider than "
                                                    f"UNLEARN_MAX_CLASSES={config.heads.max_classes}")
    return auto_contract(r.head_id, r.input.kind, dim, label_kind, label_width, config.heads.frac_bits,
                         config.heads.label_frac_bits, config)


def check_contract(r: Request, c: HeadContract, head: HeadInfo | None, backbone_key: str, dim: int,
                   label_kind: str, label_width: int, label: int | np.ndarray) -> None:
    """Raise ``FeatureRejected`` unless the add fits the contract: backbone and input kind
    (``backbone_mismatch``), dimension (``dimension_mismatch``), label kind and width
    (``label_mismatch``), class index inside the label space (``label_out_of_range``), and a
    head whose cached grid differs from its contract (``contract_conflict``: it was declared after
    its first add, on another grid)."""
    assert r.input is not None
    if backbone_cache_key(c.backbone) != backbone_key or c.input_kind != r.input.kind:
        raise FeatureRejected("backbone_mismatch",
                              f"head {r.head_id!r} declares backbone {c.backbone!r} on {c.input_kind} inputs "
                              f"(contract v{c.version}); this add resolves to {backbone_key!r} on a "
                              f"{r.input.kind} input")
    if dim != c.dimension:
        raise FeatureRejected("dimension_mismatch", f"head {r.head_id!r} declares d={c.dimension} (contract "
                                                    f"v{c.version}), this add has {dim} features")
    if label_kind != c.label_kind or label_width != c.label_width:
        what = "class indices" if c.label_kind == "class" else f"label vectors of width {c.label_width}"
        raise FeatureRejected("label_mismatch", f"head {r.head_id!r} declares {what} (contract v{c.version})")
    if isinstance(label, int) and label >= c.n_classes:
        raise FeatureRejected("label_out_of_range",
                              f"class {label} is outside head {r.head_id!r}'s label space 0..{c.n_classes - 1} "
                              f"(contract v{c.version}); `unlearn heads extend` grows it")
    if head is not None and (head.frac_bits, head.label_frac_bits) != (c.frac_bits, c.label_frac_bits):
        raise FeatureRejected("contract_conflict",
                              f"head {r.head_id!r} holds rows on grid frac_bits={head.frac_bits}, label_frac_bits="
                              f"{head.label_frac_bits}; its contract v{c.version} declares {c.frac_bits}, "
                              f"{c.label_frac_bits}")


def refusal(m: InMessage, r: Request | None, reason: str, detail: str, config: CoreConfig, ts: float,
            raw_ids: Mapping[str, Any] | None = None) -> tuple[DeadLetter, Receipt | None]:
    """The dead letter of a refused message, plus a rejected receipt when it names a delete: the
    client that asked waits for one. ``raw_ids`` are the ids :func:`salvage_delete_ids` found in
    an invalid request (``r`` is None then). The dead letter names the request's place in
    ``requests`` (where its producer put it), not the by-head copy the featurizer read, and keeps
    no plaintext input unless UNLEARN_DEADLETTER_INPUTS=keep (``schemas/redaction.py``)."""
    if m.origin is not None:
        topic, partition, offset = config.requests_topic, m.origin.partition, m.origin.offset
    else:
        topic, partition, offset = config.input_topic, m.partition, m.offset
    original = bytes(m.value) if m.value is not None else b""
    dl = DeadLetter(
        original=redact_original(original) if config.redact_deadletter_inputs else original,
        reason=reason, detail=detail, stage=STAGE, topic=topic,
        partition=partition, offset=offset, key=m.key,
        event_id=r.event_id if r is not None else (raw_ids or {}).get("event_id"), ts=ts,
    )
    ids: Mapping[str, Any] | None = raw_ids if r is None else {
        "op": r.op, "event_id": r.event_id, "subject_id": r.subject_id, "head_id": r.head_id,
        "sample_ids": [r.sample_id] if r.sample_id else [],
    }
    receipt = None
    if ids and ids.get("op") in _DELETE_OPS:
        receipt = Receipt.rejected(ids["event_id"], ids["subject_id"], ids["head_id"], ids["sample_ids"], reason, ts)
    return dl, receipt


def salvage_delete_ids(raw: bytes | None) -> dict[str, Any] | None:
    """For an invalid request that still names a delete with usable ids: the receipt fields, so the
    client that asked is told it was rejected. None otherwise."""
    if raw is None:
        return None
    try:
        d = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return None
    if type(d) is not dict or d.get("op") not in _DELETE_OPS:
        return None

    if not all(is_valid_id(d.get(k)) for k in ("event_id", "subject_id", "head_id")):
        return None
    sample = d.get("sample_id")
    return {
        "op": d["op"], "event_id": d["event_id"], "subject_id": d["subject_id"], "head_id": d["head_id"],
        "sample_ids": [sample] if is_valid_id(sample) else [],
    }


# --------------------------------------------------------------------------- overlay
class HeadRows:
    """Rows of one head in one batch, in the entry groups (the order of a delta's entries): adds,
    deletes' rows and delete_subjects' rows (``by_subject``: they leave subject tombstones), per
    label kind."""

    def __init__(self) -> None:
        self.groups: dict[tuple[int, str, bool], list[tuple[str, CachedSample]]] = {
            (sign, kind, by_subject): [] for sign, by_subject in ((1, False), (-1, False), (-1, True))
            for kind in ("class", "vector")
        }

    def add(self, sign: int, event_id: str, cs: CachedSample, by_subject: bool = False) -> None:
        self.groups[(sign, cs.label_kind, by_subject)].append((event_id, cs))

    def __len__(self) -> int:
        return sum(len(items) for items in self.groups.values())


# --------------------------------------------------------------------------- step 1: check and parse
def check_batch(messages: Sequence[InMessage]) -> int:
    """The batch's partition. Raises ValueError unless the batch is non-empty, of one partition and
    in ascending offsets: events are judged in offset order, and the outcome's last offset (the
    delta's source id) must cover every message."""
    if not messages:
        raise ValueError("featurize_batch needs at least one message")
    partition = messages[0].partition
    prev = -1
    for m in messages:
        if m.partition != partition:
            raise ValueError(f"one partition per batch: got {partition} and {m.partition}")
        if m.offset <= prev:
            raise ValueError(f"offsets must ascend: {m.offset} after {prev}")
        prev = m.offset
    return partition


@dataclass
class Admitted:
    """What :func:`admit_routed` lets through: the records to judge, the new last origin offset
    of each requests partition they came from, and how many were dropped as re-forwarded copies
    (``reforwarded``) or as arriving after a predecessor that never did (``gaps``)."""

    messages: list[InMessage]
    origin_offsets: dict[int, int] = field(default_factory=dict)
    reforwarded: int = 0
    gaps: int = 0


def admit_routed(messages: Sequence[InMessage], origins: Mapping[int, int]) -> Admitted:
    """Drop the router's re-forwarded copies, exactly. ``origins`` is the last origin offset
    judged per requests partition (durable with the cache).

    The router forwards each requests partition in offset order and commits after delivery, so
    a copy always carries an origin offset at or below the last one judged from its partition:
    it is dropped (``reforwarded``). A record whose ``previous`` (the record its router session
    forwarded before it to this partition) is beyond the last one judged arrives after a
    delivery that failed: its session died before committing, so the next session forwards it
    again after the missing one; it is dropped now (``gaps``). A record with no origin (nobody
    routed it) is its own origin and always judged."""
    last = dict(origins)
    out = Admitted([])
    for m in messages:
        o: Origin | None = m.origin
        if o is not None:
            seen = last.get(o.partition, -1)
            if o.offset <= seen:
                out.reforwarded += 1
                continue
            if o.previous is not None and o.previous > seen:
                out.gaps += 1
                continue
            last[o.partition] = out.origin_offsets[o.partition] = o.offset
        out.messages.append(m)
    return out


def parse_batch(messages: Sequence[InMessage]) -> list[Request | InvalidRequest]:
    """Each message's request, or the :class:`InvalidRequest` saying why it is none (kept in place:
    an invalid message still takes its turn, and its offset, in the batch)."""
    reqs: list[Request | InvalidRequest] = []
    for m in messages:
        try:
            reqs.append(parse_request(m.value))  # type: ignore[arg-type]
        except InvalidRequest as exc:
            reqs.append(exc)
    return reqs


# --------------------------------------------------------------------------- step 2: encode
@dataclass
class EncodedAdds:
    """Per add (by its index in the batch): float64 features or the refusal, and its backbone key."""

    features: dict[int, np.ndarray | FeatureRejected] = field(default_factory=dict)
    backbones: dict[int, str] = field(default_factory=dict)


def route_adds(reqs: Sequence[Request | InvalidRequest],
               config: CoreConfig) -> tuple[EncodedAdds, dict[str, list[tuple[int, Any]]]]:
    """Resolve each add's backbone. Feature vectors pass through in float64 as sent (the registry's
    ``FeaturesBackbone`` casts to float32, so q would differ from what a client computes; a
    ``features_bin`` '<f4' vector is widened exactly, so q is that of its float32 values); text and
    images are grouped per backbone name for :func:`encode_adds`. Returns (the adds settled so far,
    the groups to encode). In federated mode another client's adds are skipped: never encode
    another owner's data (they are refused when judged)."""
    encoded = EncodedAdds()
    groups: dict[str, list[tuple[int, Any]]] = {}
    for i, r in enumerate(reqs):
        if not isinstance(r, Request) or r.op != "add" or r.input is None:
            continue
        if config.federated and r.client_id != config.client_id:
            continue
        try:
            name, key = resolve_backbone(r.head_id, r.input.kind, config.head_backbones.get(r.head_id))
        except FeatureRejected as rej:
            encoded.features[i] = rej
            continue
        encoded.backbones[i] = key
        if isinstance(r.input, FeaturesInput):
            encoded.features[i] = np.asarray(r.input.values, dtype=np.float64)
        elif isinstance(r.input, TextInput):
            groups.setdefault(name, []).append((i, r.input.text))
        elif isinstance(r.input, ImageInput):
            pixels = image_pixels(r.input.data)
            budget = config.featurizer.max_image_pixels
            if pixels is not None and pixels > budget:  # checked on the header, before anything is decoded
                encoded.features[i] = FeatureRejected(
                    "image_too_large", f"the image declares {pixels} pixels, above UNLEARN_MAX_IMAGE_PIXELS={budget}")
                continue
            groups.setdefault(name, []).append((i, r.input.data))
    return encoded, groups


def encode_adds(reqs: Sequence[Request | InvalidRequest], config: CoreConfig, encoder: Encoder) -> EncodedAdds:
    """Features of every add, encoded in one call per backbone before judging: encoding does not
    depend on the cache, and a model is fast on batches."""
    encoded, groups = route_adds(reqs, config)
    for name, items in groups.items():
        for (i, _), res in zip(items, encode_group(encoder, name, [p for _, p in items]), strict=True):
            encoded.features[i] = res
    return encoded


def encode_group(encoder: Encoder, name: str, items: list[Any]) -> list[np.ndarray | FeatureRejected]:
    """Encode items with one backbone; per-item rejects for bad inputs. A non-BackboneError from
    the model (a crash on one odd input, or an out-of-memory on the whole batch) is retried item
    by item to isolate the culprit; if every item still fails, it is systemic: re-raise."""
    try:
        res = encoder(name, items)
    except BackboneError as exc:
        if exc.index is None:
            return [FeatureRejected("backbone_unavailable", str(exc))] * len(items)
        raise
    except Exception as exc:
        if len(items) == 1:
            raise
        out: list[np.ndarray | FeatureRejected] = []
        for item in items:
            try:
                out.extend(encode_group(encoder, name, [item]))
            except Exception as inner:
                out.append(FeatureRejected("encode_failed", f"{name}: {type(inner).__name__}: {inner}"))
        if all(isinstance(o, FeatureRejected) and o.reason == "encode_failed" for o in out):
            raise exc
        return out
    out = [FeatureRejected("undecodable_input", f"{name}: no output for this input")] * len(items)
    for j, idx in enumerate(res.indices.tolist()):
        out[idx] = np.asarray(res.features[j], dtype=np.float64)
    for idx, err in res.errors.items():
        out[idx] = FeatureRejected("undecodable_input", f"{name}: {err.reason}")
    return out


# --------------------------------------------------------------------------- step 3: judge
def judge_add(r: Request, feat: np.ndarray | FeatureRejected | None, backbone_key: str | None, view: CacheView,
              config: CoreConfig, quantize: QuantizeRow = quantize_feature_row) -> tuple[CachedSample, HeadInfo, bool]:
    """(sample to cache, its head, whether the head is new) for an add; raises :class:`FeatureRejected`.
    A head's backbone, input kind, dimension, label kind and grid are fixed by its first accepted
    add, so every later row of the head is on the same grid and in the same space; the add must
    also fit the head's contract (declared, else auto: :func:`auto_contract`), which
    bounds its label space and gives a new head its grid. ``quantize`` is ``quantize_feature_row``
    or the batch's ``BatchQuantizer`` (the same bits, proven by a property test)."""
    assert r.sample_id is not None and r.input is not None and r.label is not None
    if view.get_sample(r.head_id, r.sample_id) is not None:
        raise FeatureRejected("duplicate_add",
                              f"sample {r.sample_id!r} of head {r.head_id!r} is already in the feature cache")
    if isinstance(feat, FeatureRejected):
        raise feat
    if feat is None or backbone_key is None:
        raise FeatureRejected("undecodable_input", "no features were produced for this input")
    dim = int(feat.shape[0])
    head = view.get_head(r.head_id)
    if head is not None:
        if head.backbone != backbone_key or head.input_kind != r.input.kind:
            raise FeatureRejected("backbone_mismatch",
                           f"head {r.head_id!r} uses {head.backbone!r} on {head.input_kind} inputs; this add "
                           f"resolves to {backbone_key!r} on a {r.input.kind} input")
        if dim != head.dim:
            raise FeatureRejected("dimension_mismatch",
                                  f"head {r.head_id!r} has d={head.dim}, this add has {dim} features")
        k, k_y = head.frac_bits, head.label_frac_bits
    else:
        fixed = fixed_dim(backbone_key)
        if fixed is not None and dim != fixed:
            raise FeatureRejected("dimension_mismatch",
                           f"backbone {backbone_key!r} has d={fixed}, this add has {dim} features")
        max_dim = config.heads.max_feature_dim
        if dim > max_dim:
            raise FeatureRejected("dimension_too_large",
                           f"d={dim} exceeds UNLEARN_MAX_FEATURE_DIM={max_dim} for new head {r.head_id!r}")
        declared = config.contracts.get(r.head_id)  # the contract wins: a new head takes its grid
        k, k_y = (declared.frac_bits, declared.label_frac_bits) if declared else (config.heads.frac_bits,
                                                                                  config.heads.label_frac_bits)
    kind, width, label = quantize_label(r.label, k_y)
    if head is not None and (kind != head.label_kind or width != head.label_width):
        what = "class indices" if head.label_kind == "class" else f"label vectors of width {head.label_width}"
        got = "a class index" if kind == "class" else f"a label vector of width {width}"
        raise FeatureRejected("label_mismatch", f"head {r.head_id!r} takes {what}, got {got}")
    contract = judged_contract(r, head, dim, kind, width, config)
    check_contract(r, contract, head, backbone_key, dim, kind, width, label)
    q = quantize(feat, k, contract.feature_bound, contract.normalize)
    check_information(feat, q, contract.normalize)
    new_head = head is None
    if head is None:
        head = HeadInfo(r.head_id, backbone_key, r.input.kind, dim, kind, width, k, k_y)
    cs = CachedSample(r.head_id, r.sample_id, r.subject_id, r.client_id, r.event_id, label, q)
    return cs, head, new_head


def judge_delete(r: Request, view: CacheView, event_us: int | None = None) -> list[CachedSample]:
    """The cached sample a delete dated ``event_us`` removes (its cached q and label, never a raw
    input): none when it is not cached, or was added later in event time (a re-add wins over an
    older delete; None: any cached add is older); raises :class:`FeatureRejected` when another subject
    added it. Removing nothing is no refusal: the delete's tombstone still keeps the sample's
    older adds out (:func:`judge_remove_wins`)."""
    cs = view.get_sample(r.head_id, r.sample_id)  # type: ignore[arg-type]
    if cs is None:
        return []
    if cs.subject_id != r.subject_id:
        raise FeatureRejected("subject_mismatch",
                              f"sample {r.sample_id!r} was added by another subject than {r.subject_id!r}")
    return [cs] if event_us is None or cs.event_us <= event_us else []


def judge_delete_subject(r: Request, view: CacheView, event_us: int | None = None) -> list[CachedSample]:
    """Every cached sample of the subject in the head (by sample id) added at or before
    ``event_us`` (None: all); possibly none (the tombstone is what such a request leaves)."""
    found = view.subject_samples(r.head_id, r.subject_id)
    return [cs for cs in found if event_us is None or cs.event_us <= event_us]


def judge_remove_wins(r: Request, m: InMessage, view: Overlay, policy: TombstonePolicy, now: float) -> int:
    """An add's event time, checked against the clock bounds and the tombstones (remove wins,
    :func:`blocking_tombstone`); raises :class:`FeatureRejected` (``ts_in_future``, ``event_too_old``,
    ``deleted_before_arrival``)."""
    t_add = add_event_time(r, m.timestamp_ms, now, policy)
    found = [t for name in add_keys(r) for t in view.tombstones(*name)]
    block = blocking_tombstone(r, t_add, found)
    if block is not None:
        raise FeatureRejected("deleted_before_arrival",
                       f"sample {r.sample_id!r} of subject {r.subject_id!r} (head {r.head_id!r}) is dated "
                       f"{t_add / 1e6:.6f}, not after the {'delete' if block.kind == 'sample' else 'delete_subject'} "
                       f"{block.event_id!r} dated {block.event_us / 1e6:.6f}")
    return t_add


@dataclass
class Judgement:
    """What judging a batch in offset order decided: the overlay (cache after the batch), the
    rows per head, and the refusals."""

    overlay: Overlay
    rows: dict[str, HeadRows] = field(default_factory=dict)
    deadletters: list[DeadLetter] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)
    accepted: int = 0

    def accept_add(self, event_id: str, cs: CachedSample, head: HeadInfo, new_head: bool) -> None:
        """Cache the sample (and a new head) and give it a ``+q`` row."""
        if new_head:
            self.overlay.heads[head.head_id] = head
        self.overlay.samples[(cs.head_id, cs.sample_id)] = cs
        self.rows.setdefault(cs.head_id, HeadRows()).add(+1, event_id, cs)
        self.accepted += 1

    def accept_deletes(self, head_id: str, event_id: str, samples: Sequence[CachedSample], event_us: int,
                       by_subject: bool, scope: str) -> None:
        """Drop the samples from the cache and give each a ``-q`` row (all with the delete's event
        id, event time, kind and tombstone scope as their client, so the verifier can rebuild its
        tombstone)."""
        hr = self.rows.setdefault(head_id, HeadRows())
        for cs in samples:
            self.overlay.samples[(head_id, cs.sample_id)] = None
            # The add's event id stays taken (a retention from the delete), its meaning (a hash of
            # the input) goes with the sample.
            self.overlay.events[(head_id, cs.event_id)] = EventMark(head_id, cs.event_id, ERASED, event_us)
            hr.add(-1, event_id, replace(cs, event_us=event_us, client_id=scope), by_subject)
        self.accepted += 1

    def tombstone_only(self, receipt: Receipt) -> None:
        """A delete that removed nothing: its tombstone is in the overlay, its receipt says so."""
        self.receipts.append(receipt)

    def refuse(self, deadletter: DeadLetter, receipt: Receipt | None) -> None:
        """Record a refusal (see :func:`refusal`)."""
        self.deadletters.append(deadletter)
        if receipt is not None:
            self.receipts.append(receipt)


def judge_batch(messages: Sequence[InMessage], reqs: Sequence[Request | InvalidRequest], encoded: EncodedAdds,
                cache: CacheView, config: CoreConfig, ts: float, screened: Screened | None = None) -> Judgement:
    """Judge the requests in offset order against ``cache`` plus the batch so far, so "add x,
    delete x" in one batch works and a duplicate add within it is caught (``screened``: signed mode)."""
    j = Judgement(Overlay(cache))
    quantize = BatchQuantizer(encoded.features.values())  # a head's rows in one call, not one each
    for i, (m, r) in enumerate(zip(messages, reqs, strict=True)):
        if isinstance(r, UnopenedRequest):  # parsed, but its sealed input does not open (or is not sealed)
            j.refuse(*refusal(m, r.request, r.reason, r.detail, config, ts))
            continue
        if isinstance(r, InvalidRequest):  # signed mode answers no unauthenticated request with a receipt
            j.refuse(*refusal(m, None, r.reason, r.detail, config, ts,
                              salvage_delete_ids(m.value) if screened is None else None))
            continue
        if screened is not None and i in screened.denied:
            rej = screened.denied[i]
            dl, receipt = refusal(m, r, rej.reason, rej.detail, config, ts)
            j.refuse(dl, None if rej.reason in NO_RECEIPT_REASONS else receipt)
            continue
        client = screened.clients.get(i) if screened is not None else None
        try:
            if config.federated and r.client_id != config.client_id:
                raise FeatureRejected("wrong_client",
                               f"this federated featurizer serves client {config.client_id!r}, not {r.client_id!r}")
            fp = judge_event(r, j.overlay)
            if r.op == "add":
                t_add = judge_remove_wins(r, m, j.overlay, config.tombstones, ts)
                cs, head, new_head = judge_add(r, encoded.features.get(i), encoded.backbones.get(i), j.overlay,
                                               config, quantize)
                j.accept_add(r.event_id, replace(cs, event_us=t_add), head, new_head)
                j.overlay.events[(r.head_id, r.event_id)] = EventMark(r.head_id, r.event_id, fp, t_add, cs.sample_id)
            else:
                t_del = judge_remove(j, r, m, config, ts, client)
                j.overlay.events[(r.head_id, r.event_id)] = EventMark(r.head_id, r.event_id, fp, t_del)
        except FeatureRejected as rej:
            dl, receipt = refusal(m, r, rej.reason, rej.detail, config, ts)
            # A resend gets no receipt of its own: the first judgement's receipt answers its event id.
            j.refuse(dl, None if rej.reason == "duplicate_event" else receipt)
    return j


def judge_remove(j: Judgement, r: Request, m: InMessage, config: CoreConfig, now: float,
                 client: ClientRecord | None) -> int:
    """A delete or delete_subject: remove what was cached at or before its event time (a
    ``-q`` row each, the ledger's applied receipt follows), and leave its tombstone (the
    deleting client's only, unless it may delete others' samples; not kept when older than the
    retention, when adds that old are refused anyway); when nothing was removed, a
    ``tombstoned`` receipt says so. Raises :class:`FeatureRejected` (``subject_mismatch``,
    ``not_owner``): then nothing is removed and no tombstone left. Returns its event time."""
    policy = config.tombstones
    t_del = delete_event_time(r, m.timestamp_ms, now, policy)
    gone = judge_delete(r, j.overlay, t_del) if r.op == "delete" else judge_delete_subject(r, j.overlay, t_del)
    if client is not None:
        Authorizer.check_owner(client, r, gone)
    horizon = policy.horizon_us(seconds_to_us(now))
    scope = "" if client is None or client.may_delete_others else client.client_id
    for t in tombstones_of(r, scope, t_del):
        if horizon is None or t.event_us >= horizon:
            j.overlay.put_tombstone(t)
    if gone:
        j.accept_deletes(r.head_id, r.event_id, gone, t_del, r.op == "delete_subject", scope)
        return t_del
    expires = None if policy.retention == 0 else t_del / 1e6 + policy.retention
    j.tombstone_only(Receipt.tombstoned(r.event_id, r.subject_id, r.head_id, [r.sample_id] if r.sample_id else [],
                                        t_del / 1e6, expires, now, scope or None))
    return t_del


# --------------------------------------------------------------------------- step 4: assemble
def use_packed(head: HeadInfo, n_rows: int, config: CoreConfig) -> bool:
    """Whether a head's delta carries packed ledgers instead of rows: always in federated mode
    (never per-sample rows), else when rows would not fit comfortably in one message (rows cost
    n*(d+c)*8 bytes, a packed ledger ~12*d^2 whatever n; the ledger accepts both, same digest)."""
    rows_bytes = n_rows * (head.dim + max(1, head.label_width)) * 8
    return config.federated or rows_bytes > config.max_message_bytes // 2


def assemble_deltas(rows: Mapping[str, HeadRows], heads: CacheView, source_id: str,
                    config: CoreConfig) -> tuple[list[Delta], int]:
    """(one delta per head touched, rows over all of them). Entries follow the groups' order;
    exact integer sums commute, so this gives the same ledger as the event order. Each delta names
    the head's contract (class count and version) its adds were judged against, so the ledger
    sizes the head's label columns from the contract, never from the labels seen."""
    deltas: list[Delta] = []
    n_rows = 0
    for head_id, hr in rows.items():
        head = heads.get_head(head_id)
        assert head is not None, f"rows for head {head_id!r} without head info"
        packed = use_packed(head, len(hr), config)
        entries = []
        for (sign, _kind, by_subject), items in hr.groups.items():
            if items:
                entries.append(_entry(sign, items, head, packed, by_subject))
                n_rows += len(items)
        contract = delta_contract(head, config)
        named = (None, None) if contract is None else (contract.n_outputs, contract.version)
        deltas.append(Delta(head_id, source_id, head.dim, head.frac_bits, head.label_frac_bits, tuple(entries),
                            *named))
    return deltas, n_rows


def _entry(sign: int, items: list[tuple[str, CachedSample]], head: HeadInfo, packed: bool,
           by_subject: bool) -> RowsEntry | PackedEntry:
    event_ids = tuple(e for e, _ in items)
    sample_ids = tuple(cs.sample_id for _, cs in items)
    subject_ids = tuple(cs.subject_id for _, cs in items)
    event_us = tuple(cs.event_us for _, cs in items)  # each row's judged event time (the verifier re-judges)
    clients = tuple(cs.client_id for _, cs in items)  # an add's client, a delete's tombstone scope
    Q = np.stack([cs.q for _, cs in items]).astype(np.int64, copy=False)
    if items[0][1].label_kind == "class":
        labels = np.asarray([cs.label for _, cs in items], dtype=np.int64)
    else:
        labels = np.stack([cs.label for _, cs in items]).astype(np.int64, copy=False)
    if not packed:
        return RowsEntry(sign, event_ids, sample_ids, subject_ids, labels, Q, event_us, by_subject, clients)
    blob = ExactLedger.from_rows(Q, labels, frac_bits=head.frac_bits, label_frac_bits=head.label_frac_bits).to_bytes()
    # The rows' multiset hash, so the ledger's retained-rows hash stays known (docs/design.md s.6).
    mset = MultisetHash.of_rows(Q, labels, head.frac_bits, head.label_frac_bits).to_bytes()
    return PackedEntry(sign, event_ids, sample_ids, subject_ids, blob, mset, event_us, by_subject, clients)


# --------------------------------------------------------------------------- the batch

def featurize_batch(
    messages: Sequence[InMessage],
    cache: CacheView,
    config: CoreConfig,
    encoder: Encoder | None = None,
    *,
    now: float | None = None,
    origins: Mapping[int, int] | None = None,
    auth: Authorizer | None = None,
    transit: TransitGate | None = None,
) -> BatchOutcome:
    """Judge one micro-batch of ONE by-head partition against ``cache`` (read only);
    ``origins``: the last origin offset judged per requests partition (the cache's); ``auth``:
    signed mode (``streams/featurizer/auth.py``; None: UNLEARN_AUTH_MODE=off); ``transit``: the
    partition's transit keys (``streams/featurizer/erasure.py``; None: a sealed input is refused).

    Returns the deltas, dead letters, rejected receipts, cache mutations and new origin offsets;
    raises only for programming errors (messages of several partitions, offsets not ascending)
    or a backbone failure that hits every input of its group (a systemic failure: the worker
    should stop and be restarted rather than dead-letter everything). Steps:
    :func:`check_batch`, :func:`admit_routed`, :func:`parse_batch`, :func:`encode_adds`,
    :func:`judge_batch`, :func:`assemble_deltas`. A batch of copies only decides nothing but its
    last offset."""
    partition = check_batch(messages)
    last = messages[-1].offset
    admitted = admit_routed(messages, origins or {})
    fresh = admitted.messages
    if not fresh:
        return BatchOutcome(partition, last, [], [], [], CacheMutations(), reforwarded=admitted.reforwarded,
                            gaps=admitted.gaps)
    ts = time.time() if now is None else float(now)
    reqs = open_sealed(parse_batch(fresh), transit, config.featurizer.require_sealed_input)
    traces = trace_contexts(fresh, reqs)
    screened = auth.screen(fresh, reqs, ts) if auth is not None else None
    encoded = encode_adds(screened.admitted(reqs) if screened else reqs, config, encoder or RegistryEncoder("auto"))
    view = BatchView(cache, named_samples(reqs), named_tombstones(reqs),  # one cache lookup per batch, not per event
                     named_events(reqs))
    judged = judge_batch(fresh, reqs, encoded, view, config, ts, screened)
    judged.overlay.expired = expired_tombstones(cache, config.tombstones, ts)
    judged.overlay.expired_events = expired_events(cache, config.tombstones.horizon_us(seconds_to_us(ts)),
                                                   EXPIRE_PER_BATCH)
    deltas, n_rows = assemble_deltas(judged.rows, judged.overlay, format_source_id(partition, last, config.stream),
                                     config)
    return BatchOutcome(partition, last, deltas, judged.deadletters, judged.receipts, judged.overlay.mutations(),
                        accepted=judged.accepted, rows=n_rows, origin_offsets=admitted.origin_offsets,
                        reforwarded=admitted.reforwarded, gaps=admitted.gaps,
                        contracts=auto_contracts(judged.overlay.heads.values(), config), traces=traces)


def trace_contexts(messages: Sequence[InMessage], reqs: Sequence[Request | InvalidRequest]) -> dict[str, bytes]:
    """event id -> the valid ``traceparent`` header of its record (infra/tracing.py; an invalid one
    is ignored). Only header bytes are looked at: no span here."""
    out: dict[str, bytes] = {}
    for m, r in zip(messages, reqs, strict=True):
        if m.headers:
            tp = tracing.traceparent_of(m.headers)
            if tp is not None and isinstance(r, Request):
                out.setdefault(r.event_id, tp)
    return out


TRANSIT_REASONS: dict[str, str] = {
    "transit_key_unknown": "a sealed input names a transit key this featurizer does not hold for the head's by-head "
                           "partition (never issued, issued for another partition, destroyed before this featurizer "
                           "took the partition over, or no transit keys here: federated or UNLEARN_SEAL_ROWS off)",
    "transit_key_destroyed": "a sealed input names a transit key this featurizer already destroyed (sealed after its "
                             "use_until, or delivered after its grace period)",
    "transit_open_failed": "a sealed input does not open under its transit key (moved to another event, head, "
                           "subject or sample, or corrupt)",
    "unsealed_input": "a plaintext add while UNLEARN_REQUIRE_SEALED_INPUT is on",
}
"""Reason codes of opening sealed inputs (part of ``FEATURIZER_REASONS``; ``bad_sealed_input`` is the envelope's)."""


class UnopenedRequest(InvalidRequest):
    """A parsed request refused before judging; ``request`` names its ids for the dead letter."""

    def __init__(self, request: Request, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.request = request


DERIVED_KEYS = 4096  # AES keys a featurizer keeps (a few per producer session and transit key)


class DerivedKeys:
    """The AES keys derived per (transit key id, epk), least recently used dropped beyond
    ``size`` (0: none kept, every request derives its own). Not thread-safe: one per featurizer,
    used by its batch loop."""

    def __init__(self, size: int = DERIVED_KEYS) -> None:
        self.size = size
        self._keys: OrderedDict[tuple[str, bytes], AESGCM] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:  # never print key material
        return f"DerivedKeys({len(self._keys)}/{self.size})"

    def get(self, pair: TransitKeyPair, epk: bytes) -> AESGCM:
        """The key for ``pair`` and ``epk``, derived on a miss (TransitError: unusable epk; not kept)."""
        k = (pair.key_id, bytes(epk))
        aead = self._keys.get(k)
        if aead is not None:
            self._keys.move_to_end(k)
            return aead
        aead = opening_key(pair, k[1])
        if self.size > 0:
            self._keys[k] = aead
            while len(self._keys) > self.size:
                self._keys.popitem(last=False)
        return aead

    def drop(self, key_ids: Iterable[str]) -> int:
        """Forget every key derived from these transit keys (destroyed or handed over); how many."""
        gone = set(key_ids)
        stale = [k for k in self._keys if k[0] in gone]
        for k in stale:
            del self._keys[k]
        return len(stale)

    def key_ids(self) -> set[str]:
        """The transit key ids with a derived key here (for tests and erasure checks)."""
        return {kid for kid, _ in self._keys}


@dataclass(frozen=True)
class TransitGate:
    """One by-head partition's transit keys, as the batch sees them; ``derived``: the
    featurizer's derived-key cache (None: derive per request)."""

    lookup: Callable[[str], TransitKeyPair | None]
    was_destroyed: Callable[[str], bool]
    derived: DerivedKeys | None = None


def _open(r: Request, gate: TransitGate | None) -> Request:
    assert isinstance(r.input, SealedInput)
    kid = r.input.key_id
    pair = gate.lookup(kid) if gate is not None else None
    if gate is None or pair is None:
        if gate is not None and gate.was_destroyed(kid):
            raise UnopenedRequest(r, "transit_key_destroyed", f"transit key {kid} was destroyed")
        raise UnopenedRequest(r, "transit_key_unknown", f"transit key {kid} is not held for this head's partition")
    try:
        return open_request(r, pair, gate.derived.get(pair, r.input.epk) if gate.derived is not None else None)
    except TransitError as exc:
        raise UnopenedRequest(r, "transit_open_failed", str(exc)) from None
    except InvalidRequest as exc:  # the opened input is not a valid inner input
        raise UnopenedRequest(r, exc.reason, f"opened sealed input: {exc.detail}") from None


def open_sealed(reqs: Sequence[Request | InvalidRequest], gate: TransitGate | None,
                require_sealed: bool = False) -> list[Request | InvalidRequest]:
    """``reqs`` with every sealed input opened (or the request refused: :class:`UnopenedRequest`);
    with ``require_sealed``, plaintext adds are refused (``unsealed_input``)."""
    out: list[Request | InvalidRequest] = []
    for r in reqs:
        if isinstance(r, Request) and r.op == "add":
            try:
                if isinstance(r.input, SealedInput):
                    r = _open(r, gate)
                elif require_sealed:
                    raise UnopenedRequest(r, "unsealed_input", "this featurizer accepts only adds sealed for transit")
            except UnopenedRequest as exc:
                out.append(exc)
                continue
        out.append(r)
    return out
