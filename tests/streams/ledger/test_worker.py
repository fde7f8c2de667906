"""The ledger worker against a real broker: exactness end to end, kill -9 recovery with several
heads per partition, two workers sharing heads through rebalances, and state that does not match
the log (a recreated topic: refused with a clear error; a lost state topic: rebuilt exactly)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from tests.streams.ledger.support import Stream, assert_final_heads_exact, produce, run_in_thread, worker_settings
from unlearn.common.families import heads_family, state_family
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.ledger import Quantizer, l2_normalize
from unlearn.runtime.clients import consumer_config, quirks
from unlearn.runtime.topic_reader import read_topic
from unlearn.runtime.topics import create_topics, delete_topics, prefixed_topics, wait_for_topics
from unlearn.schemas.delta_codec import Delta, RowsEntry, encode_delta
from unlearn.schemas.head import HeadUpdate, decode_head
from unlearn.schemas.receipts import decode_receipt
from unlearn.services.client.head_reader import HeadFollower, read_heads, wait_for_head
from unlearn.streams.ledger.changelog_store import ChangelogStore
from unlearn.streams.ledger.settings import LedgerSettings

pytestmark = pytest.mark.broker


def test_end_to_end_several_heads_bit_exact(settings: Settings, tmp_path: Path) -> None:
    s = worker_settings(settings, tmp_path)
    stream = Stream(["alpha", "beta", "gamma"], d=12, seed=1)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0", "--loglevel", "info"], s, tmp_path).start()
    try:
        produce(s, [stream.next_message() for _ in range(120)])
        assert_final_heads_exact(s, stream)
    finally:
        worker.stop()
    assert worker.proc is not None and worker.proc.returncode == 0, worker.log_tail()


def test_kill_minus_nine_at_random_points_then_recover(settings: Settings, tmp_path: Path) -> None:
    s = worker_settings(settings, tmp_path)
    stream = Stream(["h1", "h2"], d=10, seed=2)
    rng = np.random.default_rng(3)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0", "--loglevel", "info"], s, tmp_path).start()
    try:
        for _round in range(4):
            produce(s, [stream.next_message() for _ in range(int(rng.integers(40, 90)))])
            time.sleep(float(rng.uniform(1.0, 6.0)))  # somewhere mid-processing / mid-checkpoint
            worker.kill9()
            worker.start()
        produce(s, [stream.next_message() for _ in range(30)])
        assert_final_heads_exact(s, stream, timeout=120)
    finally:
        worker.stop()
    assert worker.starts == 5


def test_two_workers_share_heads_through_a_rebalance(settings: Settings, tmp_path: Path) -> None:
    s = worker_settings(settings, tmp_path)
    stream = Stream([f"head{i}" for i in range(6)], d=8, seed=4)
    a = ServiceProcess("ledger-a", ["ledger", "--worker-id", "a", "--loglevel", "info"], s, tmp_path).start()
    b = ServiceProcess("ledger-b", ["ledger", "--worker-id", "b", "--loglevel", "info"], s, tmp_path)
    try:
        produce(s, [stream.next_message() for _ in range(80)])
        time.sleep(2.0)
        b.start()  # rebalance mid-stream: some partitions move to b
        produce(s, [stream.next_message() for _ in range(80)])
        time.sleep(4.0)
        a.stop()  # and back: b takes everything
        produce(s, [stream.next_message() for _ in range(40)])
        assert_final_heads_exact(s, stream, timeout=120)
        published = read_heads(s)
        assert set(published) == set(stream.heads)
    finally:
        a.stop()
        b.stop()


def test_kill_minus_nine_with_many_heads_per_partition_recovers_fast(settings: Settings, tmp_path: Path) -> None:
    """Eight heads on two partitions (so heads share partitions), kill -9 at random points: every
    head ends exact, and a restarted worker is ready again within seconds."""
    s = worker_settings(settings, tmp_path).with_(partitions=2, topic_prefix=settings.topic_prefix + "p2.")
    create_topics(s)
    stream = Stream([f"m{i}" for i in range(8)], d=6, seed=5)
    rng = np.random.default_rng(6)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path).start()
    recoveries = []
    try:
        worker.wait_for_log("unlearn ledger ready", timeout=60)
        for _ in range(4):
            produce(s, [stream.next_message() for _ in range(int(rng.integers(30, 80)))])
            time.sleep(float(rng.uniform(0.2, 2.5)))
            worker.kill9()
            worker.start()
            recoveries.append(worker.wait_for_log("unlearn ledger ready", timeout=60))
        produce(s, [stream.next_message() for _ in range(20)])
        assert_final_heads_exact(s, stream, timeout=120)
    finally:
        worker.stop()
        delete_topics(s, prefixed_topics(s))
    assert max(recoveries) < 15, recoveries  # loose bound for a loaded CI box; bench.chaos measures


def test_a_recreated_deltas_topic_is_refused_with_a_clear_error(settings: Settings, tmp_path: Path) -> None:
    """State that belongs to an earlier incarnation of ``deltas`` is never used to skip events."""
    s = worker_settings(settings, tmp_path)
    stream = Stream(["r1"], d=5, seed=7)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path).start()
    try:
        produce(s, [stream.next_message() for _ in range(20)])
        assert_final_heads_exact(s, stream)
    finally:
        assert worker.stop() == 0
    delete_topics(s, [s.topic("deltas")])
    time.sleep(1.0)
    create_topics(s)
    wait_for_topics(s, [s.topic("deltas")])
    produce(s, [stream.next_message() for _ in range(3)])
    worker.start()
    assert worker.proc is not None
    assert worker.proc.wait(60) == 2, worker.log_tail()
    assert "recreated" in worker.log_tail() or "log ends at" in worker.log_tail(), worker.log_tail()


def test_a_lost_state_topic_is_rebuilt_from_the_log_with_the_same_versions(settings: Settings,
                                                                         tmp_path: Path) -> None:
    """Without ledger-state the worker replays deltas from offset 0, in other polls than the first
    run: the same (version, digest, retained hash) triples come out again, so a head version never
    names two ledgers, and the re-issued receipts name the same versions and hashes."""
    s = worker_settings(settings, tmp_path)
    stream = Stream(["q1", "q2"], d=5, seed=8)

    def published() -> list[tuple[tuple[str, int], HeadUpdate]]:
        return [((r.topic, r.offset), decode_head(r.value or b"")) for r in read_topic(s, heads_family(s.topic_prefix))]

    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path).start()
    try:
        produce(s, [stream.next_message() for _ in range(40)])
        assert_final_heads_exact(s, stream)
        before = {h: (u.version, u.digest, u.retained_hash) for h, u in read_heads(s).items()}
        first = published()
    finally:
        assert worker.stop() == 0
    delete_topics(s, [t for t in prefixed_topics(s) if ".ledger-state." in t])
    time.sleep(1.0)
    create_topics(s)
    worker.start()
    try:
        worker.wait_for_log("unlearn ledger ready", timeout=60)
        # the rebuild publishes each head's last version as exact (the timer resets a fast one)
        old = {at for at, _ in first}  # (topic, offset): a new generation, or the same topic further on
        deadline = time.monotonic() + 60
        while not all(any((u.head_id, u.version, u.digest, u.retained_hash) == (h, *b)
                          for at, u in published() if at not in old) for h, b in before.items()):
            assert time.monotonic() < deadline, "the rebuild did not publish the same exact versions"
            time.sleep(0.5)
        produce(s, [stream.next_message() for _ in range(10)])
        assert_final_heads_exact(s, stream)
    finally:
        worker.stop()

    digests: dict[tuple[str, int], set[str]] = {}
    hashes: dict[tuple[str, int], set[str | None]] = {}
    for _, u in first + published():
        hashes.setdefault((u.head_id, u.version), set()).add(u.retained_hash)
        if u.digest is not None:  # exact updates carry it; fast ones need not
            digests.setdefault((u.head_id, u.version), set()).add(u.digest)
    assert all(len(d) == 1 for d in digests.values()), "a (head, version) pair named two digests"
    assert all(len(h) == 1 for h in hashes.values()), "a (head, version) pair named two retained hashes"
    # The replay from offset 0 polled other batches than the first run, and re-issued every
    # receipt: each names the version of the message that applied its delete, so they agree.
    named: dict[str, set[tuple[int | None, str | None]]] = {}
    for r in read_topic(s, s.topic("receipts")):
        rec = decode_receipt(r.value or b"")
        assert rec.status == "applied" and rec.digest is None
        named.setdefault(rec.event_id, set()).add((rec.head_version, rec.retained_hash))
    assert named and all(len(v) == 1 for v in named.values()), "a replay issued a conflicting receipt"
    assert all(None not in pair for v in named.values() for pair in v)  # a version and a hash, always


def test_ledger_state_rotates_and_stays_bounded(settings: Settings, tmp_path: Path) -> None:
    """With a small rotation bound the state is rewritten while kills happen: trimmed in place where
    the broker has DeleteRecords (generation 0 stays, its log start moves), else moved to new
    generations (old ones deleted); one topic per partition remains, and every head ends exact."""
    s = worker_settings(settings, tmp_path).with_(changelog_max_bytes=64_000, state_rotate_bytes=64_000,
                                                  heads_retire_seconds=3.0)
    stream = Stream([f"g{i}" for i in range(4)], d=40, seed=9)  # ~40 KB of state per head
    rng = np.random.default_rng(10)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path).start()
    try:
        for _ in range(3):
            worker.wait_for_log("unlearn ledger ready", timeout=60)  # a loaded box starts it slowly
            for _chunk in range(12):  # in small chunks: polls (one head update each) add up to a rotation
                produce(s, [stream.next_message() for _ in range(5)])
                time.sleep(0.25)
            time.sleep(float(rng.uniform(1.0, 3.0)))
            worker.kill9()
            worker.start()
        produce(s, [stream.next_message() for _ in range(20)])
        assert_final_heads_exact(s, stream, timeout=120)
        time.sleep(LedgerSettings.of(s).heads_retire_seconds + 1.5)  # superseded heads topics go after their grace
    finally:
        assert worker.stop() == 0
    state = [t for t in prefixed_topics(s) if ".ledger-state." in t]
    per_partition: dict[str, list[str]] = {}
    for t in state:
        per_partition.setdefault(t.split(".ledger-state.")[1].split(".")[0], []).append(t)
    assert all(len(v) == 1 for v in per_partition.values()), state
    log = worker.log_path.read_text()
    family = heads_family(s.topic_prefix)
    heads_topics = family.select(prefixed_topics(s))
    if quirks(s).delete_records:
        assert all(t.endswith(".g0") for t in state + heads_topics), f"a new generation on a trimming broker: {state}"
        assert "ledger state rewritten (trimmed)" in log
        bounds = {t: _bounds(s, t) for t in state + heads_topics}
        assert all(low > 0 for low, high in bounds.values() if high > 0), f"every topic in use trimmed: {bounds}"
    else:
        assert any(not t.endswith(".g0") for t in state), f"no rotation happened: {state}"
        assert "moved to generation" in log
    # Head updates are rewritten too (here far more often: every update carries a 40x40 posterior).
    assert "head updates rewritten into" in log
    assert len({family.parse(t)[0] for t in heads_topics}) == len(heads_topics), f"one per partition: {heads_topics}"
    digests: dict[tuple[str, int], set[str | None]] = {}
    for r in read_topic(s, family):
        u = decode_head(r.value or b"")
        digests.setdefault((u.head_id, u.version), set()).add(u.digest)
    assert all(len(d - {None}) <= 1 for d in digests.values()), "a republished update named another digest"
    for h in stream.heads:  # what is left still holds every head, at its final version, with a digest
        last = max(v for (head, v) in digests if head == h)
        assert last == stream.n_msgs[h] and digests[(h, last)] - {None}


def test_a_head_too_large_to_publish_is_dead_lettered_not_a_crash_loop(settings: Settings, tmp_path: Path) -> None:
    """Adds that make a head too large for a message (d=400, a sample in each of 400 classes: W
    alone is 1.28 MB, none of its columns zero) must not stop the worker: the head stays exact in
    the ledger, a dead letter says why, and other heads on the same partitions keep being published."""
    from unlearn.schemas.deadletter import decode_deadletter

    s = worker_settings(settings, tmp_path).with_(max_message_bytes=1_000_000)
    q = Quantizer().quantize(l2_normalize(np.random.default_rng(1).normal(size=(400, 400))))
    big = [("big", encode_delta(Delta("big", "test", 400, 30, 0, (RowsEntry(
        +1, [f"e-{i}" for i in part], [f"x{i}" for i in part], ["u"] * 200, part, q[part]),))))
        for part in (np.arange(200), np.arange(200, 400))]  # two deltas: each fits in a message
    stream = Stream(["small"], d=5, seed=11)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path).start()
    try:
        produce(s, [*big, *[stream.next_message() for _ in range(10)]])
        assert_final_heads_exact(s, stream)
        reasons = [decode_deadletter(r.value or b"").reason for r in read_topic(s, s.topic("deadletter"))]
        assert "head_too_large" in reasons
        assert worker.alive
    finally:
        assert worker.stop() == 0


def _family_topics(s: Settings, partition: int) -> dict[str, list[str]]:
    """The partition's ledger-state and heads generation topics on the broker now."""
    topics = prefixed_topics(s)
    out: dict[str, list[str]] = {}
    for fam in (state_family(s.topic_prefix), heads_family(s.topic_prefix)):
        out[fam.name] = [t for t in fam.select(topics) if (pg := fam.parse(t)) is not None and pg[0] == partition]
    return out


