"""Raw inputs leave ``requests`` and ``requests.by-head`` once the featurizer took them over, where
the broker has DeleteRecords (``BrokerQuirks.delete_records``; docs/erasure.md section 5); on a
broker without it they stay (the documented limitation). Real broker, no mocks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.streams.featurizer.test_service import (
    Reader,
    Running,
    add,
    committed_offsets,
    delete,
    delete_subject,
    ledgers_from,
    produce,
    q_rows,
)
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import admin_config, consumer_config, quirks
from unlearn.runtime.topic_reader import read_topic
from unlearn.streams.featurizer.raw_input_trim import Trimmer, trim_bounds

SECRET = [0.7318237412, -0.2918374619, 0.4129387123, -0.1837461928, 0.3128374619]
NEEDLE = repr(SECRET[0])[:10].encode()
DEADLINE_S = 20.0  # trim period (0.5 s here) + a batch + the DeleteRecords round trip, with margin


# --------------------------------------------------------------------------- the bound, pure
tp_st = st.tuples(st.sampled_from(["requests", "by-head"]), st.integers(0, 3))
offsets_st = st.dictionaries(tp_st, st.integers(-1, 50), max_size=8)


@given(st.dictionaries(st.sampled_from(["own", "fed", "old"]), offsets_st, min_size=1),
       st.lists(tp_st, max_size=8))
def test_the_bound_is_the_lowest_committed_offset_and_needs_the_own_group(committed, partitions) -> None:
    got = trim_bounds("own", committed, partitions)
    for tp in set(partitions):
        mine = committed.get("own", {}).get(tp, -1)
        if mine < 0:
            assert tp not in got  # never trim what the featurizer itself has not durably taken over
            continue
        held = [offs[tp] for offs in committed.values() if offs.get(tp, -1) >= 0]
        assert got[tp] == min(held) and got[tp] <= mine  # no group with a position loses a record
    assert set(got) <= set(partitions)


# --------------------------------------------------------------------------- on the broker
def log_starts(s: Settings, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(consumer_config(s, "trim-probe"))
    try:
        parts = c.list_topics(timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] for p in parts}
    finally:
        c.close()


def commit(s: Settings, group: str, topic: str, offsets: dict[int, int]) -> None:
    """A consumer group holding ``offsets`` on ``topic`` (as another featurizer deployment would)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(admin_config(s))
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p, o) for p, o in offsets.items()])
    deadline = time.monotonic() + 30
    while True:  # the errors are per partition (NOT_COORDINATOR while the broker loads its offsets topic)
        res = admin.alter_consumer_group_offsets([req])[group].result(timeout=30)
        errors = [tp.error for tp in res.topic_partitions if tp.error is not None]
        if not errors:
            return
        coordinator = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                       KafkaError.COORDINATOR_NOT_AVAILABLE}
        assert all(e.retriable() or e.code() in coordinator for e in errors), errors
        assert time.monotonic() < deadline, errors
        time.sleep(0.5)


def raw_holds_needle(s: Settings) -> dict[str, int]:
    return {t: sum(NEEDLE in (r.value or b"") for r in read_topic(s, t, timeout=30))
            for t in (s.topic("requests"), s.topic("requests.by-head"))}


