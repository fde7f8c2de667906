"""A feature cache's WAL checkpoints in a thread (``wal_checkpoints.py``): the thread catches the
WAL up while the writer goes on, a writer that never pauses meets the backstop, nothing is lost,
the erasure purge still truncates the WAL, and close leaves no WAL behind. No broker: sqlite only."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from unlearn.streams.featurizer.cache_file import open_cache_db
from unlearn.streams.featurizer.feature_cache import FeatureCache
from unlearn.streams.featurizer.wal_checkpoints import BACKSTOP_BYTES, BACKSTOP_PAGES, FRAME_BYTES, WalCheckpoints

BLOB = b"\x5a" * 200_000  # a few 64 KiB pages per row, like a batch's outbox
ONE_COMMIT = 8 * FRAME_BYTES  # a row's overflow pages, its b-tree page and the commit's, with room


def wal_size(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


def pending_frames(db: sqlite3.Connection) -> int:
    """Frames in the WAL not yet copied into the database file (a PASSIVE checkpoint's report is
    the count after it ran, so a no-op pass on a connection that copies nothing new)."""
    _, frames, done = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(frames) - int(done)


def writer(path: Path, autocheckpoint: int = 0) -> sqlite3.Connection:
    db = open_cache_db(path, "NORMAL", {})  # 64 KiB pages
    db.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint}")
    db.execute("CREATE TABLE IF NOT EXISTS blobs (i INTEGER PRIMARY KEY, v BLOB)")
    return db


def commits(db: sqlite3.Connection, wal: WalCheckpoints, path: Path, n: int, pause: float = 0.0) -> list[int]:
    """``n`` commits of a 200 KB row (40 rows rewritten over and over), each followed by ``written``
    as the feature cache does; the WAL file's size after each."""
    sizes = []
    for i in range(n):
        db.execute("INSERT OR REPLACE INTO blobs (i, v) VALUES (?, ?)", (i % 40, BLOB))
        wal.written(db)
        sizes.append(wal_size(path))
        time.sleep(pause)
    return sizes


def test_the_writer_never_checkpoints_and_the_thread_catches_up(tmp_path: Path) -> None:
    path = tmp_path / "p0.sqlite"
    db = writer(path)
    wal = WalCheckpoints(path, "NORMAL", gap=0.05)
    try:
        for i in range(20):  # 4 MB: far past what the writer would have checkpointed itself
            db.execute("INSERT INTO blobs (i, v) VALUES (?, ?)", (i, BLOB))
        assert wal.stats["rounds"] == 0 and wal_size(path) > 3_000_000  # nothing nudged the thread yet
        wal.written(db)
        deadline = time.monotonic() + 10
        while wal.stats["rounds"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert wal.stats["rounds"] >= 1
        with closing(sqlite3.connect(str(path))) as other:  # copied into the database file: a no-op pass now
            assert pending_frames(other) == 0
    finally:
        wal.close()
        db.close()
    assert not Path(f"{path}-wal").exists()  # the writer's connection was the last: the WAL is gone
    with closing(sqlite3.connect(str(path))) as db2:
        assert db2.execute("SELECT COUNT(*), SUM(LENGTH(v)) FROM blobs").fetchone() == (20, 20 * len(BLOB))


def test_a_writer_that_never_pauses_meets_the_backstop_and_the_wal_stays_bounded(tmp_path: Path) -> None:
    """The writer commits back to back, faster than the thread copies on a slow disk: past the
    backstop its own commit waits and checkpoints, so the WAL file never passes the backstop by
    more than a commit, whatever the disk (with no checkpoint at all it passed 200 MB; a bound left
    to the race with the thread's passes reached 209 MB on a slow disk); every row is there."""
    path = tmp_path / "p0.sqlite"
    db = writer(path, BACKSTOP_PAGES)
    wal = WalCheckpoints(path, "NORMAL", gap=0.0)
    try:
        sizes = commits(db, wal, path, 1000)  # 200 MB in all
    finally:
        wal.close()
        db.close()
    assert max(sizes) <= BACKSTOP_BYTES + ONE_COMMIT, max(sizes)
    with closing(sqlite3.connect(str(path))) as db2:
        assert db2.execute("SELECT COUNT(*) FROM blobs").fetchone() == (40,)


def test_a_writer_whose_thread_is_stuck_mid_pass_waits_at_the_backstop(tmp_path: Path) -> None:
    """The thread's pass takes as long as a disk makes it (here: its lock held until the WAL is
    past the backstop, and a while longer) while the writer, with no checkpoint of its own, appends
    100 MB: the writer's commit past the backstop waits for the pass and checkpoints, and the log
    restarts; no row is lost."""
    path = tmp_path / "p0.sqlite"
    db = writer(path, 0)
    wal = WalCheckpoints(path, "NORMAL", gap=0.0)
    held = threading.Event()

    def stuck_pass() -> None:
        with wal._pass:
            held.set()
            deadline = time.monotonic() + 60  # at any disk's speed, the writer gets there
            while wal_size(path) <= BACKSTOP_BYTES and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)  # the writer's commit past the backstop waits meanwhile

    stuck = threading.Thread(target=stuck_pass)
    stuck.start()
    held.wait(10)
    try:
        sizes = commits(db, wal, path, 500)
    finally:
        stuck.join()
        wal.close()
        db.close()
    assert wal.stats["backstops"] >= 1
    assert BACKSTOP_BYTES < max(sizes) <= BACKSTOP_BYTES + ONE_COMMIT, max(sizes)
    with closing(sqlite3.connect(str(path))) as db2:
        assert db2.execute("SELECT COUNT(*), SUM(LENGTH(v)) FROM blobs").fetchone() == (40, 40 * len(BLOB))


