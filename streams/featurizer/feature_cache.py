"""The featurizer's feature cache: one sqlite file per by-head partition, what the service and the
core read and write.

docs/design.md section 2: a delete must reuse the exact q of its add (GPU backbones are not
bit-reproducible), so every accepted add's q is cached, keyed by (head, sample), with a subject
index for ``delete_subject``; the entry is erased when the delete is emitted. Section 4: the cache,
not Kafka, is the source of truth about what was applied. :class:`FeatureCache` keeps the position,
lineage, origins and routing state and the transactions that span tables; the file is
``cache_file.py``, the rows ``cache_tables.py`` and ``cache_outbox.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

from unlearn.streams.featurizer.batch_io import OutMessage
from unlearn.streams.featurizer.cache_file import (
    CacheError,
    Transaction,
    cache_path,
    check_meta,
    open_cache_db,
    read_meta,
)
from unlearn.streams.featurizer.cache_outbox import Outbox, OutboxRow
from unlearn.streams.featurizer.cache_tables import ProgressTable, SampleTable, TombstoneTable
from unlearn.streams.featurizer.cache_view import CachedSample, CacheMutations, HeadInfo
from unlearn.streams.featurizer.changelog_records import Position
from unlearn.streams.featurizer.changelog_restore import LocalPosition
from unlearn.streams.featurizer.events import EventKey, EventMark, EventTable
from unlearn.streams.featurizer.tombstones import TombName, Tombstone, TombstoneKey
from unlearn.streams.featurizer.wal_checkpoints import checkpoints_for

__all__ = ["FeatureCache"]


class FeatureCache:
    """One partition's cache; implements ``model.CacheView`` (and ``core.BulkCacheView``).
    Single-threaded use.

    ``identity`` (e.g. topic, partition, client) is written on first open and must match on
    every later open: a cache file never silently serves another partition or site.
    """

    def __init__(self, path: str | Path, identity: Mapping[str, str] | None = None, *,
                 synchronous: str = "FULL", background_checkpoints: bool = False) -> None:
        self.path = Path(path)
        self.synchronous = synchronous
        self._db = open_cache_db(self.path, synchronous, identity or {})
        self._wal = checkpoints_for(self._db, self.path, synchronous, thread=background_checkpoints)
        self._samples = SampleTable(self._db)
        self._tombstones = TombstoneTable(self._db)
        self._events = EventTable(self._db)
        self._outbox = Outbox(self._db, synchronous)
        self._progress = ProgressTable(self._db)

    @classmethod
    def open_partition(cls, data_dir: str | Path, stream_dir: str, partition: int,
                       identity: Mapping[str, str] | None = None, *, synchronous: str = "FULL",
                       background_checkpoints: bool = False) -> FeatureCache:
        """The cache file of one by-head partition (created empty if absent)."""
        ident = {"stream_dir": stream_dir, "partition": str(int(partition)), **dict(identity or {})}
        return cls(cache_path(data_dir, stream_dir, partition), ident, synchronous=synchronous,
                   background_checkpoints=background_checkpoints)

    # ------------------------------------------------------------------ CacheView: what the core reads
    def get_sample(self, head_id: str, sample_id: str) -> CachedSample | None:
        return self._samples.get(head_id, sample_id)

    def get_samples(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], CachedSample]:
        """The cached ones of many (head, sample) keys in few queries (``core.BatchView``)."""
        return self._samples.get_many(keys)

    def subject_samples(self, head_id: str, subject_id: str) -> list[CachedSample]:
        """The subject's cached samples in one head, ordered by sample id."""
        return self._samples.of_subject(head_id, subject_id)

    def get_head(self, head_id: str) -> HeadInfo | None:
        return self._samples.head(head_id)

    def tombstones(self, head_id: str, kind: str, id_: str, subject_id: str) -> list[Tombstone]:
        """The tombstones of (head, kind, id, subject), one per client ("" first)."""
        return self._tombstones.of(head_id, kind, id_, subject_id)

    def get_tombstones(self, names: Iterable[TombName]) -> dict[TombName, list[Tombstone]]:
        """The tombstones of many (head, kind, id, subject) names in few queries (``core.BatchView``)."""
        return self._tombstones.of_many(names)

    def expired_tombstones(self, before_us: int, limit: int) -> list[TombstoneKey]:
        """Keys of up to ``limit`` tombstones dated before ``before_us`` (oldest first)."""
        return self._tombstones.expired(before_us, limit)

    def get_events(self, keys: Iterable[EventKey]) -> dict[EventKey, EventMark]:
        """The event-id marks of many (head, event id) keys (``core.BatchView``)."""
        return self._events.get_many(keys)

    def get_event(self, head_id: str, event_id: str) -> EventMark | None:
        return self._events.get_many([(head_id, event_id)]).get((head_id, event_id))

    def expired_events(self, before_us: int, limit: int) -> list[EventKey]:
        """Up to ``limit`` marks dated before ``before_us`` whose sample is not cached (:class:`EventTable`)."""
        return self._events.expired(before_us, limit)

    def all_events(self) -> list[EventMark]:
        """Every event-id mark (a seed of the changelog; tests)."""
        return self._events.all()

    # ------------------------------------------------------------------ whole contents (seeds, audits, tests)
    def all_samples(self) -> list[CachedSample]:
        """Every cached sample, by (head, sample) (a seed of the changelog)."""
        return self._samples.all()

    def samples(self, head_id: str) -> list[CachedSample]:
        """Every cached sample of a head, ordered by sample id (audits, retrain references)."""
        return self._samples.of_head(head_id)

    def all_tombstones(self) -> list[Tombstone]:
        """Every tombstone (a seed of the changelog; tests)."""
        return self._tombstones.all()

    def heads(self) -> list[HeadInfo]:
        return self._samples.heads()

    def count(self, head_id: str | None = None) -> int:
        """Cached samples (in one head, or all)."""
        return self._samples.count(head_id)

    def pending_outbox(self) -> list[OutboxRow]:
        """Messages written but not yet acknowledged, in write order."""
        return self._outbox.pending()

    def ack_outbox(self, seqs: Iterable[int]) -> None:
        """Forget outbox rows the broker acknowledged (:meth:`Outbox.ack`)."""
        self._outbox.ack(seqs)

    # ------------------------------------------------------------------ position and routing state
    @property
    def applied_offset(self) -> int:
        """Last by-head offset whose outcome is in this file; -1 for a fresh cache."""
        return self._progress.applied_offset()

    def ahead_offsets(self) -> list[int]:
        """Offsets past :attr:`applied_offset` whose outcome is in this file too (the delete lane:
        judged ahead of the records before them), ascending."""
        return self._progress.ahead()

    @property
    def topic_id(self) -> str:
        """Id of the input (by-head) topic this cache was built from ("" if never recorded)."""
        return read_meta(self._db, "topic_id")

    def bind_topic_id(self, topic_id: str) -> None:
        """Record the topic incarnation this cache follows (once; a different id is an error)."""
        if topic_id and self.topic_id != topic_id:
            check_meta(self._db, self.path, {"topic_id": topic_id})

    @property
    def origin_topic_id(self) -> str:
        """Id of the requests topic the origin offsets belong to ("" if never recorded)."""
        return read_meta(self._db, "origin_topic_id")

    @property
    def route_partitions(self) -> int:
        """The by-head partition count this cache's heads were routed by (0: unknown)."""
        return int(read_meta(self._db, "route_partitions") or 0)

    def bind_routing(self, origin_topic_id: str, route_partitions: int) -> None:
        """Record the requests topic incarnation and the by-head partition count the routing
        state belongs to (once; a different value is an error: check before binding)."""
        wanted = {"route_partitions": str(int(route_partitions))}
        if origin_topic_id:
            wanted["origin_topic_id"] = origin_topic_id
        check_meta(self._db, self.path, wanted)

    def origin_offsets(self) -> dict[int, int]:
        """Requests partition -> the last origin offset judged from it."""
        return self._progress.origins()

    @property
    def lineage(self) -> str:
        """This cache's lineage id: the changelog batches it wrote carry it (created on first use)."""
        return self.local_position().lineage

    @property
    def generation(self) -> int:
        """Changelog generation of the last batch written into the outbox (0: none)."""
        return self.local_position().generation

    def local_position(self) -> LocalPosition:
        """(applied offset, lineage, generation), for :func:`~streams.featurizer.changelog_restore.resume_plan`."""
        row = self._db.execute("SELECT lineage, generation FROM lineage WHERE id = 0").fetchone()
        if row is None:
            with Transaction(self._db):
                self._db.execute("INSERT OR IGNORE INTO lineage (id, lineage, generation) VALUES (0, ?, 0)",
                                 (uuid.uuid4().hex,))
            row = self._db.execute("SELECT lineage, generation FROM lineage WHERE id = 0").fetchone()
        return LocalPosition(self.applied_offset, str(row[0]), int(row[1]))

    # ------------------------------------------------------------------ transactions
    def commit_batch(self, mutations: CacheMutations, messages: Iterable[OutMessage], last_offset: int,
                     generation: int | None = None, origins: Mapping[int, int] | None = None,
                     ahead: Iterable[int] = (), lane: bool = False) -> list[int]:
        """ONE transaction: apply the cache mutations, append ``messages`` to the outbox, record
        ``last_offset``, the new last ``origins`` offsets (requests partition -> offset), the
        offsets judged ``ahead`` of it (all of them: they replace the file's) and the changelog
        ``generation`` the messages carry, if any. A batch moves the offset forward; a ``lane``
        batch (``delete_lane.py``) leaves it where it is and only adds offsets ahead. Returns the
        outbox sequence numbers (for :meth:`ack_outbox`)."""
        last_offset = int(last_offset)
        ahead = sorted({int(o) for o in ahead})
        self.local_position()  # the lineage row exists
        with Transaction(self._db):
            current = self.applied_offset
            if lane and (last_offset != current or current < 0):
                raise CacheError(f"{self.path}: a lane batch keeps the offset at {current} (>= 0), got {last_offset}")
            if not lane and last_offset <= current:
                raise CacheError(f"{self.path}: batch ends at offset {last_offset}, cache already at {current}")
            if ahead and ahead[0] <= last_offset:
                raise CacheError(f"{self.path}: offset {ahead[0]} judged ahead is not past {last_offset}")
            self._samples.put_heads(mutations.put_heads, replace=True)
            self._samples.drop(mutations.drop_samples)
            self._samples.put(mutations.put_samples, replace=True)
            self._tombstones.drop(mutations.drop_tombstones)
            self._tombstones.put(mutations.put_tombstones)
            self._events.drop(mutations.drop_events)
            self._events.put(mutations.put_events)
            seqs = self._outbox.append(messages)
            self._progress.put(last_offset, ahead, origins or {})
            if generation is not None:
                self._db.execute("UPDATE lineage SET generation = ? WHERE id = 0", (int(generation),))
        self._wal.written(self._db)  # a round of checkpoints is due (wal_checkpoints.py)
        return seqs

    def replace_outbox(self, messages: Iterable[OutMessage], generation: int) -> list[int]:
        """ONE transaction: the outbox becomes ``messages`` (a changelog seed that includes what was
        pending) and the changelog generation ``generation``."""
        self.local_position()
        with Transaction(self._db):
            self._outbox.clear()
            seqs = self._outbox.append(messages)
            self._db.execute("UPDATE lineage SET generation = ? WHERE id = 0", (int(generation),))
        return seqs

    def replace_all(self, samples: Iterable[CachedSample], heads: Iterable[HeadInfo], position: Position,
                    tombstones: Iterable[Tombstone] = (), events: Iterable[EventMark] = ()) -> None:
        """ONE transaction: the cache becomes a copy rebuilt from the changelog (contents and tombstones, and the
        ``position``'s offset, topic id, generation and routing state) with a NEW lineage and an
        empty outbox: whatever this file held is superseded (its unsent batch, if any, never
        reached Kafka)."""
        applied_offset, generation = position.applied_offset, position.generation
        with Transaction(self._db):
            for table in ("samples", "heads", "outbox", "progress", "lineage", "origins", "tombstones", "events",
                          "ahead"):
                self._db.execute(f"DELETE FROM {table}")
            self._db.execute("DELETE FROM meta WHERE key IN ('topic_id', 'origin_topic_id', 'route_partitions')")
            for key, value in (("topic_id", position.topic_id), ("origin_topic_id", position.origin_topic_id),
                               ("route_partitions", str(position.route_partitions or ""))):
                if value:
                    self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
            self._samples.put_heads(heads, replace=False)
            self._samples.put(samples, replace=False)
            self._tombstones.put(tombstones)
            self._events.put(events)
            self._progress.put(applied_offset, [o for o in position.ahead if o > applied_offset], position.origins)
            self._db.execute("INSERT INTO lineage (id, lineage, generation) VALUES (0, ?, ?)",
                             (uuid.uuid4().hex, int(generation)))

    # ------------------------------------------------------------------ lifecycle
    def purge_deleted(self) -> None:
        """Erasure: checkpoint the WAL into the database file and truncate it, so the pages of
        deleted rows (zeroed by ``secure_delete``) replace the old ones on disk and no copy stays
        in the WAL (docs/erasure.md); the checkpoint thread's, if any (``wal_checkpoints.py``)."""
        self._wal.truncate(self._db, self.path)

    def close(self) -> None:
        self._wal.close()  # first: the writer's connection is then the last, which removes the WAL
        self._db.close()

    def __enter__(self) -> FeatureCache:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<FeatureCache {self.path}>"
