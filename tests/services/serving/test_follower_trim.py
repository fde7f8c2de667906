"""Heads readers behind the ledger's trim point (docs/ledger-processor.md, "Erasure rotation"): where
the broker has DeleteRecords the ledger republishes every head as an exact update into the same
topic and trims below it at once, so a reader whose position is below the new log start must go
on from there (``auto.offset.reset``), where an exact update of every head is."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError

from tests.services.serving.support import Publisher, make_head
from unlearn.infra.between_stages import heads_family
from unlearn.infra.settings import Settings, quirks
from unlearn.infra.topic_reader import LogRecord, _Fetcher
from unlearn.infra.topics import delete_records, ensure_topic, trimmed_changelog_config
from unlearn.services.client.head_reader import read_heads
from unlearn.services.serving.http import HeadsFollower
from unlearn.services.serving.predict import HeadStore


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
        # the ledger's rewrite: every head republished as an exact update, then trimmed below it
        publish(make_head(20, "exact", 21))
        assert delete_records(settings, {(topic, 0): 20}) == {(topic, 0): 20}
        # a reader reopened at a position it kept from before the trim (infra.topic_reader._Fetcher.sync)
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
