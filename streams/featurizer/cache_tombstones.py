"""The feature cache's ``tombstones`` table: the deletes' marks (head, kind, sample or subject id,
subject, client) -> event time (us) and the delete's event id; adds are judged against them
(``tombstones.py``, remove wins), expired ones are dropped batch by batch."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

from unlearn.streams.featurizer.tombstones import Tombstone, TombstoneKey
from unlearn.streams.featurizer.view import TombName

__all__ = ["TombstoneTable"]

_COLUMNS = "head_id, kind, id, subject_id, client_id, event_us, event_id"
_CHUNK = 500  # ids per IN (...) query


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
