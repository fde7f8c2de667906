"""The feature cache's sqlite file: where it lives, its schema and pragmas, its ``meta`` identity
and the transactions that span its tables.

One file per partition of the by-head topic, WAL journal. ``synchronous=FULL`` (the default) makes
a committed batch survive a process kill and a power loss (re-judging a batch after losing it
could re-quantize a GPU feature to other bits than the ones the ledger already applied);
``NORMAL`` survives a process kill only, and is what the service uses when the changelog backs
the cache, which then covers a power cut (docs/featurizer.md, "The feature cache", "Durability").
Tables:

- ``samples``: (head_id, sample_id) -> subject, client, add event id, label, q (a blob of
  ``q_itemsize`` bytes per value: 4, int32 LE, as written since schema 2; 8, int64 LE, rows of a
  schema 1 file); index ``samples_by_subject`` (subject_id, head_id) is the subject index;
- ``heads``: what each head fixed at its first add (backbone, input kind, d, label kind/width,
  frac bits);
- ``tombstones``: the deletes' marks (head, kind, sample or subject id, subject, client) ->
  event time (us) and the delete's event id; adds are judged against them (``core.py``,
  remove wins), expired ones are dropped batch by batch;
- ``outbox``: the transactional outbox (``cache_outbox.py``): encoded messages (deltas, dead
  letters, receipts, and the batch's records for the ``featurizer-cache`` changelog, with their
  partition and delivery phase) written in the same transaction as the cache mutations, deleted
  once the broker acknowledged them;
- ``lineage``: this cache's lineage id and changelog generation (``changelog_restore.resume_plan``);
- ``progress``: the last input offset whose outcome is in this file;
- ``origins``: per requests partition, the last origin offset judged (drops the router's
  re-forwarded copies: ``core.admit_routed``);
- ``meta``: schema version and identity (topic, partition, client) checked on open, and the ids
  and partition count the routing state belongs to (``bind_topic_id``, ``bind_routing``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from unlearn.streams.featurizer.events import EVENTS_SCHEMA

__all__ = [
    "CACHE_SCHEMA_VERSION",
    "JOURNAL_SIZE_LIMIT",
    "PAGE_SIZE",
    "WAL_AUTOCHECKPOINT_PAGES",
    "CacheError",
    "Transaction",
    "cache_path",
    "check_meta",
    "open_cache_db",
    "read_meta",
]

CACHE_SCHEMA_VERSION = 2
"""Written into a new cache file and checked on every open: a file of another version is refused
(CacheError; start over with an empty data dir), never read with another meaning. A version 1
file (q always int64) is upgraded in place on open (:func:`_upgrade_v1`); a featurizer that knows
only version 1 refuses a version 2 file rather than misread its int32 q."""

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
    q_itemsize INTEGER NOT NULL DEFAULT 8,  -- bytes per q value in the blob: 4 (int32) or 8 (int64)
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
    headers BLOB,  -- Kafka headers (encode_headers; the trace context), NULL: none
    CHECK (value IS NOT NULL OR partition IS NOT NULL)  -- only a changelog tombstone has no value
);
CREATE TABLE IF NOT EXISTS progress (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    applied_offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ahead (  -- offsets past applied_offset already judged (the delete lane)
    offset INTEGER PRIMARY KEY
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
JOURNAL_SIZE_LIMIT = WAL_AUTOCHECKPOINT_PAGES * PAGE_SIZE
"""Bytes the WAL file keeps when the log restarts (SQLite's ``journal_size_limit``): without it the
file stays as large as the largest log ever was, so its size says nothing of the log's
(``wal_checkpoints.py`` reads it after each commit)."""


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
        db.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("PRAGMA busy_timeout=30000")
        db.execute("PRAGMA secure_delete=ON")  # deleted rows are zeroed in the file (docs/erasure.md)
        db.executescript(_SCHEMA + EVENTS_SCHEMA)
        _add_outbox_headers(db)
        _upgrade_v1(db)
        check_meta(db, path, {"schema_version": str(CACHE_SCHEMA_VERSION), **dict(identity)})
    except Exception:
        db.close()
        raise
    return db


def _add_outbox_headers(db: sqlite3.Connection) -> None:
    """A cache file made before the outbox kept headers gains the column (NULL: no headers, what
    its rows had); schema version 1 either way: an older featurizer ignores the column."""
    if "headers" not in {str(r[1]) for r in db.execute("PRAGMA table_info(outbox)").fetchall()}:
        db.execute("ALTER TABLE outbox ADD COLUMN headers BLOB")


def _upgrade_v1(db: sqlite3.Connection) -> None:
    """A schema 1 file becomes schema 2 in one transaction: ``samples`` gains ``q_itemsize``, 8 for
    the int64 blobs it holds (new rows are written as int32)."""
    with Transaction(db):
        if read_meta(db, "schema_version") != "1":
            return
        if "q_itemsize" not in {str(r[1]) for r in db.execute("PRAGMA table_info(samples)").fetchall()}:
            db.execute("ALTER TABLE samples ADD COLUMN q_itemsize INTEGER NOT NULL DEFAULT 8")
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(CACHE_SCHEMA_VERSION),))


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


def cache_path(data_dir: str | Path, stream_dir: str, partition: int) -> Path:
    """``<data_dir>/featurizer/<stream_dir>/p<partition>.sqlite`` (``stream_dir`` is percent-quoted
    so any topic / client id makes one safe directory name)."""
    return Path(data_dir) / "featurizer" / quote(stream_dir, safe="._-[]") / f"p{int(partition)}.sqlite"
