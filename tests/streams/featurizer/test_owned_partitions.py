"""The owned partitions against a REAL Kafka-protocol broker (conftest: tansu or KAFKA_BOOTSTRAP):
caches move with their partitions on a rebalance, are rebuilt from the changelog on another host
(also after a crash there) and are refused when they belong to another log."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from tests.streams.featurizer.test_service import (
    Reader,
    Running,
    add,
    delete,
    delete_subject,
    ledgers_from,
    produce,
    q_rows,
    reference,
    workload,
)
from unlearn.infra.settings import Settings
from unlearn.runtime.topics import create_topics, delete_topics
from unlearn.schemas.deadletter import decode_deadletter

pytestmark = pytest.mark.broker


def test_two_featurizers_rebalance_and_the_caches_move_with_the_partitions(settings: Settings, tmp_path: Path) -> None:
    """Two processes of one group on one host (one data dir): partitions, and with them their
    cache files, move on a rebalance mid-stream; the result is still exact and nothing repeats."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    reqs, retained, accepted, reasons = workload()
    produce(s, reqs[:20])
    reader = Reader(s)
    a = Running(s, group="fz-pair", max_batch=4)
    b = None
    try:
        reader.until(lambda g: len(ledgers_from(g["deltas"])[1]) >= 5)
        written = {int(f.stem[1:]) for f in (tmp_path / "data" / "featurizer").glob("*/p*.sqlite")}
        b = Running(s, group="fz-pair", max_batch=4)
        deadline = time.monotonic() + 30
        # B joined and got its share (rebalance done)
        while b.service.partitions is None or not b.service.partitions.caches:
            assert time.monotonic() < deadline, "second featurizer got no partitions"
            time.sleep(0.05)
        time.sleep(0.5)  # let B's on_assign finish filling its cache map
        assert b.service.partitions is not None
        assert written & set(b.service.partitions.caches), "no partition with a cache moved to B"
        produce(s, reqs[20:])
        got = reader.until(lambda g: len(g["deadletter"]) >= len(reasons)
                           and set(accepted) <= set(ledgers_from(g["deltas"])[1]), timeout=60)
        time.sleep(0.5)
        got = reader.until(lambda g: True)
        assert a.stop() == 0 and b.stop() == 0
    finally:
        reader.close()
        a.stop_event.set()
        if b is not None:
            b.stop_event.set()
    # both did work (routing, or featurizing: the two heads may both sit in one member's partitions)
    assert all(w.service.stats["routed"] + w.service.stats["events"] > 0 for w in (a, b))
    ledgers, events = ledgers_from(got["deltas"], dedup=False)  # no copies at all: clean handovers
    assert sorted(events) == sorted(accepted + ["forget-s5"] * 2 + ["forget-s6"])
    for head in ("h1", "h2"):
        assert ledgers[head].digest() == reference(retained, head, ledgers[head].n_outputs)
    assert sorted(decode_deadletter(m.value()).reason for m in got["deadletter"]) == reasons


@pytest.mark.parametrize("how", ["recreated_topic", "fresh_broker_log"])
def test_a_cache_from_another_log_is_refused_not_skipped(settings: Settings, tmp_path: Path, how: str) -> None:
    """A featurizer whose cache was built from an earlier incarnation of ``requests`` (a recreated
    topic, or a fresh broker where the log is shorter than the cache's offset) must not resume past
    the new log's events in silence: it stops with an error naming the mismatch."""
    from unlearn.runtime.log_position import StaleStateError
    from unlearn.runtime.topics import wait_for_topics

    s = settings.with_(data_dir=str(tmp_path / "data"))
    reqs, *_ = workload()
    produce(s, reqs)
    run = Running(s)
    reader = Reader(s)
    reader.until(lambda got: len(got["deltas"]) >= 2)  # the cache has advanced
    reader.close()
    assert run.stop() == 0
    delete_topics(s, [s.topic("requests")])
    time.sleep(1.0)
    create_topics(s)
    wait_for_topics(s, [s.topic("requests")])
    if how == "recreated_topic":
        produce(s, reqs[:3])  # new events at offsets the old cache claims to have seen
    run = Running(s)
    err = run.wait_dead(60)
    assert isinstance(err, StaleStateError), err
    assert ("recreated" in str(err)) or ("log ends at" in str(err)), err
    assert "feature cache" in str(err)


