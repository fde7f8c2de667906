"""The feature cache as the pure core sees it: what it holds (:class:`HeadInfo`,
:class:`CachedSample`), how it is read (:class:`CacheView`, :class:`BulkCacheView`), one batch's
view of it and overlay on it, and what a batch changes in it (:class:`CacheMutations`).

**One lookup per batch, not one per event.** Judging asks the cache, per add and per delete, for the
(head, sample) it names and, per add, for the head's first-add facts; against sqlite that is two
queries per event. The cache does not change while a batch is judged (the mutations are committed
afterwards), so fetching every sample the batch names in one query, and each head once, gives the
same answers: :class:`BatchView` does that in front of any :class:`CacheView`, and uses
``get_samples`` (one query) when the cache has it (:class:`BulkCacheView`, e.g. ``FeatureCache``).
:class:`Overlay` is the other half: the batch's own effect, laid over that view while its events
are judged one after another, so "add x, delete x" in one batch works and a duplicate add within a
batch is caught.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from unlearn.schemas.envelope import Request
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.streams.featurizer.events import EventKey, EventMark
from unlearn.streams.featurizer.tombstones import TombName, Tombstone, TombstoneKey, add_keys

__all__ = [
    "HeadInfo",
    "CachedSample",
    "CacheView",
    "CacheMutations",
    "BulkCacheView",
    "named_samples",
    "named_tombstones",
    "base_tombstones",
    "BatchView",
    "Overlay",
]


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
    event_us: int = 0  # the add's event time (tombstones.py, remove wins; 0: dated before every tombstone)

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
    put_events: tuple[EventMark, ...] = ()  # event-id marks (events.py)
    drop_events: tuple[EventKey, ...] = ()  # expired marks

    @property
    def empty(self) -> bool:
        return not (self.put_samples or self.drop_samples or self.put_heads or self.put_tombstones
                    or self.drop_tombstones or self.put_events or self.drop_events)


@runtime_checkable
class BulkCacheView(Protocol):
    """A cache that can look up many samples (and tombstones) at once."""

    def get_samples(self, keys: Iterable[tuple[str, str]]) -> Mapping[tuple[str, str], CachedSample]: ...

    def get_tombstones(self, names: Iterable[TombName]) -> Mapping[TombName, list[Tombstone]]: ...


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
