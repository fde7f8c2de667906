"""The feature cache's transactional outbox: messages (deltas, dead letters, receipts, and the
changelog's phase-0 records) written in the same transaction as the cache mutations, deleted
once the broker acknowledged them (docs/featurizer.md, "Crash consistency").
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from unlearn.streams.featurizer.batch_io import OutMessage
from unlearn.streams.featurizer.cache_file import Transaction
from unlearn.streams.featurizer.changelog_records import decode_headers, encode_headers

__all__ = ["Outbox", "OutboxRow"]


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A message waiting for its broker acknowledgement."""

    seq: int
    topic: str
    key: bytes | None
    value: bytes | None  # None: a changelog tombstone
    partition: int | None = None
    phase: int = 1
    headers: tuple[tuple[str, bytes | None], ...] = ()


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
        rows = [(base + i, m.topic, m.key, m.value, m.partition, int(m.phase),
                 encode_headers(m.headers) if m.headers else None) for i, m in enumerate(messages, 1)]
        self._db.executemany("INSERT INTO outbox (seq, topic, key, value, partition, phase, headers) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        return [r[0] for r in rows]

    def clear(self) -> None:
        """Delete every row (inside the caller's transaction)."""
        self._db.execute("DELETE FROM outbox")

    def pending(self) -> list[OutboxRow]:
        """Messages written but not yet acknowledged, in write order."""
        rows = self._db.execute("SELECT seq, topic, key, value, partition, phase, headers FROM outbox "
                                "ORDER BY seq").fetchall()
        return [OutboxRow(int(s), str(t), None if k is None else bytes(k), None if v is None else bytes(v),
                          None if p is None else int(p), int(ph), decode_headers(None if h is None else bytes(h)))
                for s, t, k, v, p, ph, h in rows]

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
