"""A micro-batch's read view of the feature cache: one lookup per batch, not one per event.

Judging a batch asks the cache, per add and per delete, for the (head, sample) it names and, per
add, for the head's first-add facts. Against sqlite that is two queries per event. The cache does
not change while a batch is judged (``featurize_batch`` only reads it; the mutations are
committed afterwards), so fetching every sample the batch names in one query, and each head
once, gives the same answers: :class:`BatchView` does that in front of any
:class:`~streams.featurizer.model.CacheView`, and uses ``get_samples`` (one query) when the cache
has it (:class:`BulkCacheView`, e.g. ``FeatureCache``). :class:`Overlay` is the other half: the
batch's own effect, laid over that view while its events are judged one after another.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from unlearn.schemas.envelope import InvalidRequest, Request

from .model import CachedSample, CacheMutations, CacheView, HeadInfo
from .tombstones import Tombstone, TombstoneKey, add_keys

__all__ = ["BatchView", "BulkCacheView", "Overlay", "base_tombstones", "named_samples", "named_tombstones"]

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

    def __init__(self, base: CacheView, keys: Iterable[tuple[str, str]], tombs: Iterable[TombName] = ()) -> None:
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
        )
