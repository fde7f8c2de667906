"""streams/ledger/deltas_poller.py: the order of the partitions' turns and of the heads within
a turn (pure), the poller on a real consumer (a lane's partition first, each partition in log
order, dropped partitions forgotten), a worker that publishes a lane's head before folding the
other heads of its turn (and recovers exactly when killed between the two), and a worker whose
deletes come in lanes over several heads ending exact."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.streams.ledger.support import Stream, assert_final_heads_exact, produce, run_in_thread, worker_settings
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import consumer_config, producer_config
from unlearn.runtime.topics import create_topics
from unlearn.schemas.delta_codec import decode_delta, encode_delta
from unlearn.schemas.source_id import LANE_SUFFIX, format_source_id
from unlearn.streams.ledger.deltas_poller import FAIR_S, DeltasPoller, lane_first, next_partition


def test_a_lanes_partition_goes_first_unless_the_oldest_waited_too_long() -> None:
    now = 100.0
    assert next_partition([(2, False, now), (5, True, now), (1, True, now)], now) == 5  # the first lane
    assert next_partition([(2, False, now), (3, False, now)], now) == 2  # no lane: the oldest
    old = now - 2 * FAIR_S
    assert next_partition([(2, False, old), (5, True, now)], now) == 2  # waited long enough: its turn
    assert next_partition([(2, False, now - FAIR_S / 2), (5, True, now)], now) == 5


def test_a_turn_folds_each_lane_heads_messages_up_to_its_lane_first() -> None:
    a, b, c = b"a", b"b", b"c"
    marks = [(a, False), (b, False), (a, True), (b, False), (c, False), (a, False), (c, True), (b, False)]
    assert lane_first(marks) == ([0, 2, 4, 6], [1, 3, 5, 7])  # a up to 2, c up to 6; then b, and a after its lane
    assert lane_first([(a, False), (b, False)]) == ([0, 1], [])  # no lane: log order
    assert lane_first([(a, False), (b, True)]) == ([1], [0])
    assert lane_first([(a, False), (None, False), (b, True)]) == ([0, 1, 2], [])  # an unkeyed head: no move
    for first, rest in (lane_first(marks), lane_first([(a, True), (a, True), (b, False)])):
        assert sorted(first + rest) == list(range(len(first + rest)))  # each message once
        assert first == sorted(first) and rest == sorted(rest)  # each part in log order


def _turns(consumer: Consumer, poller: DeltasPoller, want: int) -> list[list[tuple[int, int, bytes]]]:
    turns: list[list[tuple[int, int, bytes]]] = []
    deadline = time.monotonic() + 30
    while sum(len(t) for t in turns) < want and time.monotonic() < deadline:
        batch = poller.poll(consumer, threading.Event(), lambda: None)
        if batch:
            turns.append([(m.partition(), m.offset(), m.value()) for m in batch])
    return turns


def _fetched(settings: Settings, records: list[tuple[int, bytes]]) -> tuple[Consumer, DeltasPoller]:
    """``records`` (partition, value) produced to a fresh deltas topic, and a poller that has
    fetched all of them (on a consumer assigned its partitions 0 and 1) before its first turn."""
    s = settings.with_(topic_prefix=f"poller-{uuid.uuid4().hex[:8]}.")
    create_topics(s)
    topic = s.topic("deltas")
    p = Producer(producer_config(s))
    for part, value in records:
        p.produce(topic, value=value, partition=part)
    assert p.flush(30) == 0
    consumer = Consumer(consumer_config(s, f"poller-{uuid.uuid4().hex}"))
    consumer.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    poller = DeltasPoller()
    deadline = time.monotonic() + 30
    while len(poller.carry) < len(records) and time.monotonic() < deadline:
        poller.fetch(consumer, 0.5)
    return consumer, poller


@pytest.mark.broker
def test_the_poller_hands_out_a_lanes_partition_first_and_each_partition_in_order(settings: Settings) -> None:
    records = [(0, f"adds {i}".encode()) for i in range(3)]
    records += [(1, f"requests{LANE_SUFFIX}/1@7".encode()), (1, b"adds after it")]
    consumer, poller = _fetched(settings, records)
    try:
        turns = _turns(consumer, poller, 5)
    finally:
        consumer.close()
    assert [[(part, off) for part, off, _ in t] for t in turns] == [[(1, 0), (1, 1)], [(0, 0), (0, 1), (0, 2)]]


@pytest.mark.broker
def test_drop_forgets_a_partitions_carried_messages(settings: Settings) -> None:
    consumer, poller = _fetched(settings, [(0, b"adds"), (1, b"adds")])
    try:
        poller.drop({0})
        turns = _turns(consumer, poller, 1)
    finally:
        consumer.close()
    assert [[(part, off) for part, off, _ in t] for t in turns] == [[(1, 0)]]
    assert poller.carry == []


def _as_lane(msg: tuple[str, bytes], k: int) -> tuple[str, bytes]:
    """``msg`` as if a delete lane's source stream had sent it."""
    head, raw = msg
    return head, encode_delta(replace(decode_delta(raw), source_id=format_source_id(0, k, f"requests{LANE_SUFFIX}")))