def _bounds(s: Settings, topic: str) -> tuple[int, int]:
    """(log start, log end) of ``topic`` partition 0."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(consumer_config(s, f"{s.topic_prefix}bounds"))
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        return int(low), int(high)
    finally:
        c.close()


def _family_bounds(s: Settings, partition: int) -> dict[str, tuple[int, int]]:
    """(log start, log end) of each of the partition's ledger-state and heads topics now."""
    return {t: _bounds(s, t) for ts in _family_topics(s, partition).values() for t in ts}


def _left_from(s: Settings, partition: int, old: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """The topics of ``old`` (``_family_bounds`` then) still holding a record from then: not
    deleted (generations) and not trimmed past their old end (DeleteRecords)."""
    now = _family_topics(s, partition)
    return {t: b for t in old if any(t in ts for ts in now.values()) and (b := _bounds(s, t))[0] < old[t][1]}


def _assert_no_new_generation(s: Settings, partition: int, old: dict[str, tuple[int, int]]) -> None:
    """Where the broker trims, a rewrite stays in the same topics."""
    if quirks(s).delete_records:
        now = _family_topics(s, partition)
        assert sorted(t for ts in now.values() for t in ts) == sorted(old), (now, old)


def _partition_of(s: Settings, head_id: str) -> int:
    return read_heads(s)[head_id].offsets[0][0]


def test_a_delete_rotates_its_partition_away_within_the_bound(settings: Settings, tmp_path: Path) -> None:
    """Issue 11: after a delete, the ledger-state and heads records that hold aggregates from
    before it (a snapshot's S and G, published W) are gone within UNLEARN_ERASURE_ROTATE_SECONDS
    (trimmed below the rewrite where the broker has DeleteRecords, no new topic) or that plus the
    heads' retire grace (generations deleted). The deletes of one window make one rotation, the
    newest snapshot is the post-delete ledger, readers follow, and without deletes nothing extra
    rotates."""
    s = worker_settings(settings, tmp_path).with_(erasure_rotate_seconds=3.0, heads_retire_seconds=3.0,
                                                  reset_every_seconds=0.5)
    stream = Stream(["e1", "e2", "e3", "e4"], d=8, seed=12, delete_p=0.0)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path).start()
    follower = HeadFollower(s)
    try:
        worker.wait_for_log("unlearn ledger ready", timeout=60)
        produce(s, [stream.next_message() for _ in range(40)])
        assert_final_heads_exact(s, stream)
        follower.start()
        parts = {h: _partition_of(s, h) for h in stream.heads}
        # No deletes: no erasure rotation, whatever the time.
        before = {p: _family_topics(s, p) for p in set(parts.values())}
        starts = {p: {t: b[0] for t, b in _family_bounds(s, p).items()} for p in before}
        time.sleep(LedgerSettings.of(s).erasure_rotate_seconds + LedgerSettings.of(s).heads_retire_seconds + 2.0)
        assert {p: _family_topics(s, p) for p in before} == before
        assert {p: {t: b[0] for t, b in _family_bounds(s, p).items()} for p in before} == starts, "nothing trimmed"
        assert "erasure rotation" not in worker.log_path.read_text()

        h = "e1"
        p = parts[h]
        old = before[p]
        assert old["ledger-state"] and old["heads"], old
        old_bounds = _family_bounds(s, p)
        t0 = time.monotonic()
        produce(s, [stream.delete_message(h, 2)])
        time.sleep(1.0)
        produce(s, [stream.delete_message(h, 1)])  # the same window: the same rotation
        ledger = LedgerSettings.of(s)
        deadline = t0 + ledger.erasure_rotate_seconds + ledger.heads_retire_seconds + 15.0  # + a loaded box's slack
        while left := _left_from(s, p, old_bounds):
            assert time.monotonic() < deadline, f"pre-delete records still there: {left} (were {old_bounds})"
            time.sleep(0.2)
        took = time.monotonic() - t0
        assert took >= ledger.erasure_rotate_seconds, took  # the window batches, it does not rotate per delete
        now = _family_topics(s, p)
        assert now["ledger-state"] and now["heads"], now
        _assert_no_new_generation(s, p, old_bounds)
        assert {q: _family_topics(s, q) for q in before if q != p} == {q: t for q, t in before.items() if q != p}
        assert {q: {t: b[0] for t, b in _family_bounds(s, q).items()} for q in before if q != p} == {
            q: v for q, v in starts.items() if q != p}, "only the partition with deletes was trimmed"
        log = worker.log_path.read_text()
        assert log.count(f"deltas partition {p}: erasure rotation done") == 1, log
        assert log.count("erasure rotation done") == 1, "only the partition with deletes rotated"

        # Every head update left on the partition is from after the deletes.
        ref = stream.reference(h)
        for t in now["heads"]:
            for r in read_topic(s, t):
                u = decode_head(r.value or b"")
                if u.head_id == h:
                    assert u.version == stream.n_msgs[h] and u.n_retained == ref.count, (t, u.version)
        # Readers followed the partition (to its new generations, or to the new log start): a later
        # update reaches them.
        got = follower.wait(h, lambda u: u.version == stream.n_msgs[h] and u.mode == "exact", timeout=30)
        assert got.digest == ref.digest()
        produce(s, [stream.next_message() for _ in range(6)])
        assert_final_heads_exact(s, stream)
        for head in stream.heads:
            follower.wait(head, lambda u, head=head: u.version == stream.n_msgs[head], timeout=30)
        assert follower.error is None, follower.error
    finally:
        follower.stop()
        assert worker.stop() == 0
    # The newest snapshot is the ledger after the deletes (and no erasure is pending any more).
    cp, heads = ChangelogStore(s).recover(p)
    assert cp is not None and not cp.erasure_pending
    for head_id, state in heads.items():
        assert state.ledger.digest() == stream.reference(head_id).digest(), head_id


