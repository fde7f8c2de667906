"""streams/ledger/deltas_poller.py: the order of the partitions' turns (pure), the poller on a
real consumer (a lane's partition first, each partition in log order, dropped partitions
forgotten), and a worker whose deletes come in lanes over several heads ending exact."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.streams.ledger.support import Stream, assert_final_heads_exact, produce, worker_settings
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import consumer_config, producer_config
from unlearn.runtime.topics import create_topics
from unlearn.schemas.delta_codec import decode_delta, encode_delta
from unlearn.schemas.source_id import LANE_SUFFIX, format_source_id
from unlearn.streams.ledger.deltas_poller import FAIR_S, DeltasPoller, next_partition


def test_a_lanes_partition_goes_first_unless_the_oldest_waited_too_long() -> None:
    now = 100.0
    assert next_partition([(2, False, now), (5, True, now), (1, True, now)], now) == 5  # the first lane
    assert next_partition([(2, False, now), (3, False, now)], now) == 2  # no lane: the oldest
    old = now - 2 * FAIR_S
    assert next_partition([(2, False, old), (5, True, now)], now) == 2  # waited long enough: its turn
    assert next_partition([(2, False, now - FAIR_S / 2), (5, True, now)], now) == 5


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


@pytest.mark.broker
def test_lane_deltas_over_several_heads_end_exact(settings: Settings, tmp_path: Path) -> None:
    """Deltas of six heads, those holding deletes from a delete lane's source stream (so their
    partitions go first): every head ends at its exact digest, every delta applied once."""
    s = worker_settings(settings, tmp_path)
    stream = Stream([f"head{i}" for i in range(6)], d=8, seed=11, delete_p=0.5)
    msgs = []
    for k in range(150):
        head, raw = stream.next_message()
        delta = decode_delta(raw)
        if any(e.sign < 0 for e in delta.entries):
            raw = encode_delta(replace(delta, source_id=format_source_id(0, k, f"requests{LANE_SUFFIX}")))
        msgs.append((head, raw))
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0", "--loglevel", "info"], s, tmp_path).start()
    try:
        for i in range(0, len(msgs), 25):  # in waves, so that lanes and adds share polls
            produce(s, msgs[i:i + 25])
            time.sleep(0.2)
        assert_final_heads_exact(s, stream)
    finally:
        worker.stop()
    assert worker.proc is not None and worker.proc.returncode == 0, worker.log_tail()