def test_a_writer_that_pauses_between_commits_is_kept_caught_up_by_the_thread(tmp_path: Path) -> None:
    """Like the featurizer (a batch's judging between two commits): the thread's rounds keep the
    WAL far below what the writer wrote and below the backstop, which the writer never reaches (its
    autocheckpoint is off here); the file keeps ``JOURNAL_SIZE_LIMIT`` (16 MiB) once grown."""
    path = tmp_path / "p0.sqlite"
    db = writer(path, 0)
    wal = WalCheckpoints(path, "NORMAL", gap=0.0)
    try:
        sizes = commits(db, wal, path, 200, pause=0.01)  # 40 MB at 20 MB/s at most: slower than a slow disk copies
    finally:
        wal.close()
        db.close()
    assert max(sizes) < 24_000_000, max(sizes)  # without the thread: 40 MB and growing
    assert wal.stats["rounds"] > 1 and wal.stats["backstops"] == 0


def test_a_feature_cache_with_background_checkpoints_purges_and_closes_as_before(tmp_path: Path) -> None:
    path = tmp_path / "p0.sqlite"
    cache = FeatureCache(path, {"partition": "0"}, synchronous="NORMAL", background_checkpoints=True)
    try:
        assert cache._db.execute("PRAGMA wal_autocheckpoint").fetchone() == (BACKSTOP_PAGES,)
        with cache._db:  # a write of the writer's connection, then the purge of an erasure
            cache._db.execute("CREATE TABLE IF NOT EXISTS scratch (v BLOB)")
            cache._db.execute("INSERT INTO scratch (v) VALUES (?)", (BLOB,))
        stop = threading.Event()

        def nudge() -> None:  # the thread checkpoints while the purge runs
            while not stop.is_set():
                cache._wal.written(cache._db)  # its WAL stays far below the backstop: db is not used
                time.sleep(0.001)

        t = threading.Thread(target=nudge)
        t.start()
        try:
            for _ in range(5):
                cache._db.execute("DELETE FROM scratch")
                cache.purge_deleted()  # asks the thread
                assert cache._wal.wait_truncated(30)
                assert wal_size(path) == 0  # truncated, whatever the thread was doing
                cache._db.execute("INSERT INTO scratch (v) VALUES (?)", (BLOB,))
        finally:
            stop.set()
            t.join()
    finally:
        cache.close()
    assert not Path(f"{path}-wal").exists()
    with FeatureCache(path, {"partition": "0"}) as again:  # reopens: the identity and the rows are there
        assert again.applied_offset == -1
        assert again._db.execute("SELECT COUNT(*) FROM scratch").fetchone() == (1,)


