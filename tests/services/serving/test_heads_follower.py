"""The heads follower on the shared TopicFollower: replays the topic from the beginning, serves the
superseding update per head, skips tombstones and counts undecodable records.

Heads readers behind the ledger's trim point (docs/ledger-processor.md, "Erasure rotation"): where
the broker has DeleteRecords the ledger republishes every head at its current version into the
same topic and trims below it at once, so a reader whose position is below the new log start must
go on from there (``auto.offset.reset``), where every head's current update is."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import KafkaError

from tests.services.serving.support import Publisher, make_head, metric_samples, sample
from unlearn.common.families import heads_family
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import quirks
from unlearn.runtime.topic_reader import LogRecord, TopicFollower, _Fetcher
from unlearn.runtime.topics import (
    delete_records,
    delete_topics,
    ensure_topic,
    prefixed_topics,
    trimmed_changelog_config,
)
from unlearn.services.client.head_reader import read_heads
from unlearn.services.serving.heads_follower import HeadsFollower
from unlearn.services.serving.metrics import Metrics
from unlearn.services.serving.predict import HeadStore


def test_follower_replays_offers_and_counts(settings: Settings, publish: Publisher) -> None:
    publish(make_head(1, "fast", 1), make_head(2, "exact", 2), make_head(1, "exact", 3))  # the last one: stale
    publish.raw(b"h", b"not a head update")
    publish.raw(b"h", None)  # a tombstone: skipped, not counted
    publish(make_head(1, "exact", 4, head="g"))
    store = HeadStore()
    metrics = Metrics()
    metrics.watch(store, None)
    f = HeadsFollower(settings, store, metrics)
    assert isinstance(f.reader, TopicFollower) and f.topic == heads_family(settings.topic_prefix)
    try:
        f.start()
        assert f.caught_up.wait(20), f.error
        assert f.running and f.error is None and f.partitions
        assert store.get("h").update.version == 2 and store.get("h").update.mode == "exact"
        assert store.get("g").update.version == 1
        s = metric_samples(metrics.render().decode())
        assert sample(s, "unlearn_serving_head_updates_total", result="accepted") == 3
        assert sample(s, "unlearn_serving_head_updates_total", result="stale") == 1
        assert sample(s, "unlearn_serving_head_updates_total", result="invalid") == 1
        publish(make_head(3, "fast", 5))  # followed after catching up
        deadline = time.monotonic() + 20
        while store.get("h").update.version != 3:
            assert time.monotonic() < deadline, "the follower never served version 3"
            time.sleep(0.05)
        assert all(n >= 0 for n in f.lag().values())
    finally:
        f.stop()
    assert not f.running


def test_follower_starts_before_any_head_exists_and_finds_the_first_one(settings: Settings) -> None:
    """Serving may start before the ledger published anything: nothing to catch up with (ready,
    no error), and the first heads topic is found by relisting, read from its beginning."""
    empty = settings.with_(topic_prefix=f"t.empty.{uuid.uuid4().hex[:8]}.")
    store = HeadStore()
    f = HeadsFollower(empty, store, poll_interval=0.05)
    try:
        f.start()
        assert f.caught_up.wait(15) and f.error is None and f.partitions == []
        Publisher(empty)(make_head(1, "exact", 1))
        deadline = time.monotonic() + 15
        while store.get("h") is None:
            assert time.monotonic() < deadline, f"the first head was never found: {f.error}"
            time.sleep(0.05)
        assert f.running and f.partitions == [f"{heads_family(empty.topic_prefix).topic(0, 0)}/0"]
    finally:
        f.stop()
        delete_topics(empty, heads_family(empty.topic_prefix).select(prefixed_topics(empty)))
    assert not f.running


def _wait(cond: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_reader_behind_the_trim_point_resumes_at_the_log_start_and_serves_the_exact_head(
        settings: Settings) -> None:
    if not quirks(settings).delete_records:
        pytest.skip("no DeleteRecords on this broker: the ledger rotates heads generations instead (test_worker)")
    topic = heads_family(settings.topic_prefix).topic(0, 0)
    ensure_topic(settings, topic, compacted=True, config=trimmed_changelog_config(settings))  # as the ledger does
    publish = Publisher(settings)
    publish(*(make_head(v, "fast", v) for v in range(1, 21)))  # offsets 0..19: fast updates, no digest
    store = HeadStore()
    follower = HeadsFollower(settings, store, poll_interval=0.05)
    seen: list[int] = []
    gate = threading.Event()
    offer = follower.reader.on_record

    def slow(record: LogRecord) -> None:  # a serving replica that stalls after 3 records
        seen.append(record.offset)
        if len(seen) == 3:
            gate.wait(30)
        offer(record)

    follower.reader.on_record = slow
    try:
        follower.start()
        _wait(lambda: len(seen) >= 3, "the follower never started reading")
        # the ledger's rewrite: every head republished at its version (here exact), then trimmed below it
        publish(make_head(20, "exact", 21))
        assert delete_records(settings, {(topic, 0): 20}) == {(topic, 0): 20}
        # a reader reopened at a position it kept from before the trim (runtime.topic_reader._Fetcher.sync)
        fetcher = _Fetcher(settings, "trim-test")
        try:
            fetcher.assign({(topic, 0): 2})
            got: list[int] = []
            deadline = time.monotonic() + 30
            while not got and time.monotonic() < deadline:
                for m in fetcher.consumer.consume(num_messages=10, timeout=0.5):
                    err = m.error()  # the reset is silent: nothing but the end of the partition
                    assert err is None or err.code() == KafkaError._PARTITION_EOF, err
                    got += [m.offset()] if err is None else []
            assert got and got[0] == 20, got
        finally:
            fetcher.close()
        gate.set()
        _wait(lambda: (h := store.get("h")) is not None and (h.update.version, h.update.mode) == (20, "exact"),
              f"serving never showed the exact head: {store.get('h')}")
        latest = read_heads(settings, ["h"])["h"]  # a fresh reader starts at the log start
        assert (latest.version, latest.mode) == (20, "exact") and latest.digest
        publish(make_head(21, "fast", 22))  # and the follower goes on after the trim point
        _wait(lambda: store.get("h").update.version == 21, "the follower stopped after the trim")  # type: ignore[union-attr]
        assert follower.error is None, follower.error
    finally:
        gate.set()
        follower.stop()