def test_a_worker_killed_mid_erasure_rotation_recovers_exactly(settings: Settings, tmp_path: Path) -> None:
    """kill -9 around an erasure rotation (it takes 50-100 ms here, so few kills land inside it:
    the next test crashes at each step for sure): the restarted worker is exact. And a delete
    already checkpointed but not yet rotated away when the worker dies is still rotated away by
    the next one (the checkpoint carries the pending erasure)."""
    s = worker_settings(settings, tmp_path).with_(erasure_rotate_seconds=1.0, heads_retire_seconds=3.0,
                                                  partitions=1, topic_prefix=settings.topic_prefix + "p1.")
    create_topics(s)
    stream = Stream([f"k{i}" for i in range(8)], d=192, seed=13)  # 8 heads on one partition: ~0.5 s to rotate
    rng = np.random.default_rng(14)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path).start()
    slow = ServiceProcess("ledger-slow", ["ledger", "--worker-id", "w1"], s.with_(erasure_rotate_seconds=60.0),
                          tmp_path)
    try:
        for _ in range(4):
            worker.wait_for_log("unlearn ledger ready", timeout=60)
            produce(s, [stream.next_message() for _ in range(int(rng.integers(20, 40)))])
            worker.wait_for_log("erasure rotation starts", timeout=60)
            time.sleep(float(rng.uniform(0.0, 0.1)))
            worker.kill9()
            worker.start()
        worker.wait_for_log("unlearn ledger ready", timeout=60)
        assert_final_heads_exact(s, stream, timeout=120)
        assert worker.stop() == 0

        # A delete checkpointed (every second) but not rotated (window 60 s) when the worker dies.
        slow.start().wait_for_log("unlearn ledger ready", timeout=60)
        h = max(stream.heads, key=lambda k: len(stream.retained[k]))
        produce(s, [stream.delete_message(h, 1)])
        wait_for_head(s, h, lambda u: u.version == stream.n_msgs[h], timeout=60)
        time.sleep(3 * LedgerSettings.of(s).checkpoint_every_seconds)
        slow.kill9()
        assert "erasure rotation" not in slow.log_path.read_text()
        old = _family_bounds(s, 0)
        worker.start()  # no message to replay: only the checkpoint says a delete is pending
        worker.wait_for_log("erasure rotation done", timeout=60)
        deadline = time.monotonic() + LedgerSettings.of(s).heads_retire_seconds + 20.0
        while left := _left_from(s, 0, old):
            assert time.monotonic() < deadline, (old, left)
            time.sleep(0.2)
        _assert_no_new_generation(s, 0, old)
        produce(s, [stream.next_message() for _ in range(5)])
        assert_final_heads_exact(s, stream, timeout=120)
    finally:
        slow.stop()
        assert worker.stop() == 0
        delete_topics(s, prefixed_topics(s))


