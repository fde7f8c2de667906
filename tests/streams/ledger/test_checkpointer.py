"""The checkpointer's writer thread (streams/ledger/checkpointer.py), against a real broker: a
delete is applied and published while a periodic checkpoint is held half way, the checkpoint then
names the state of the message boundary it was taken at, and its times are reported once, after
the writer's part; a checkpoint that fails stops the worker
with the previous one in force, from which a restart recovers exactly; one over the copy budget
is written on the poll thread; an erasure rotation's snapshots are written by the thread too,
and a delete applied meanwhile is covered by the next one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.streams.ledger.support import Stream, assert_final_heads_exact, produce, run_in_thread, worker_settings
from tests.streams.ledger.test_worker import _bounds
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import quirks
from unlearn.runtime.topics import create_topics, delete_topics, prefixed_topics
from unlearn.streams.ledger.changelog_store import ChangelogStore
from unlearn.streams.ledger.checkpoint_rules import first_needed
from unlearn.streams.ledger.snapshots import HeadState
from unlearn.streams.ledger.worker import LedgerWorker

pytestmark = pytest.mark.broker


def _one_partition(settings: Settings, tmp_path: Path, name: str) -> Settings:
    # checkpoints every 7 messages, never on the clock; no erasure rotation
    s = worker_settings(settings, tmp_path).with_(partitions=1, topic_prefix=settings.topic_prefix + name,
                                                  checkpoint_every_seconds=600.0, erasure_rotate_seconds=0.0)
    create_topics(s)
    return s


def _in_writer_thread() -> bool:
    return threading.current_thread().name.startswith("ledger-checkpoint")


def _wait_for_checkpoint(s: Settings, failed: list[BaseException]) -> tuple[Any, dict[str, HeadState]]:
    """The partition's checkpoint and heads, once a checkpoint record is there (60 s at most)."""
    deadline = time.monotonic() + 60
    while (found := ChangelogStore(s).recover(0))[0] is None:
        assert time.monotonic() < deadline and not failed, f"no checkpoint was written: {failed}"
        time.sleep(0.2)
    return found


class _Times:
    def __init__(self, into: list[tuple[float, float]]) -> None:
        self.into = into

    def observe(self, pause: float, duration: float) -> None:
        self.into.append((pause, duration))


def _wrap_snapshots(w: LedgerWorker, before: Callable[[int], None]) -> None:
    """Call ``before(n)`` ahead of the writer thread's n-th snapshot write (1-based)."""
    original = w.store.write_snapshot
    calls = {"n": 0}

    def write_snapshot(*args: object, **kwargs: object) -> object:
        if _in_writer_thread():
            calls["n"] += 1
            before(calls["n"])
        return original(*args, **kwargs)  # type: ignore[arg-type]
    w.store.write_snapshot = write_snapshot  # type: ignore[method-assign]


def test_a_delete_is_applied_while_a_checkpoint_is_written(settings: Settings, tmp_path: Path) -> None:
    s = _one_partition(settings, tmp_path, "bg1.")
    stream = Stream(["b1", "b2"], d=10, seed=21, delete_p=0.0)
    entered, release = threading.Event(), threading.Event()

    def hold(n: int) -> None:
        entered.set()
        assert release.wait(120), "the test never released the writer"

    w = LedgerWorker(s, "held-writer")
    _wrap_snapshots(w, hold)
    times: list[tuple[float, float]] = []
    w.checkpointer.times = _Times(times)
    t, failed = run_in_thread(w)
    try:
        produce(s, [stream.next_message() for _ in range(7)])  # the 7th makes a checkpoint due
        assert entered.wait(60), f"no checkpoint started: {failed}"
        at_boundary = {h: stream.reference(h).digest() for h in stream.heads if stream.n_msgs[h]}
        # held half way (no checkpoint record yet): a delete and more adds still go through
        produce(s, [stream.delete_message("b1", 2), stream.next_message(), stream.next_message()])
        assert_final_heads_exact(s, stream)
        assert not failed and t.is_alive()
        assert ChangelogStore(s).recover(0)[0] is None, "the checkpoint record came before its snapshots"
        assert not times, "a checkpoint was reported done while its writer was held"
        release.set()
        cp, heads = _wait_for_checkpoint(s, failed)
        assert cp is not None and cp.floor == 7, "the floor is the boundary the copies were taken at"
        assert {h: st.ledger.digest() for h, st in heads.items()} == at_boundary
        assert all(st.meta.applied_offset < 7 for st in heads.values())
        deadline = time.monotonic() + 30
        while not times:  # the next turn of the loop finishes it
            assert time.monotonic() < deadline, "the written checkpoint was never finished"
            time.sleep(0.1)
        assert len(times) == 1
        pause, duration = times[0]
        assert 0 <= pause <= duration, "the partition's pause is a part of the checkpoint's duration"
    finally:
        release.set()
        w.stop()
        t.join(60)
    assert not failed, failed
    cp, heads = ChangelogStore(s).recover(0)  # the clean stop checkpointed the rest, after it
    assert cp is not None and cp.floor == 10
    assert {h: st.ledger.digest() for h, st in heads.items()} == {h: stream.reference(h).digest()
                                                                 for h in stream.heads if stream.n_msgs[h]}
    delete_topics(s, prefixed_topics(s))


