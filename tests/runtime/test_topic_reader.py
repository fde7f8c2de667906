"""Reading a topic family on a real broker while its writer rotates it: readers read the newest
generation of each writer partition, ``TopicFollower`` moves to a new generation (from its
beginning) and lets go of the old one before the writer deletes it."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Producer

from unlearn.common.families import heads_family
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import producer_config
from unlearn.runtime.topic_reader import FAMILY_RELIST_S, LogRecord, TopicFollower, read_topic
from unlearn.runtime.topics import delete_topics, ensure_topic

pytestmark = pytest.mark.broker


def put(settings: Settings, topic: str, *values: bytes) -> None:
    ensure_topic(settings, topic)
    p = Producer(producer_config(settings))
    for v in values:
        p.produce(topic, key=b"k", value=v)
    assert p.flush(10) == 0


def test_read_topic_reads_the_newest_generation_of_each_partition(settings: Settings) -> None:
    fam = heads_family(settings.topic_prefix)
    assert read_topic(settings, fam, timeout=10) == []  # no topic yet: empty, not an error
    put(settings, fam.topic(0, 10), b"c")
    put(settings, fam.topic(0, 9), b"a", b"b")
    put(settings, fam.topic(1, 0), b"d")
    put(settings, settings.topic("elsewhere"), b"x")  # not a member
    got = read_topic(settings, fam, timeout=20)
    assert [r.value for r in got] == [b"c", b"d"]  # g9 is superseded by g10 (numerically newer)
    assert [r.topic for r in got][-1] == fam.topic(1, 0)


def test_follower_follows_a_rotation(settings: Settings) -> None:
    fam = heads_family(settings.topic_prefix)
    put(settings, fam.topic(0, 1), b"old-1", b"old-2")
    seen: list[LogRecord] = []
    arrived = threading.Condition()

    def on_record(r: LogRecord) -> None:
        with arrived:
            seen.append(r)
            arrived.notify_all()

    def wait_for(value: bytes, timeout: float = 15.0) -> None:
        with arrived:
            assert arrived.wait_for(lambda: any(r.value == value for r in seen), timeout), [r.value for r in seen]

    f = TopicFollower(settings, fam, on_record, role="test-follower").start(wait_assigned=20)
    try:
        assert f.caught_up.wait(15)
        wait_for(b"old-2")
        # the writer rotates: the new generation first; the old one goes after a grace period,
        # by which time the follower has let go of it (else the client would crash)
        put(settings, fam.topic(0, 2), b"new-1")
        wait_for(b"new-1")
        deadline = time.monotonic() + 3 * FAMILY_RELIST_S
        while fam.topic(0, 1) in {t for t, _ in f.partitions} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {t for t, _ in f.partitions} == {fam.topic(0, 2)}, "the superseded generation is let go"
        delete_topics(settings, [fam.topic(0, 1)])
        put(settings, fam.topic(0, 2), b"new-2")
        wait_for(b"new-2")
        time.sleep(2 * FAMILY_RELIST_S)
        assert f.running and f.error is None
    finally:
        f.stop()
    assert [r.value for r in seen] == [b"old-1", b"old-2", b"new-1", b"new-2"]  # each once, in order


def test_a_follower_hands_a_record_over_without_waiting_out_its_poll_interval(settings: Settings) -> None:
    """librdkafka's batch consume holds a lone record until the batch is full or the timeout is
    up: a follower must not (serving's head updates). With a poll interval longer than the wait
    below, the record still arrives."""
    topic = settings.topic("deltas")
    seen = threading.Event()
    f = TopicFollower(settings, topic, lambda r: seen.set(), start_at="end", role="test-prompt",
                      poll_interval=120.0).start(wait_assigned=20)
    try:
        time.sleep(0.5)  # the first consume is waiting (for up to the poll interval)
        put(settings, topic, b"lone")
        assert seen.wait(30), "the record waited for the poll interval"
    finally:
        f.stop(timeout=0.1)  # the thread is a daemon blocked in its consume: not joined