class _Crash(BaseException):
    """Stands for kill -9 at one step of an erasure rotation (BaseException: nothing catches it)."""


@pytest.mark.parametrize("step", ["heads_republished", "snapshot_half_written", "checkpoint_written"])
def test_a_crash_at_each_step_of_an_erasure_rotation_recovers_exactly(settings: Settings, tmp_path: Path,
                                                                      step: str) -> None:
    """An in-process worker dies at one step of its erasure rotation: after the heads were
    republished, before the older updates are dropped; with half the snapshots written (no new
    checkpoint); or after the new checkpoint, before the old state is dropped (trimmed, or its
    generation deleted). A worker process then recovers exactly, and every record that existed
    before the delete is gone within the bound (recovery trims, deletes or rotates it)."""

    from unlearn.streams.ledger.worker import LedgerWorker

    # The adds are checkpointed (every 7 messages: 28), the deletes not yet when the rotation
    # starts (the timer is 30 s): so the crash leaves processed messages that closing the consumer
    # (a revoke) must not checkpoint over a half-done rotation, whose heads are in two generations.
    s = worker_settings(settings, tmp_path).with_(erasure_rotate_seconds=2.0, heads_retire_seconds=3.0,
                                                  checkpoint_every_seconds=30.0, partitions=1,
                                                  topic_prefix=settings.topic_prefix + "p1.")
    create_topics(s)
    stream = Stream(["c1", "c2", "c3", "c4"], d=12, seed=15, delete_p=0.0)
    crashed: list[BaseException] = []
    w = LedgerWorker(s, "crashing")
    in_erasure = {"on": False}
    original_checkpoint = w.checkpoint

    def checkpoint(part: int, erasure: bool = False, background: bool = False) -> None:
        in_erasure["on"] = erasure
        original_checkpoint(part, erasure, background)

    def crash_on(name: str, nth: int) -> None:
        original = getattr(w.store, name)
        calls = {"n": 0}

        def wrapped(*args: object, **kwargs: object) -> object:
            if in_erasure["on"]:
                calls["n"] += 1
                if calls["n"] == nth:
                    raise _Crash(step)
            return original(*args, **kwargs)
        setattr(w.store, name, wrapped)

    w.checkpoint = checkpoint  # type: ignore[method-assign]
    {"heads_republished": lambda: crash_on("end_heads_rewrite", 1),
     "snapshot_half_written": lambda: crash_on("write_snapshot", 3),
     "checkpoint_written": lambda: crash_on("end_rewrite", 1)}[step]()

    t, crashed = run_in_thread(w)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path)
    try:
        produce(s, [stream.next_message() for _ in range(28)])
        assert_final_heads_exact(s, stream)
        old = _family_bounds(s, 0)
        t0 = time.monotonic()
        produce(s, [stream.delete_message("c1", 2), stream.delete_message("c2", 1)])
        t.join(60)
        assert not t.is_alive() and len(crashed) == 1 and isinstance(crashed[0], _Crash), crashed
        worker.start()
        worker.wait_for_log("unlearn ledger ready", timeout=60)
        assert_final_heads_exact(s, stream)
        deadline = t0 + LedgerSettings.of(s).erasure_rotate_seconds + LedgerSettings.of(s).heads_retire_seconds + 30.0
        while left := _left_from(s, 0, old):
            assert time.monotonic() < deadline, (old, left)
            time.sleep(0.2)
        assert len(_family_topics(s, 0)["ledger-state"]) == 1
        _assert_no_new_generation(s, 0, old)
        produce(s, [stream.next_message() for _ in range(5)])
        assert_final_heads_exact(s, stream)
    finally:
        w.stop()
        assert worker.stop() == 0
    cp, heads = ChangelogStore(s).recover(0)
    assert cp is not None and set(heads) == set(stream.heads)
    for head_id, state in heads.items():
        assert state.ledger.digest() == stream.reference(head_id).digest(), head_id
    delete_topics(s, prefixed_topics(s))


