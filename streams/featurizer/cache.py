"""The featurizer's feature cache: one sqlite file per partition, its tables and its outbox.

docs/design.md section 2: a delete must reuse the exact q of its add (GPU backbones are not
bit-reproducible), so every accepted add's q is cached, keyed by (head, sample), with a subject
index for ``delete_subject``; the entry is erased when the delete is emitted. Section 4: the cache,
not Kafka, is the source of truth about what was applied.

**The file.** One per partition of the featurizer's input, the by-head topic
(``<data_dir>/featurizer/<stream dir>/p<N>.sqlite``). It is the local copy: the
``featurizer-cache`` changelog topic (``changelog.py``) lets a featurizer on another host rebuild
it. WAL journal. ``synchronous=FULL`` (the default) makes a committed batch survive a process kill
and a power loss (re-judging a batch after losing it could re-quantize a GPU feature to other bits
than the ones the ledger already applied); ``NORMAL`` survives a process kill only, and is what
the service uses when the changelog backs the cache, which then covers a power cut
(docs/featurizer.md, "Durability"). Tables:

- ``samples``: (head_id, sample_id) -> subject, client, add event id, label, q (int64 LE blob);
  index ``samples_by_subject`` (subject_id, head_id) is the subject index;
- ``heads``: what each head fixed at its first add (backbone, input kind, d, label kind/width,
  frac bits);
- ``tombstones``: the deletes' marks (head, kind, sample or subject id, subject, client) ->
  event time (us) and the delete's event id; adds are judged against them (``tombstones.py``,
  remove wins), expired ones are dropped batch by batch;
- ``outbox``: the transactional outbox: encoded messages (deltas, dead letters, receipts, and the
  batch's records for the ``featurizer-cache`` changelog, with their partition and delivery
  phase) written in the same transaction as the cache mutations, deleted once the broker
  acknowledged them;
- ``lineage``: this cache's lineage id and changelog generation (``changelog.resume_plan``);
- ``progress``: the last input offset whose outcome is in this file;
- ``origins``: per requests partition, the last origin offset judged (drops the router's
  re-forwarded copies: ``core.admit_routed``);
- ``meta``: schema version and identity (topic, partition, client) checked on open, and the ids
  and partition count the routing state belongs to (``bind_topic_id``, ``bind_routing``).

**The code.** :func:`open_cache_db` sets the schema and pragmas and checks ``meta``;
:class:`SampleTable`, :class:`TombstoneTable` and :class:`Outbox` read and write their tables'
rows; :class:`FeatureCache`, what the service uses, keeps the rest (position, lineage, origins,
routing state) and the transactions that span tables.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

import numpy as np

from unlearn.streams.featurizer.changelog import LocalPosition, Position
from unlearn.streams.featurizer.core import TombName
from unlearn.streams.featurizer.model import CachedSample, CacheMutations, HeadInfo, OutMessage
from unlearn.streams.featurizer.tombstones import Tombstone, TombstoneKey

__all__ = [
    "CACHE_SCHEMA_VERSION",
    "PAGE_SIZE",
    "WAL_AUTOCHECKPOINT_PAGES",
    "CacheError",
    "Transaction",
    "check_meta",
    "open_cache_db",
    "read_meta",
    "SampleTable",
    "TombstoneTable",
    "Outbox",
    "OutboxRow",
    "FeatureCache",
    "cache_path",
]

CACHE_SCHEMA_VERSION = 1
"""Written into a new cache file and checked on every open: a file of another version is refused
(CacheError; start over with an empty data dir), never read with another meaning."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS heads (
    head_id TEXT PRIMARY KEY,
    backbone TEXT NOT NULL,
    input_kind TEXT NOT NULL,
    dim INTEGER NOT NULL,
    label_kind TEXT NOT NULL,
    label_width INTEGER NOT NULL,
    frac_bits INTEGER NOT NULL,
    label_frac_bits INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS samples (
    head_id TEXT NOT NULL,
    sample_id TEXT NOT NULL,
    subject_id TEXT NOT NULL,
    client_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    label_class INTEGER,
    label_vec BLOB,
    q BLOB NOT NULL,
    event_us INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (head_id, sample_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS samples_by_subject ON samples (subject_id, head_id, sample_id);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    key BLOB,
    value BLOB,
    partition INTEGER,
    phase INTEGER NOT NULL DEFAULT 1,
    CHECK (value IS NOT NULL OR partition IS NOT NULL)  -- only a changelog tombstone has no value
);
CREATE TABLE IF NOT EXISTS progress (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    applied_offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS lineage (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    lineage TEXT NOT NULL,
    generation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS origins (
    partition INTEGER PRIMARY KEY,
    offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tombstones (
    head_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    subject_id TEXT NOT NULL,
    client_id TEXT NOT NULL,
    event_us INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    PRIMARY KEY (head_id, kind, id, subject_id, client_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tombstones_by_time ON tombstones (event_us);
"""

PAGE_SIZE = 65536
"""sqlite page size of a new cache file. A batch writes megabytes (q is in the samples and twice in
the changelog txn, its sample record and delta), mostly as overflow pages: 64 KiB pages make a
batch's commit and its outbox delete several times cheaper than 4 KiB pages
(bench/results/pipeline_bench.md). Existing files keep theirs."""
WAL_AUTOCHECKPOINT_PAGES = 256
"""Checkpoint the WAL at 16 MiB (256 pages of 64 KiB): a few batches per checkpoint, so outbox
pages rewritten batch after batch are copied into the database file once, and the WAL stays small."""


class CacheError(RuntimeError):
    """The cache file is not usable as asked (other identity, newer schema, offset going back)."""


class Transaction:
    """``with Transaction(db):`` one ``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.db.execute("COMMIT" if et is None else "ROLLBACK")


def open_cache_db(path: Path, synchronous: str, identity: Mapping[str, str]) -> sqlite3.Connection:
    """Open (or create) a cache file: pragmas, schema, and the schema version and ``identity``
    checked against (or written into) ``meta``. CacheError if the file belongs to something else."""
    if synchronous not in ("FULL", "NORMAL"):
        raise ValueError(f"synchronous must be FULL or NORMAL, got {synchronous!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), isolation_level=None, timeout=30.0)
    try:
        db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect in a new file only
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("PRAGMA busy_timeout=30000")
        db.execute("PRAGMA secure_delete=ON")  # deleted rows are zeroed in the file (docs/erasure.md)
        db.executescript(_SCHEMA)
        check_meta(db, path, {"schema_version": str(CACHE_SCHEMA_VERSION), **dict(identity)})
    except Exception:
        db.close()
        raise
    return db


def check_meta(db: sqlite3.Connection, path: Path, wanted: Mapping[str, str]) -> None:
    """Write the ``wanted`` meta values not yet there; CacheError if one there differs."""
    with Transaction(db):
        have = dict(db.execute("SELECT key, value FROM meta").fetchall())
        for key, value in wanted.items():
            if key in have and have[key] != value:
                raise CacheError(f"{path}: cache has {key}={have[key]!r}, opened as {value!r}")
            if key not in have:
                db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))


def read_meta(db: sqlite3.Connection, key: str) -> str:
    """A ``meta`` value ("" if absent)."""
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return "" if row is None else str(row[0])


_SAMPLE_COLUMNS = "head_id, sample_id, subject_id, client_id, event_id, label_class, label_vec, q, event_us"
_HEAD_COLUMNS = "head_id, backbone, input_kind, dim, label_kind, label_width, frac_bits, label_frac_bits"
_CHUNK = 500  # ids per IN (...) query


def _i64(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<i8").tobytes()


def _from_i64(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype="<i8").astype(np.int64)


def _sample(row: Sequence[object]) -> CachedSample:
    head_id, sample_id, subject_id, client_id, event_id, label_class, label_vec, q, event_us = row
    label = int(label_class) if label_class is not None else _from_i64(label_vec)  # type: ignore[arg-type,call-overload]
    return CachedSample(str(head_id), str(sample_id), str(subject_id), str(client_id), str(event_id),
                        label, _from_i64(q), int(event_us))  # type: ignore[arg-type,call-overload]


class SampleTable:
    """Reads and writes of ``samples`` and ``heads`` on one connection (writes inside the
    caller's transaction)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def get(self, head_id: str, sample_id: str) -> CachedSample | None:
        row = self._db.execute(f"SELECT {_SAMPLE_COLUMNS} FROM samples WHERE head_id = ? AND sample_id = ?",
                               (head_id, sample_id)).fetchone()
        return None if row is None else _sample(row)

    def get_many(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], CachedSample]:
        """The cached ones of many (head, sample) keys: one query per head and 500 samples."""
        by_head: dict[str, list[str]] = {}
        for head_id, sample_id in set(keys):
            by_head.setdefault(head_id, []).append(sample_id)
        found: dict[tuple[str, str], CachedSample] = {}
        for head_id, ids in by_head.items():
            for i in range(0, len(ids), _CHUNK):
                chunk = ids[i:i + _CHUNK]
                rows = self._db.execute(
                    f"SELECT {_SAMPLE_COLUMNS} FROM samples "
                    f"WHERE head_id = ? AND sample_id IN ({','.join('?' * len(chunk))})",
                    (head_id, *chunk)).fetchall()
                for row in rows:
                    s = _sample(row)
                    found[(s.head_id, s.sample_id)] = s
        return found

    def of_subject(self, head_id: str, subject_id: str) -> list[CachedSample]:
        """The subject's cached samples in one head, ordered by sample id."""
        rows = self._db.execute(
            f"SELECT {_SAMPLE_COLUMNS} FROM samples WHERE subject_id = ? AND head_id = ? ORDER BY sample_id",
            (subject_id, head_id)).fetchall()
        return [_sample(r) for r in rows]

    def of_head(self, head_id: str) -> list[CachedSample]:
        """Every cached sample of a head, ordered by sample id."""
        rows = self._db.execute(
            f"SELECT {_SAMPLE_COLUMNS} FROM samples WHERE head_id = ? ORDER BY sample_id", (head_id,)).fetchall()
        return [_sample(r) for r in rows]

    def all(self) -> list[CachedSample]:
        """Every cached sample, by (head, sample)."""
        rows = self._db.execute(f"SELECT {_SAMPLE_COLUMNS} FROM samples ORDER BY head_id, sample_id").fetchall()
        return [_sample(r) for r in rows]

    def count(self, head_id: str | None = None) -> int:
        if head_id is None:
            return int(self._db.execute("SELECT COUNT(*) FROM samples").fetchone()[0])
        return int(self._db.execute("SELECT COUNT(*) FROM samples WHERE head_id = ?", (head_id,)).fetchone()[0])

    def put(self, samples: Iterable[CachedSample], replace: bool) -> None:
        self._db.executemany(
            f"INSERT {'OR REPLACE ' if replace else ''}INTO samples ({_SAMPLE_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(s.head_id, s.sample_id, s.subject_id, s.client_id, s.event_id,
              s.label if isinstance(s.label, int) else None,
              None if isinstance(s.label, int) else _i64(s.label), _i64(s.q), int(s.event_us))
             for s in samples])

    def drop(self, keys: Iterable[tuple[str, str]]) -> None:
        """Delete (head, sample) keys."""
        self._db.executemany("DELETE FROM samples WHERE head_id = ? AND sample_id = ?", list(keys))

    def head(self, head_id: str) -> HeadInfo | None:
        row = self._db.execute(f"SELECT {_HEAD_COLUMNS} FROM heads WHERE head_id = ?", (head_id,)).fetchone()
        return None if row is None else HeadInfo(*row)

    def heads(self) -> list[HeadInfo]:
        return [HeadInfo(*r) for r in self._db.execute(f"SELECT {_HEAD_COLUMNS} FROM heads ORDER BY head_id")]

    def put_heads(self, heads: Iterable[HeadInfo], replace: bool) -> None:
        for h in heads:
            self._db.execute(
                f"INSERT {'OR REPLACE ' if replace else ''}INTO heads ({_HEAD_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (h.head_id, h.backbone, h.input_kind, h.dim, h.label_kind, h.label_width, h.frac_bits,
                 h.label_frac_bits))


_COLUMNS = "head_id, kind, id, subject_id, client_id, event_us, event_id"


def _tomb(row: Sequence[object]) -> Tombstone:
    head_id, kind, id_, subject_id, client_id, event_us, event_id = row
    return Tombstone(str(head_id), "subject" if kind == "subject" else "sample", str(id_), str(subject_id),
                     str(client_id), int(event_us), str(event_id))  # type: ignore[call-overload]


class TombstoneTable:
    """Reads and writes of ``tombstones`` on one connection (writes inside the caller's transaction)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def of(self, head_id: str, kind: str, id_: str, subject_id: str) -> list[Tombstone]:
        """The tombstones of (head, kind, id, subject), one per client ("" first)."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM tombstones WHERE head_id = ? AND kind = ? AND id = ? AND subject_id = ? "
            "ORDER BY client_id", (head_id, kind, id_, subject_id)).fetchall()
        return [_tomb(r) for r in rows]

    def of_many(self, names: Iterable[TombName]) -> dict[TombName, list[Tombstone]]:
        """The tombstones of many names: one query per head and 500 ids."""
        wanted = set(names)
        by_head: dict[str, set[str]] = {}
        for head_id, _kind, id_, _subject in wanted:
            by_head.setdefault(head_id, set()).add(id_)
        found: dict[TombName, list[Tombstone]] = {n: [] for n in wanted}
        for head_id, id_set in by_head.items():
            ids = sorted(id_set)
            for i in range(0, len(ids), _CHUNK):
                chunk = ids[i:i + _CHUNK]
                rows = self._db.execute(
                    f"SELECT {_COLUMNS} FROM tombstones WHERE head_id = ? AND id IN ({','.join('?' * len(chunk))})"
                    " ORDER BY client_id", (head_id, *chunk)).fetchall()
                for row in rows:
                    t = _tomb(row)
                    name = (t.head_id, t.kind, t.id, t.subject_id)
                    if name in found:
                        found[name].append(t)
        return found

    def expired(self, before_us: int, limit: int) -> list[TombstoneKey]:
        """Keys of up to ``limit`` tombstones dated before ``before_us`` (oldest first)."""
        rows = self._db.execute(
            "SELECT head_id, kind, id, subject_id, client_id FROM tombstones WHERE event_us < ? "
            "ORDER BY event_us LIMIT ?", (int(before_us), int(limit))).fetchall()
        return [(str(h), str(k), str(i), str(s), str(c)) for h, k, i, s, c in rows]

    def all(self) -> list[Tombstone]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM tombstones "
                                "ORDER BY head_id, kind, id, subject_id, client_id").fetchall()
        return [_tomb(r) for r in rows]

    def put(self, tombs: Iterable[Tombstone]) -> None:
        """Insert, or move a tombstone's time forward (never back)."""
        self._db.executemany(
            f"INSERT INTO tombstones ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (head_id, kind, id, subject_id, client_id) DO UPDATE SET "
            "event_us = excluded.event_us, event_id = excluded.event_id WHERE excluded.event_us > event_us",
            [(t.head_id, t.kind, t.id, t.subject_id, t.client_id, int(t.event_us), t.event_id) for t in tombs])

    def drop(self, keys: Iterable[TombstoneKey]) -> None:
        self._db.executemany(
            "DELETE FROM tombstones WHERE head_id = ? AND kind = ? AND id = ? AND subject_id = ? AND client_id = ?",
            list(keys))


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A message waiting for its broker acknowledgement."""

    seq: int
    topic: str
    key: bytes | None
    value: bytes | None  # None: a changelog tombstone
    partition: int | None = None
    phase: int = 1


class Outbox:
    """The ``outbox`` table of one connection whose default ``synchronous`` is ``synchronous``."""

    def __init__(self, db: sqlite3.Connection, synchronous: str) -> None:
        self._db = db
        self.synchronous = synchronous

    def append(self, messages: Iterable[OutMessage]) -> list[int]:
        """Append in one ``executemany`` (inside the caller's transaction) with explicit sequence
        numbers after the highest ever used (AUTOINCREMENT's rule: never reused)."""
        row = self._db.execute("SELECT MAX(s) FROM (SELECT seq AS s FROM sqlite_sequence WHERE name = 'outbox' "
                               "UNION ALL SELECT MAX(seq) FROM outbox)").fetchone()
        base = int(row[0] or 0)
        rows = [(base + i, m.topic, m.key, m.value, m.partition, int(m.phase)) for i, m in enumerate(messages, 1)]
        self._db.executemany("INSERT INTO outbox (seq, topic, key, value, partition, phase) VALUES (?, ?, ?, ?, ?, ?)",
                             rows)
        return [r[0] for r in rows]

    def clear(self) -> None:
        """Delete every row (inside the caller's transaction)."""
        self._db.execute("DELETE FROM outbox")

    def pending(self) -> list[OutboxRow]:
        """Messages written but not yet acknowledged, in write order."""
        rows = self._db.execute("SELECT seq, topic, key, value, partition, phase FROM outbox ORDER BY seq").fetchall()
        return [OutboxRow(int(s), str(t), None if k is None else bytes(k), None if v is None else bytes(v),
                          None if p is None else int(p), int(ph)) for s, t, k, v, p, ph in rows]

    def ack(self, seqs: Iterable[int]) -> None:
        """Forget rows the broker acknowledged: one range DELETE per run of consecutive sequence
        numbers (a batch's rows are one run). Not synced to disk on its own (WAL,
        ``synchronous=NORMAL`` for this transaction): the next batch's commit syncs it, and
        losing it to a power cut only re-sends messages the ledger deduplicates
        (docs/featurizer.md, "The feature cache")."""
        runs: list[list[int]] = []
        for s in sorted({int(s) for s in seqs}):
            if runs and s == runs[-1][1] + 1:
                runs[-1][1] = s
            else:
                runs.append([s, s])
        if not runs:
            return
        self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            with Transaction(self._db):
                self._db.executemany("DELETE FROM outbox WHERE seq BETWEEN ? AND ?", runs)
        finally:
            self._db.execute(f"PRAGMA synchronous={self.synchronous}")


def cache_path(data_dir: str | Path, stream_dir: str, partition: int) -> Path:
    """``<data_dir>/featurizer/<stream_dir>/p<partition>.sqlite`` (``stream_dir`` is percent-quoted
    so any topic / client id makes one safe directory name)."""
    return Path(data_dir) / "featurizer" / quote(stream_dir, safe="._-[]") / f"p{int(partition)}.sqlite"


class FeatureCache:
    """One partition's cache; implements ``model.CacheView`` (and ``core.BulkCacheView``).
    Single-threaded use.

    ``identity`` (e.g. topic, partition, client) is written on first open and must match on
    every later open: a cache file never silently serves another partition or site.
    """

    def __init__(self, path: str | Path, identity: Mapping[str, str] | None = None, *,
                 synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self.synchronous = synchronous
        self._db = open_cache_db(self.path, synchronous, identity or {})
        self._samples = SampleTable(self._db)
        self._tombstones = TombstoneTable(self._db)
        self._outbox = Outbox(self._db, synchronous)

    @classmethod
    def open_partition(cls, data_dir: str | Path, stream_dir: str, partition: int,
                       identity: Mapping[str, str] | None = None, *, synchronous: str = "FULL") -> FeatureCache:
        """The cache file of one by-head partition (created empty if absent)."""
        ident = {"stream_dir": stream_dir, "partition": str(int(partition)), **dict(identity or {})}
        return cls(cache_path(data_dir, stream_dir, partition), ident, synchronous=synchronous)

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
        row = self._db.execute("SELECT applied_offset FROM progress WHERE id = 0").fetchone()
        return -1 if row is None else int(row[0])

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
        return {int(p): int(o) for p, o in self._db.execute("SELECT partition, offset FROM origins").fetchall()}

    @property
    def lineage(self) -> str:
        """This cache's lineage id: the changelog batches it wrote carry it (created on first use)."""
        return self.local_position().lineage

    @property
    def generation(self) -> int:
        """Changelog generation of the last batch written into the outbox (0: none)."""
        return self.local_position().generation

    def local_position(self) -> LocalPosition:
        """(applied offset, lineage, generation), for ``changelog.resume_plan``."""
        row = self._db.execute("SELECT lineage, generation FROM lineage WHERE id = 0").fetchone()
        if row is None:
            with Transaction(self._db):
                self._db.execute("INSERT OR IGNORE INTO lineage (id, lineage, generation) VALUES (0, ?, 0)",
                                 (uuid.uuid4().hex,))
            row = self._db.execute("SELECT lineage, generation FROM lineage WHERE id = 0").fetchone()
        return LocalPosition(self.applied_offset, str(row[0]), int(row[1]))

    # ------------------------------------------------------------------ transactions
    def commit_batch(self, mutations: CacheMutations, messages: Iterable[OutMessage], last_offset: int,
                     generation: int | None = None, origins: Mapping[int, int] | None = None) -> list[int]:
        """ONE transaction: apply the cache mutations, append ``messages`` to the outbox, record
        ``last_offset``, the new last ``origins`` offsets (requests partition -> offset) and the
        changelog ``generation`` the messages carry, if any. Returns the outbox sequence numbers
        (for :meth:`ack_outbox`)."""
        last_offset = int(last_offset)
        self.local_position()  # the lineage row exists
        with Transaction(self._db):
            current = self.applied_offset
            if last_offset <= current:
                raise CacheError(f"{self.path}: batch ends at offset {last_offset}, cache already at {current}")
            self._samples.put_heads(mutations.put_heads, replace=True)
            self._samples.drop(mutations.drop_samples)
            self._samples.put(mutations.put_samples, replace=True)
            self._tombstones.drop(mutations.drop_tombstones)
            self._tombstones.put(mutations.put_tombstones)
            seqs = self._outbox.append(messages)
            self._db.execute(
                "INSERT INTO progress (id, applied_offset) VALUES (0, ?) "
                "ON CONFLICT (id) DO UPDATE SET applied_offset = excluded.applied_offset", (last_offset,))
            self._put_origins(origins or {})
            if generation is not None:
                self._db.execute("UPDATE lineage SET generation = ? WHERE id = 0", (int(generation),))
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

    def _put_origins(self, origins: Mapping[int, int]) -> None:
        self._db.executemany(
            "INSERT INTO origins (partition, offset) VALUES (?, ?) "
            "ON CONFLICT (partition) DO UPDATE SET offset = excluded.offset",
            [(int(p), int(o)) for p, o in origins.items()])

    def replace_all(self, samples: Iterable[CachedSample], heads: Iterable[HeadInfo], position: Position,
                    tombstones: Iterable[Tombstone] = ()) -> None:
        """ONE transaction: the cache becomes a copy rebuilt from the changelog (contents and tombstones, and the
        ``position``'s offset, topic id, generation and routing state) with a NEW lineage and an
        empty outbox: whatever this file held is superseded (its unsent batch, if any, never
        reached Kafka)."""
        applied_offset, generation = position.applied_offset, position.generation
        with Transaction(self._db):
            for table in ("samples", "heads", "outbox", "progress", "lineage", "origins", "tombstones"):
                self._db.execute(f"DELETE FROM {table}")
            self._db.execute("DELETE FROM meta WHERE key IN ('topic_id', 'origin_topic_id', 'route_partitions')")
            for key, value in (("topic_id", position.topic_id), ("origin_topic_id", position.origin_topic_id),
                               ("route_partitions", str(position.route_partitions or ""))):
                if value:
                    self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
            self._put_origins(position.origins)
            self._samples.put_heads(heads, replace=False)
            self._samples.put(samples, replace=False)
            self._tombstones.put(tombstones)
            if applied_offset >= 0:
                self._db.execute("INSERT INTO progress (id, applied_offset) VALUES (0, ?)", (int(applied_offset),))
            self._db.execute("INSERT INTO lineage (id, lineage, generation) VALUES (0, ?, ?)",
                             (uuid.uuid4().hex, int(generation)))

    # ------------------------------------------------------------------ lifecycle
    def purge_deleted(self) -> None:
        """Erasure: checkpoint the WAL into the database file and truncate it, so the pages of
        deleted rows (zeroed by ``secure_delete``) replace the old ones on disk and no copy stays
        in the WAL (docs/erasure.md)."""
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> FeatureCache:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<FeatureCache {self.path}>"
