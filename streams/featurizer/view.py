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

__all__ = ["BatchView", "BulkCacheView", "Overlay", "named_samples"]


def named_samples(reqs: Iterable[Request | InvalidRequest]) -> list[tuple[str, str]]:
    """The (head, sample) pairs the valid adds and deletes of a batch name (what they look up)."""
    return [(r.head_id, r.sample_id) for r in reqs
            if isinstance(r, Request) and r.op in ("add", "delete") and r.sample_id is not None]


@runtime_checkable
class BulkCacheView(Protocol):
    """A cache that can look up many samples at once."""

    def get_samples(self, keys: Iterable[tuple[str, str]]) -> Mapping[tuple[str, str], CachedSample]: ...


class BatchView:
    """``base`` as seen by one batch: the samples named in ``keys`` fetched up front (one query
    when ``base`` is a :class:`BulkCacheView`), heads memoized; anything else is asked of
    ``base``. Only valid while ``base`` does not change (the judging of one batch)."""

    def __init__(self, base: CacheView, keys: Iterable[tuple[str, str]]) -> None:
        self.base = base
        wanted = set(keys)
        if isinstance(base, BulkCacheView):
            found = base.get_samples(wanted)
        else:
            found = {k: s for k in wanted if (s := base.get_sample(*k)) is not None}
        self._samples: dict[tuple[str, str], CachedSample | None] = {k: found.get(k) for k in wanted}
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


class Overlay:
    """The cache as seen after the events of this batch judged so far (a :class:`CacheView`), so
    events of one batch see each other without touching the real cache before the commit."""

    def __init__(self, base: CacheView) -> None:
        self.base = base
        self.samples: dict[tuple[str, str], CachedSample | None] = {}  # None: dropped in this batch
        self.heads: dict[str, HeadInfo] = {}

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

    def mutations(self) -> CacheMutations:
        """The batch's net effect on the cache."""
        return CacheMutations(
            put_samples=tuple(v for v in self.samples.values() if v is not None),
            drop_samples=tuple(k for k, v in self.samples.items() if v is None),
            put_heads=tuple(self.heads.values()),
        )