def test_a_failing_round_is_counted_and_the_thread_goes_on(tmp_path: Path) -> None:
    """A round that cannot open the file (gone, unreadable) is logged and counted, and the thread
    tries again after the next commit; close still returns (the writer's commits meet the backstop)."""
    wal = WalCheckpoints(tmp_path / "missing" / "p0.sqlite", "NORMAL", gap=0.0)
    try:
        for n in (1, 2):
            with closing(sqlite3.connect(":memory:")) as db:  # no WAL file: the writer's is not used
                wal.written(db)
            deadline = time.monotonic() + 10
            while wal.stats["errors"] < n and time.monotonic() < deadline:
                time.sleep(0.01)
            assert wal.stats["errors"] == n and wal.stats["rounds"] == 0
    finally:
        wal.close()


def test_a_backstop_checkpoint_that_fails_is_logged_and_the_next_commit_tries_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The writer's own checkpoint past the backstop runs after its commit, which is durable
    already: an error there (a failing disk) is counted and logged, not raised into the batch
    that committed, and the next commit past the backstop checkpoints again."""
    path = tmp_path / "p0.sqlite"
    db = writer(path, 0)
    wal = WalCheckpoints(path, "NORMAL", gap=60.0)  # the thread waits: only the writer checkpoints here

    class FailingDisk:
        def execute(self, sql: str) -> sqlite3.Cursor:
            raise sqlite3.OperationalError("disk I/O error")

    try:
        commits(db, wal, path, 1)  # the first round starts the thread's gap
        with open(f"{path}-wal", "r+b") as f:
            f.truncate(BACKSTOP_BYTES + 1)  # the WAL file as a writer that outran the thread leaves it
        with caplog.at_level("WARNING"):
            wal.written(FailingDisk())  # type: ignore[arg-type]
        assert wal.stats["errors"] == 1 and wal.stats["backstops"] == 1
        assert "not restarted (failed: disk I/O error)" in caplog.text
        wal.written(db)  # the next commit's checkpoint restarts the log
        assert wal.stats["errors"] == 1 and wal.stats["backstops"] == 2
        assert commits(db, wal, path, 1)[0] <= BACKSTOP_BYTES  # the commit after it starts the log over
        assert wal.stats["backstops"] == 2
    finally:
        wal.close()
        db.close()


def test_the_purge_runs_on_the_thread_while_the_writer_goes_on(tmp_path: Path) -> None:
    """The purge is the thread's: asked for while the test holds the thread's pass lock, it returns
    and stays pending (on the caller's thread it would wait for that lock); the writer commits
    meanwhile; once the lock is free the thread truncates, after every purge asked for, and no row
    is lost."""
    path = tmp_path / "p0.sqlite"
    db = writer(path, autocheckpoint=BACKSTOP_PAGES)
    wal = WalCheckpoints(path, "NORMAL", gap=30.0)  # rounds only when asked: the purge cuts the gap
    try:
        for i in range(40):
            with db:
                db.execute("INSERT INTO blobs (v) VALUES (?)", (BLOB,))
            wal.written(db)
            if i % 10 == 9:
                with wal._pass:  # no checkpoint of the thread can run
                    wal.truncate(db, path)
                    with db:
                        db.execute("INSERT INTO blobs (v) VALUES (?)", (BLOB,))
                    assert not wal.wait_truncated(0.05)
        assert wal.wait_truncated(30) and wal.stats["truncates"] >= 1
        assert wal_size(path) == 0 and wal.stats["errors"] == 0
        assert db.execute("SELECT COUNT(*) FROM blobs").fetchone() == (44,)
        with db:  # asked right after a write: the next truncate covers it
            db.execute("DELETE FROM blobs")
        before = wal.stats["truncates"]
        wal.truncate(db, path)
        assert wal.wait_truncated(30) and wal.stats["truncates"] > before and wal_size(path) == 0
    finally:
        wal.close()
        db.close()