def test_plaintext_inputs_leave_both_raw_topics_once_taken_over(settings: Settings, tmp_path: Path) -> None:
    s = settings.with_(data_dir=str(tmp_path / "a"), trim_every_seconds=0.5)
    requests = s.topic("requests")
    other = f"{s.topic_prefix}featurizer.elsewhere"  # another group of the deployment, reading requests
    if quirks(s).delete_records:
        commit(s, other, requests, {0: 0})  # it has read nothing of requests[0] yet
    adds = [add(f"a{i}", "h1", f"s{i % 3}", f"x{i}", [*SECRET[:4], float(i)] if i % 3 == 0 else
                [0.1, 0.2, 0.3, 0.4, float(i)], i % 2) for i in range(12)]
    produce(s, [*adds, delete_subject("forget-s0", "h1", "s0")])  # plaintext, as any producer sends
    reader = Reader(s)
    a = Running(s, group="fz-trim")
    b: Running | None = None
    try:
        reader.until(lambda g: "forget-s0" in ledgers_from(g["deltas"])[1])
        assert a.service.ready.is_set()
        done = committed_offsets(s, "fz-trim", requests)
        if not quirks(s).delete_records:  # e.g. tansu: nothing can delete a record
            time.sleep(3.0)
            assert a.service.trimmer is None and all(n > 0 for n in raw_holds_needle(s).values())
            return
        by_head = committed_offsets(s, "fz-trim", s.topic("requests.by-head"))
        deadline = time.monotonic() + DEADLINE_S
        want = {**{(requests, p): (0 if p == 0 else o) for p, o in done.items() if o >= 0},
                **{(s.topic("requests.by-head"), p): o for p, o in by_head.items() if o >= 0}}
        while True:  # every partition's log start reaches the lowest committed offset
            got = {(t, p): o for t in (requests, s.topic("requests.by-head")) for p, o in log_starts(s, t).items()}
            if all(got[tp] >= o for tp, o in want.items()) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        # never past a group's position: the other group's 0 on requests[0], and the featurizer's
        # own offsets as they stand now (it may have committed past ``want`` since)
        now = {**{(requests, p): (0 if p == 0 else o) for p, o in committed_offsets(s, "fz-trim", requests).items()},
               **{(s.topic("requests.by-head"), p): o
                  for p, o in committed_offsets(s, "fz-trim", s.topic("requests.by-head")).items()}}
        wrong = {f"{t[len(s.topic_prefix):]}[{p}]": (got[(t, p)], o, now[(t, p)])
                 for (t, p), o in want.items() if not o <= got[(t, p)] <= now[(t, p)]}
        assert not wrong, wrong  # (log start, wanted, committed now)
        assert got[(requests, 0)] == 0
        # the other group held requests[0] back; the by-head copies of its records are gone all the same
        assert raw_holds_needle(s)[s.topic("requests.by-head")] == 0
        commit(s, other, requests, {p: o for p, o in done.items() if o >= 0})  # the other deployment caught up
        deadline = time.monotonic() + DEADLINE_S
        while any(raw_holds_needle(s).values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert raw_holds_needle(s) == {requests: 0, s.topic("requests.by-head"): 0}
        assert a.stop() == 0
        # a new host (empty data dir) takes over from the changelog: nothing it needs was deleted
        b = Running(s.with_(data_dir=str(tmp_path / "b")), group="fz-trim")
        assert b.service.ready.wait(60)
        produce(s, [delete("d3", "h1", "s1", "x1")])
        got_msgs = reader.until(lambda g: "d3" in ledgers_from(g["deltas"])[1])
        assert b.stop() == 0
    finally:  # every featurizer thread joined before its topics are deleted (librdkafka crashes otherwise)
        reader.close()
        for run in (a, b):
            if run is not None:
                run.stop_event.set()
                run.thread.join(30)
    rows = q_rows(got_msgs["deltas"])
    assert rows[(-1, "x1")] == rows[(1, "x1")] and not got_msgs["deadletter"]


def test_a_transient_trim_error_is_asked_again_and_a_fatal_one_stops_the_poll_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """runtime.retry on the trim's thread: a transport error is tried again at once (with a new
    admin client), an authorization error is kept for the poll loop (``check``) to raise."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    calls: list[int] = []

    def trim(self: Trimmer, partitions: object) -> int:
        calls.append(1)
        code = KafkaError._TRANSPORT if len(calls) == 1 else KafkaError.TOPIC_AUTHORIZATION_FAILED
        raise KafkaException(KafkaError(code))
    monkeypatch.setattr(Trimmer, "trim", trim)
    t = Trimmer(Settings.from_env(bootstrap="127.0.0.1:9", admin_timeout=1.0), "g", ("r",))  # never connected to
    try:
        t.check()  # nothing yet
        t.offer([TopicPartition("r", 0)])
        deadline = time.monotonic() + 10
        while t.fatal is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(calls) == 2 and t.stats["failures"] == 1
        with pytest.raises(KafkaException, match="AUTHORIZATION"):
            t.check()
    finally:
        t.close()