def test_a_partition_moves_to_a_host_with_an_empty_data_dir(settings: Settings, tmp_path: Path) -> None:
    """Host A featurizes the adds; host B (a NEW, empty data dir) takes every partition, rebuilds
    the caches from the changelog, and its deletes carry exactly the q (and label) of the adds."""
    s_a = settings.with_(data_dir=str(tmp_path / "host-a"))
    s_b = settings.with_(data_dir=str(tmp_path / "host-b"))
    rng = np.random.default_rng(7)
    adds = [add(f"a{i}", "h1", f"s{i % 4}", f"x{i}", list(rng.normal(size=5)), i % 3) for i in range(16)]
    deletes = [delete(f"d{i}", "h1", f"s{i % 4}", f"x{i}") for i in range(0, 16, 4)]  # subject s0
    deletes += [delete_subject("forget-s1", "h1", "s1")]  # x1, x5, x9, x13
    produce(settings, adds)
    reader = Reader(settings)
    a = Running(s_a, group="fz-move")
    try:
        reader.until(lambda g: {f"a{i}" for i in range(16)} <= set(ledgers_from(g["deltas"])[1]))
        assert a.stop() == 0
        b = Running(s_b, group="fz-move")
        assert b.service.ready.wait(30)
        produce(settings, deletes)
        got = reader.until(lambda g: {"d0", "d4", "d8", "d12", "forget-s1"} <= set(ledgers_from(g["deltas"])[1]))
        time.sleep(0.5)
        got = reader.until(lambda g: True)
        assert b.stop() == 0
    finally:
        reader.close()
        a.stop_event.set()
    assert b.service.stats["replayed"] == 0  # A's last batch was marked delivered: nothing re-sent
    assert b.service.stats["events"] == len(deletes) and not got["deadletter"]
    rows = q_rows(got["deltas"])
    gone = [f"x{i}" for i in range(16) if i % 4 in (0, 1)]
    for sid in gone:
        assert rows[(-1, sid)] == rows[(1, sid)], sid  # the delete reused the add's exact q and label
    assert all(len(v) == 1 for v in rows.values())  # nothing twice
    ledgers, _ = ledgers_from(got["deltas"], dedup=False)
    retained = {("h1", f"x{i}"): (None, i % 3) for i in range(16) if f"x{i}" not in gone}
    assert ledgers["h1"].count == len(retained)


@pytest.mark.parametrize("crash_at", ["after_cache_commit", "after_changelog"])
def test_crash_then_restart_on_another_host(settings: Settings, tmp_path: Path, crash_at: str) -> None:
    """kill -9 style: host A crashes in its second batch after the sqlite commit (nothing sent)
    or after the changelog phase (txn and position durable, no output sent); B, with an empty data
    dir, rebuilds from the changelog (finishing A's half-sent batch from its txn) and nothing is
    lost or doubled. Then A comes back with its stale local cache: it must rebuild, not resume it."""
    s_a = settings.with_(data_dir=str(tmp_path / "host-a"))
    s_b = settings.with_(data_dir=str(tmp_path / "host-b"))
    reqs, retained, accepted, reasons = workload()
    produce(settings, reqs)

    class Crash(Exception):
        pass

    hits: list[str] = []

    def fault(point: str) -> None:
        if point == crash_at:
            hits.append(point)
            if len(hits) == 2:
                raise Crash(point)

    first = Running(s_a, group="fz-move-crash", fault=fault, max_batch=16)
    assert isinstance(first.wait_dead(40), Crash)
    assert any(has_outbox(f) for f in (tmp_path / "host-a").glob("featurizer/*/p*.sqlite"))

    reader = Reader(settings)
    second = Running(s_b, group="fz-move-crash", max_batch=16)
    try:
        got = reader.until(lambda g: len(g["deadletter"]) >= len(reasons)
                           and set(accepted) <= set(ledgers_from(g["deltas"])[1]))
        assert second.stop() == 0
        if crash_at == "after_changelog":
            assert second.service.stats["replayed"] > 0  # A's batch was finished from the changelog
        # A returns with its stale cache (its unsent batch was re-judged by B): rebuild, send nothing old
        extra = [delete("late", "h1", "s0", "x8")]
        del retained[("h1", "x8")]
        produce(settings, extra)
        third = Running(s_a, group="fz-move-crash", max_batch=16)
        got = reader.until(lambda g: "late" in set(ledgers_from(g["deltas"])[1]))
        time.sleep(0.5)
        got = reader.until(lambda g: True)
        assert third.stop() == 0
    finally:
        reader.close()
        second.stop_event.set()
    assert third.service.stats["replayed"] == 0
    ledgers, events = ledgers_from(got["deltas"], dedup=False)  # no copies at all
    assert sorted(events) == sorted([*accepted, "forget-s5", "forget-s5", "forget-s6", "late"])
    for head in ("h1", "h2"):
        assert ledgers[head].digest() == reference(retained, head, ledgers[head].n_outputs)
    assert sorted(decode_deadletter(m.value()).reason for m in got["deadletter"]) == reasons


def has_outbox(path: Path) -> bool:
    """Does the cache file hold unsent outbox rows?"""
    from unlearn.streams.featurizer.feature_cache import FeatureCache

    with FeatureCache(path) as cache:
        return bool(cache.pending_outbox())
