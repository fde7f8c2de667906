"""The rows of the feature cache's ``samples``, ``heads`` and ``tombstones`` tables, and of where
the partition stands (``progress``, ``ahead``, ``origins``): typed reads (batched, one query per
head and 500 ids) and writes inside the caller's transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from unlearn.ledger.quantization import QMAX
from unlearn.streams.featurizer.cache_file import CacheError
from unlearn.streams.featurizer.cache_view import CachedSample, HeadInfo
from unlearn.streams.featurizer.tombstones import TombName, Tombstone, TombstoneKey

__all__ = ["ProgressTable", "SampleTable", "TombstoneTable"]

_SAMPLE_COLUMNS = ("head_id, sample_id, subject_id, client_id, event_id, label_class, label_vec, q, event_us, "
                   "q_itemsize")
_HEAD_COLUMNS = "head_id, backbone, input_kind, dim, label_kind, label_width, frac_bits, label_frac_bits"
_CHUNK = 500  # ids per IN (...) query


def _i64(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<i8").tobytes()


def _q32(s: CachedSample) -> bytes:
    """q as int32 LE: |q| <= 2^30 always (the quantizer's bound), half the bytes of int64."""
    q = np.asarray(s.q)
    if q.size and (q.max() > QMAX or q.min() < -QMAX):
        raise CacheError(f"sample ({s.head_id!r}, {s.sample_id!r}): |q| exceeds 2^30, not a quantizer's value")
    return np.ascontiguousarray(q, dtype="<i4").tobytes()


def _from_i64(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype="<i8").astype(np.int64)


def _sample(row: Sequence[object]) -> CachedSample:
    head_id, sample_id, subject_id, client_id, event_id, label_class, label_vec, q, event_us, q_itemsize = row
    label = int(label_class) if label_class is not None else _from_i64(label_vec)  # type: ignore[arg-type,call-overload]
    q_values = np.frombuffer(q, dtype="<i4" if q_itemsize == 4 else "<i8").astype(np.int64)  # type: ignore[call-overload]
    return CachedSample(str(head_id), str(sample_id), str(subject_id), str(client_id), str(event_id),
                        label, q_values, int(event_us))  # type: ignore[call-overload]


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
        """The subject's cached samples in one head, ordered by sample id (the index named: without
        it sqlite walked every sample of the head, pipeline_bench.md section 22)."""
        rows = self._db.execute(
            f"SELECT {_SAMPLE_COLUMNS} FROM samples INDEXED BY samples_by_subject "
            "WHERE subject_id = ? AND head_id = ? ORDER BY sample_id",
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
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 4)",
            [(s.head_id, s.sample_id, s.subject_id, s.client_id, s.event_id,
              s.label if isinstance(s.label, int) else None,
              None if isinstance(s.label, int) else _i64(s.label), _q32(s), int(s.event_us))
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
        """The tombstones of many names: one query per (head, kind) and 500 ids, each id a seek on
        the primary key's (head, kind, id) prefix (without the kind, sqlite walked every tombstone
        of the head)."""
        wanted = set(names)
        by_head: dict[tuple[str, str], set[str]] = {}
        for head_id, kind, id_, _subject in wanted:
            by_head.setdefault((head_id, kind), set()).add(id_)
        found: dict[TombName, list[Tombstone]] = {n: [] for n in wanted}
        for (head_id, kind), id_set in sorted(by_head.items()):
            ids = sorted(id_set)
            for i in range(0, len(ids), _CHUNK):
                chunk = ids[i:i + _CHUNK]
                rows = self._db.execute(
                    f"SELECT {_COLUMNS} FROM tombstones WHERE head_id = ? AND kind = ? "
                    f"AND id IN ({','.join('?' * len(chunk))}) ORDER BY client_id", (head_id, kind, *chunk)).fetchall()
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


class ProgressTable:
    """Where the partition stands: the last offset judged (``progress``), the offsets past it that
    the delete lane judged ahead (``ahead``), and the last origin offset judged per requests
    partition (``origins``). Writes run inside the caller's transaction."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def applied_offset(self) -> int:
        row = self._db.execute("SELECT applied_offset FROM progress WHERE id = 0").fetchone()
        return -1 if row is None else int(row[0])

    def ahead(self) -> list[int]:
        return [int(r[0]) for r in self._db.execute("SELECT offset FROM ahead ORDER BY offset").fetchall()]

    def origins(self) -> dict[int, int]:
        return {int(p): int(o) for p, o in self._db.execute("SELECT partition, offset FROM origins").fetchall()}

    def put(self, applied_offset: int, ahead: Iterable[int], origins: Mapping[int, int]) -> None:
        """Set the offset (none below 0), replace the offsets ahead, update the origins given."""
        if applied_offset >= 0:
            self._db.execute("INSERT INTO progress (id, applied_offset) VALUES (0, ?) ON CONFLICT (id) "
                             "DO UPDATE SET applied_offset = excluded.applied_offset", (int(applied_offset),))
        self._db.execute("DELETE FROM ahead")
        self._db.executemany("INSERT INTO ahead (offset) VALUES (?)", [(int(o),) for o in ahead])
        self._db.executemany("INSERT INTO origins (partition, offset) VALUES (?, ?) ON CONFLICT (partition) "
                             "DO UPDATE SET offset = excluded.offset", [(int(p), int(o)) for p, o in origins.items()])
