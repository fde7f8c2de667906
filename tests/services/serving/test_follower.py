"""The heads follower on the shared TopicFollower: replays the topic from the beginning, serves the
superseding update per head, skips tombstones and counts undecodable records."""

from __future__ import annotations

import time
import uuid

from tests.services.serving.support import Publisher, make_head, metric_samples, sample
from unlearn.infra.settings import Settings
from unlearn.infra.topic_reader import TopicFollower
from unlearn.services.serving.follower import HeadsFollower
from unlearn.services.serving.metrics import Metrics
from unlearn.services.serving.store import HeadStore


def test_follower_replays_offers_and_counts(settings: Settings, publish: Publisher) -> None:
    publish(make_head(1, "fast", 1), make_head(2, "exact", 2), make_head(1, "exact", 3))  # the last one: stale
    publish.raw(b"h", b"not a head update")
    publish.raw(b"h", None)  # a tombstone: skipped, not counted
    publish(make_head(1, "exact", 4, head="g"))
    store = HeadStore()
    metrics = Metrics()
    metrics.watch(store, None)
    f = HeadsFollower(settings, store, metrics)
    assert isinstance(f.reader, TopicFollower) and f.topic == settings.topic("heads")
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


def test_follower_waits_for_a_missing_topic(settings: Settings) -> None:
    missing = settings.with_(topic_prefix=f"t.missing.{uuid.uuid4().hex[:8]}.")
    f = HeadsFollower(missing, HeadStore(), poll_interval=0.05)
    try:
        f.start()
        deadline = time.monotonic() + 15
        while f.error is None:
            assert time.monotonic() < deadline, "no error while waiting for the topic"
            time.sleep(0.05)
        assert f.running and not f.caught_up.is_set() and "does not exist" in f.error
    finally:
        f.stop()
    assert not f.running
