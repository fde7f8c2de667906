"""A feature cache file's WAL checkpoints, off the poll thread (:class:`WalCheckpoints`).

Why: with SQLite's automatic checkpoints, the commit that takes the WAL past its bound also copies
the WAL into the database file and syncs both: 20-30 ms on the featurizer's poll thread, 8 times
per 4,000 `<f4` adds at d = 768 (~50 µs per add), a stall of the batch and of every delete behind
it (bench/results/pipeline_bench.md, section 25). Here the poll thread's connection never
checkpoints but past a backstop (``BACKSTOP_PAGES``); a thread with a connection of its own runs
PASSIVE checkpoints after commits, at most one round per ``gap`` seconds. A PASSIVE checkpoint
never blocks the writer, which appends to the WAL meanwhile; a round repeats while the writer
appended during it (a few passes, each shorter), so the WAL is caught up and restarted by the next
commit. Only a writer that commits faster than the copies go, with no pause, outruns the thread:
once the WAL file passes the backstop, that writer's next :meth:`~WalCheckpoints.written` waits
for the thread's pass in progress and checkpoints the rest itself (RESTART), so the log restarts
at its next commit. That wait is the writer's backpressure, and it bounds the WAL at the backstop
plus one commit whatever the disk: a bound left to the race between a PASSIVE pass and the
writer's appends grew with the disk's slowness (209 MB against 64 MiB on a slow CI disk). The
file's size is the log's because the writer's connection truncates it when the log restarts
(``cache_file.JOURNAL_SIZE_LIMIT``). Durability is SQLite's own: the same WAL and the same
``synchronous`` setting (the checkpoint syncs the WAL before it copies, and the database file after).

The erasure purge (a TRUNCATE checkpoint: no old page may stay in the WAL) runs on the thread too:
on the poll thread it copied everything written since the last round while holding SQLite's
writer lock, 35-70 ms under 1,000 adds/s, every ``UNLEARN_SHRED_EVERY_SECONDS`` while deletes
flow, and a delete arriving meanwhile waited for all of it (bench/results/pipeline_bench.md
section 30). The thread first catches up with PASSIVE passes, which take no writer lock, then
truncates: the writer's commits wait only for what the TRUNCATE itself still has to copy.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

from unlearn.streams.featurizer.cache_file import PAGE_SIZE

__all__ = ["BACKSTOP_BYTES", "BACKSTOP_PAGES", "FRAME_BYTES", "CommitCheckpoints", "WalCheckpoints",
           "checkpoints_for"]

log = logging.getLogger("unlearn.featurizer")

#: Passes of one round at most: each copies only what the writer appended during the one before.
MAX_PASSES = 8
#: The writer's own ``wal_autocheckpoint`` with the thread: 64 MiB of 64 KiB pages (4x the bound of
#: SQLite's automatic checkpoints alone, ``cache_file.WAL_AUTOCHECKPOINT_PAGES``), never reached
#: while the thread keeps up; past it in bytes (``BACKSTOP_BYTES``), the writer waits and checkpoints.
BACKSTOP_PAGES = 1024
#: One page in the WAL file: the page and its 24-byte frame header.
FRAME_BYTES = PAGE_SIZE + 24
#: The WAL file's size past which ``written`` waits.
BACKSTOP_BYTES = BACKSTOP_PAGES * FRAME_BYTES


class CommitCheckpoints:
    """SQLite's own automatic checkpoints, run by the writer's commits (a cache that no service
    runs: tests, tools). :class:`WalCheckpoints` moves them to a thread."""

    def written(self, db: sqlite3.Connection) -> None:
        """The writer ``db`` committed (its commit checkpointed past ``WAL_AUTOCHECKPOINT_PAGES``)."""

    def truncate(self, db: sqlite3.Connection, path: Path) -> None:
        """Checkpoint the WAL of ``db`` into the database file and truncate it (erasure: no old
        page stays in the WAL). A busy result (a reader past ``busy_timeout``) is logged; the next
        purge truncates it."""
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            log.warning("%s: the WAL was not truncated (busy); old pages stay until the next purge", path)

    def wait_truncated(self, timeout: float) -> bool:
        """Whether no purge is pending: always (``truncate`` ran on the caller's thread)."""
        return True

    def close(self) -> None:
        """Nothing to stop."""


class WalCheckpoints(CommitCheckpoints):
    """Checkpoints of the WAL of ``path`` (a cache file already in WAL mode) in a daemon thread,
    after :meth:`written`; :meth:`close` joins it (module docstring)."""

    def __init__(self, path: Path, synchronous: str, gap: float = 0.5) -> None:
        self.path = path
        self.gap = gap
        self.synchronous = synchronous
        self.stats = {"rounds": 0, "errors": 0, "truncates": 0, "backstops": 0}
        self._db: sqlite3.Connection | None = None  # opened by the first round (an error there is the thread's)
        self._wake = threading.Event()
        self._purge = threading.Event()  # a truncate is asked for (it cuts the gap between rounds short)
        self._purged = threading.Condition()
        self._stopping = threading.Event()
        self._hurry = threading.Event()  # a purge or a stop: the gap between rounds ends
        self._pass = threading.Lock()  # held by each checkpoint: SQLite's would get SQLITE_BUSY at once, not wait
        self._thread = threading.Thread(target=self._run, name=f"wal-checkpoints-{path.name}", daemon=True)
        self._thread.start()

    def written(self, db: sqlite3.Connection) -> None:
        """The writer ``db`` committed: a round is due (cheap: sets an event and reads the WAL
        file's size). Past the backstop, first wait for the pass in progress and checkpoint the
        rest here (module docstring)."""
        try:
            size = os.stat(f"{self.path}-wal").st_size
        except FileNotFoundError:
            size = 0
        if size > BACKSTOP_BYTES:
            try:
                with self._pass:
                    busy, _, _ = db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                why = "busy" if busy else ""  # a reader held the WAL past busy_timeout
            except sqlite3.Error as exc:  # the commit is durable already; a disk that fails goes on failing commits
                self.stats["errors"] += 1
                why = f"failed: {exc}"
            self.stats["backstops"] += 1
            if why:  # the next commit tries again
                log.warning("%s: the WAL past its backstop was not restarted (%s)", self.path, why)
        self._wake.set()

    def _round(self) -> None:
        """PASSIVE checkpoints until the WAL is caught up or ``MAX_PASSES`` ran."""
        if self._db is None:
            db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30.0, check_same_thread=False)
            db.execute(f"PRAGMA synchronous={self.synchronous}")
            self._db = db
        for _ in range(MAX_PASSES):
            with self._pass:
                _busy, frames, done = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if done >= frames:
                break
        self.stats["rounds"] += 1

    def truncate(self, db: sqlite3.Connection, path: Path) -> None:
        """Ask the thread for the purge (module docstring) and return at once; the writer's
        connection ``db`` is not used. ``wait_truncated`` waits for it."""
        with self._purged:
            self._purge.set()
        self._wake.set()
        self._hurry.set()

    def wait_truncated(self, timeout: float) -> bool:
        """Whether no purge is pending, waiting up to ``timeout`` seconds for the one asked for."""
        with self._purged:
            return self._purged.wait_for(lambda: not self._purge.is_set(), timeout)

    def _truncate(self) -> None:
        assert self._db is not None  # the round before opened it
        with self._purged:
            self._purge.clear()  # a purge asked for from now on needs a TRUNCATE after this one
        try:
            with self._pass:
                super().truncate(self._db, self.path)
        except sqlite3.Error:
            self._purge.set()  # not done: the next round tries again
            raise
        self.stats["truncates"] += 1
        with self._purged:
            if not self._purge.is_set():
                self._purged.notify_all()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if self._stopping.is_set():
                return
            self._wake.clear()
            try:
                self._round()
                if self._purge.is_set():
                    self._truncate()
            except sqlite3.Error as exc:  # e.g. a full disk: the writer's commits report it too (and meet the backstop)
                self.stats["errors"] += 1
                log.warning("WAL checkpoint of %s failed (retried after the next commit): %s", self.path, exc)
            if not self._purge.is_set():
                self._hurry.wait(self.gap)
            self._hurry.clear()

    def close(self) -> None:
        """Stop the thread (after the pass in progress) and close its connection. A purge still
        pending is moot: the writer's connection, closed last, checkpoints and removes the WAL."""
        self._stopping.set()
        self._wake.set()
        self._hurry.set()
        self._thread.join()
        if self._db is not None:
            self._db.close()


def checkpoints_for(db: sqlite3.Connection, path: Path, synchronous: str, thread: bool) -> CommitCheckpoints:
    """The checkpoints of the writer's connection ``db`` to ``path``: with ``thread``, the writer
    checkpoints only at the backstop from now on and a :class:`WalCheckpoints` does the rest."""
    if not thread:
        return CommitCheckpoints()
    db.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
    return WalCheckpoints(path, synchronous)