def test_a_failed_checkpoint_stops_the_worker_and_a_restart_recovers_exactly(settings: Settings,
                                                                             tmp_path: Path) -> None:
    """The writer thread fails after one of two snapshots of its second checkpoint: the worker
    stops with that error (nothing further is checkpointed), the first checkpoint stays in force,
    and a worker process recovers from it and ends exact."""
    s = _one_partition(settings, tmp_path, "bg2.")
    stream = Stream(["f1", "f2"], d=8, seed=22, delete_p=0.3)

    def fail(n: int) -> None:
        if n == 4:  # the first checkpoint wrote snapshots 1 and 2; the second fails half way
            raise RuntimeError("ledger-state write refused (test)")

    w = LedgerWorker(s, "failing-writer")
    _wrap_snapshots(w, fail)
    t, failed = run_in_thread(w)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path)
    try:
        produce(s, [stream.next_message() for _ in range(7)])
        _wait_for_checkpoint(s, failed)
        produce(s, [stream.next_message() for _ in range(10)])
        t.join(60)
        assert not t.is_alive() and len(failed) == 1 and "refused (test)" in str(failed[0]), failed
        cp, _ = ChangelogStore(s).recover(0)
        assert cp is not None and cp.floor == 7, "the failed checkpoint left the first in force"
        worker.start()
        produce(s, [stream.next_message() for _ in range(5)])
        assert_final_heads_exact(s, stream)
    finally:
        w.stop()
        assert worker.stop() == 0
    delete_topics(s, prefixed_topics(s))


def test_a_checkpoint_over_the_copy_budget_is_written_on_the_poll_thread(settings: Settings, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from unlearn.streams.ledger import checkpointer

    monkeypatch.setattr(checkpointer, "COPY_BUDGET_BYTES", 0)
    s = _one_partition(settings, tmp_path, "bg3.")
    stream = Stream(["o1"], d=6, seed=23, delete_p=0.0)
    threads: list[str] = []
    w = LedgerWorker(s, "no-copies")
    original = w.store.write_snapshot

    def write_snapshot(*args: object, **kwargs: object) -> object:
        threads.append(threading.current_thread().name)
        return original(*args, **kwargs)  # type: ignore[arg-type]
    w.store.write_snapshot = write_snapshot  # type: ignore[method-assign]
    t, failed = run_in_thread(w)
    try:
        produce(s, [stream.next_message() for _ in range(7)])
        _wait_for_checkpoint(s, failed)
    finally:
        w.stop()
        t.join(60)
    assert not failed and threads and not any(name.startswith("ledger-checkpoint") for name in threads), threads
    delete_topics(s, prefixed_topics(s))


def test_an_erasure_rotation_is_written_by_the_writer_thread_and_a_delete_meanwhile_opens_the_next(
        settings: Settings, tmp_path: Path) -> None:
    """The erasure rotation republishes the heads on the poll thread, then its snapshots of every
    head are written by the writer thread while the poll thread goes on: a delete applied while
    they are held goes through at once. That delete is not in the copies, so it opens the next
    window, and the next rotation covers it: in the end the ledger-state holds nothing below
    the last checkpoint's pieces (where the broker trims), and the state is the reference's."""
    s = _one_partition(settings, tmp_path, "bg4.").with_(erasure_rotate_seconds=1.0,
                                                          checkpoint_every_messages=10**6)
    stream = Stream(["r1", "r2"], d=8, seed=24, delete_p=0.0)
    entered, release = threading.Event(), threading.Event()

    def hold(n: int) -> None:
        if n == 1:
            entered.set()
            assert release.wait(120), "the test never released the writer"

    w = LedgerWorker(s, "rotating-writer")
    _wrap_snapshots(w, hold)
    t, failed = run_in_thread(w)
    try:
        produce(s, [stream.next_message() for _ in range(6)])
        h = next(x for x in stream.heads if stream.retained[x])
        produce(s, [stream.delete_message(h, 1)])  # opens the window: a rotation in ~1 s
        assert entered.wait(60), f"no rotation started in the writer thread: {failed}"
        ps = w.owned[0]
        assert ps.erasure_since is None, "the rotation closed its window when it took the copies"
        produce(s, [stream.delete_message(h, 1), stream.next_message()])
        assert_final_heads_exact(s, stream)  # the poll thread was not held
        assert ps.erasure_since is not None, "the delete applied meanwhile opened the next window"
        assert ChangelogStore(s).recover(0)[0] is None, "the held rotation wrote no record yet"
        release.set()
        deadline = time.monotonic() + 60
        while ps.erasure_since is not None or 0 in w.checkpointer._writing:  # the next rotation, and its finish
            assert time.monotonic() < deadline and not failed, f"the next window never rotated: {failed}"
            time.sleep(0.1)
        cp, heads = ChangelogStore(s).recover(0)
        assert cp is not None and cp.floor == sum(stream.n_msgs.values()) and not cp.erasure_pending
        assert {x: st.ledger.digest() for x, st in heads.items()} == {x: stream.reference(x).digest()
                                                                      for x in stream.heads if stream.n_msgs[x]}
        if quirks(s).delete_records:
            topic = ChangelogStore(s).topic(0)
            assert _bounds(s, topic)[0] == first_needed(cp.heads), "everything below the last rotation is trimmed"
    finally:
        release.set()
        w.stop()
        t.join(60)
    assert not failed, failed
    delete_topics(s, prefixed_topics(s))
