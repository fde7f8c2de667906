"""The heads follower on the shared TopicFollower: replays the topic from the beginning, serves the
superseding update per head, skips tombstones and counts undecodable records."""

from __future__ import annotations

import time
import uuid

from tests.services.serving.support import Publisher, make_head, metric_samples, sample
from unlearn.infra.between_stages import heads_family
from unlearn.infra.settings import Settings
from unlearn.infra.topic_reader import TopicFollower
from unlearn.infra.topics import delete_topics, prefixed_topics
from unlearn.services.serving.http import HeadsFollower, Metrics
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