@pytest.mark.broker
def test_a_lanes_head_is_published_before_the_other_heads_of_its_turn_are_folded(settings: Settings,
                                                                                tmp_path: Path) -> None:
    """One turn of five messages over three heads, a lane's delete of head a third: a's messages up
    to it are folded and a published before b's and c's are folded; every head ends exact."""
    from unlearn.streams.ledger.worker import LedgerWorker

    s = worker_settings(settings, tmp_path).with_(partitions=1, topic_prefix=settings.topic_prefix + "lane1.")
    create_topics(s)
    stream = Stream(["a", "b", "c"], d=8, seed=5, delete_p=0.0)
    adds = [stream.next_message(h) for h in ("a", "b", "a")]
    produce(s, [adds[0], adds[1], _as_lane(stream.delete_message("a", 1), 0), stream.next_message("b"),
                stream.next_message("c")])  # one flush before the worker starts: its first turn
    w = LedgerWorker(s, "w0")
    seen: list[tuple[str, object]] = []
    fold, publish = w.fold.fold, w.outputs.publish_poll

    def folding(ps: Any, offset: int, key: bytes | None, raw: bytes, poll: Any) -> None:
        seen.append(("fold", (key, offset)))
        fold(ps, offset, key, raw, poll)

    def publishing(poll: Any) -> None:
        seen.append(("publish", sorted(poll.outcomes)))
        publish(poll)

    w.fold.fold = folding  # type: ignore[method-assign]
    w.outputs.publish_poll = publishing  # type: ignore[method-assign]
    t, failed = run_in_thread(w)
    try:
        deadline = time.monotonic() + 60
        while ("publish", ["b", "c"]) not in seen and not failed and time.monotonic() < deadline:
            time.sleep(0.02)
        produce(s, [adds[2]])  # after the first turn (fetched with it, a's add would join its rest)
        assert_final_heads_exact(s, stream)
    finally:
        w.stop()
        t.join(60)
    assert not failed, failed
    assert seen[:7] == [("fold", (b"a", 0)), ("fold", (b"a", 2)), ("publish", ["a"]), ("fold", (b"b", 1)),
                        ("fold", (b"b", 3)), ("fold", (b"c", 4)), ("publish", ["b", "c"])], seen


class _Crash(BaseException):
    """Stands for kill -9 between a turn's two parts (BaseException: nothing catches it)."""


@pytest.mark.broker
def test_a_crash_between_a_turns_lane_part_and_its_rest_recovers_exactly(settings: Settings,
                                                                          tmp_path: Path) -> None:
    """The worker dies right after publishing a turn's lane heads, before folding the rest of the
    turn (nothing checkpointed): a new worker replays the turn from the floor and every head ends
    exact, every delta applied once, the lane's head at the same version."""
    from unlearn.streams.ledger.worker import LedgerWorker

    s = worker_settings(settings, tmp_path).with_(partitions=1, topic_prefix=settings.topic_prefix + "lane2.")
    create_topics(s)
    stream = Stream(["a", "b", "c"], d=8, seed=6, delete_p=0.0)
    first = [stream.next_message(h) for h in ("a", "b", "a", "c")]
    produce(s, [*first, _as_lane(stream.delete_message("a", 2), 0), stream.next_message("b"),
                stream.next_message("c")])
    w = LedgerWorker(s, "crashing")
    publish = w.outputs.publish_poll
    parts: list[list[str]] = []

    def publishing(poll: Any) -> None:
        parts.append(sorted(poll.outcomes))
        publish(poll)
        if parts == [["a"]]:
            raise _Crash("after the lane part")

    w.outputs.publish_poll = publishing  # type: ignore[method-assign]
    t, crashed = run_in_thread(w)
    t.join(60)
    assert not t.is_alive() and len(crashed) == 1 and isinstance(crashed[0], _Crash), crashed
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path).start()
    try:
        assert_final_heads_exact(s, stream)
    finally:
        worker.stop()
    assert worker.proc is not None and worker.proc.returncode == 0, worker.log_tail()


@pytest.mark.broker
def test_lane_deltas_over_several_heads_end_exact(settings: Settings, tmp_path: Path) -> None:
    """Deltas of six heads, those holding deletes from a delete lane's source stream (so their
    partitions go first): every head ends at its exact digest, every delta applied once."""
    s = worker_settings(settings, tmp_path)
    stream = Stream([f"head{i}" for i in range(6)], d=8, seed=11, delete_p=0.5)
    msgs = []
    for k in range(150):
        head, raw = stream.next_message()
        deletes = any(e.sign < 0 for e in decode_delta(raw).entries)
        msgs.append(_as_lane((head, raw), k) if deletes else (head, raw))
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0", "--loglevel", "info"], s, tmp_path).start()
    try:
        for i in range(0, len(msgs), 25):  # in waves, so that lanes and adds share polls
            produce(s, msgs[i:i + 25])
            time.sleep(0.2)
        assert_final_heads_exact(s, stream)
    finally:
        worker.stop()
    assert worker.proc is not None and worker.proc.returncode == 0, worker.log_tail()