def test_an_idle_worker_multiplies_the_exact_products_its_folds_left_waiting(settings: Settings,
                                                                            tmp_path: Path) -> None:
    """Two adds of 100 rows each wait unmultiplied in the exact ledger (``product_hold_rows``: their
    fold costs O(r d) on the path of the next message), and the second's, which a delete follows,
    outside the fast head's factor (``factor_hold_rows``: W moved exactly without it, so that the
    delete's receipt does not wait for the factor's update); with nothing fetched the worker multiplies
    and folds them a step of rows at a time, products first (no checkpoint, reset or drift check
    folds them here). The ledger ends bit-identical to the one built from scratch, the factor is
    the ledger's, and the head served is the canonical one within the fast head's tolerance."""
    from unlearn.ledger import CholeskyTracker, cholesky_factor, relative_deviation, solve_head
    from unlearn.streams.ledger.worker import IDLE_STEP_ROWS, LedgerWorker

    s = worker_settings(settings, tmp_path).with_(
        partitions=1, topic_prefix=settings.topic_prefix + "idle.", checkpoint_every_messages=1000,
        checkpoint_every_seconds=600.0, reset_every_seconds=600.0, reset_every_events=100_000)
    create_topics(s)
    stream = Stream(["a"], d=512, seed=11, delete_p=0.0)  # a sync of fewer than d / 2 rows: tracked, no reset
    w = LedgerWorker(s, "idle")
    waiting: list[tuple[int, int, int, int]] = []  # (products, factor) rows waiting before and after each idle step
    idle = w.idle

    def count() -> tuple[int, int]:
        heads = [h for ps in w.owned for h in ps.heads.values()]
        return (sum(h.ledger.products.deferred for h in heads if h.ledger.products is not None),
                sum(len(h.tracked.tracker.waiting) for h in heads if isinstance(h.tracked.tracker, CholeskyTracker)))

    def idle_step() -> None:
        before = count()
        idle()
        waiting.append((*before, *count()))

    w.idle = idle_step  # type: ignore[method-assign]
    t, failed = run_in_thread(w)
    try:
        first = stream.next_message("a", adds=100)
        stream.delete_p = 1.0  # the second message deletes rows of the first: its adds wait for idle time
        produce(s, [first, stream.next_message("a", adds=100)])
        wait_for_head(s, "a", lambda u: u.version >= 2, timeout=60)
        deadline = time.monotonic() + 30
        while not (waiting and waiting[-1][2:] == (0, 0) and max(p + f for p, f, _, _ in waiting) > 0) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        head = w.owned[0].heads["a"]
        assert head.ledger.products is not None and head.ledger.products.deferred == 0
        tracker = head.tracked.tracker
        assert isinstance(tracker, CholeskyTracker) and len(tracker.waiting) == 0
    finally:
        w.stop()
        t.join(60)
    assert not failed, failed
    for producer in (w.producer, w.store.producer):  # a clean stop closed them (clients.close_producer)
        with pytest.raises(RuntimeError, match="closed"):
            producer.flush(0)
    steps = [(p, f, p2, f2) for p, f, p2, f2 in waiting if p + f]
    assert steps and max(f for _, f, _, _ in steps) > 0, steps  # factor rows waited for idle time
    for p, f, p2, f2 in steps:  # one kind of rows per step, the products first, at most a step's worth
        assert (p - p2, f - f2) == ((min(p, IDLE_STEP_ROWS), 0) if p else (0, min(f, IDLE_STEP_ROWS))), steps
    ref = cholesky_factor(head.ledger, head.config.gamma)
    assert np.allclose(np.tril(tracker.L), ref, rtol=0, atol=1e-10 * np.abs(ref).max())
    assert relative_deviation(head.weights, solve_head(head.ledger, head.config.gamma)) < 1e-9
    assert head.version == 2 and head.ledger.digest() == stream.reference("a").digest()
