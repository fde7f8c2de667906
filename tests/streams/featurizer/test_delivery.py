"""Produce now, wait later (``delivery.Acks``) against a REAL Kafka-protocol broker (conftest)."""

from __future__ import annotations

import pytest

from unlearn.infra.settings import Settings
from unlearn.runtime.clients import producer_config
from unlearn.runtime.delivery import Acks, DeliveryError

pytestmark = pytest.mark.broker


def test_acks_count_only_their_own_messages_and_raise_on_any_failure(settings: Settings) -> None:
    """Two overlapping sends on one producer (the router's forwards and a batch's phase 0): a
    flush by one leaves the other's acknowledgements counted by the other; messages that are
    never acknowledged (no broker reachable) fail their ``wait``."""
    from confluent_kafka import Producer

    producer = Producer(producer_config(settings, **{"linger.ms": 5, "message.timeout.ms": 10_000}))
    topic = settings.topic("deadletter")
    seen: list[tuple[str, int]] = []
    forwards = Acks(producer, lambda t, p, o, v: seen.append((t, p))).send(
        [{"topic": topic, "value": b"f%d" % i, "partition": 0} for i in range(5)])
    phase0 = Acks(producer).send([{"topic": topic, "value": b"p", "partition": 1}])
    assert phase0.wait() == 1  # flushes the forwards too
    assert forwards.acked == 5 and forwards.wait() == 5 and seen == [(topic, 0)] * 5
    nowhere = Producer({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 300})
    bad = Acks(nowhere).send([{"topic": topic, "value": b"lost", "partition": 0}] * 2)
    with pytest.raises(DeliveryError, match=r"2 message\(s\) unacknowledged .* 2 failed"):
        bad.wait(30)
    assert Acks(producer).wait() == 0  # nothing sent, nothing owed


def test_a_wait_without_timeout_rides_out_the_broker_up_to_the_retry_deadline() -> None:
    """With the retry policy (runtime.retry), a wait without its own timeout is bounded by the
    deadline: messages the broker has not acknowledged yet are waited for (a restart), and past
    the deadline the featurizer stops with BrokerUnavailable rather than waiting forever."""
    from confluent_kafka import Producer

    from unlearn.runtime.retry import BrokerUnavailable, RetryPolicy

    nowhere = Producer({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 60_000})
    acks = Acks(nowhere, policy=RetryPolicy(deadline_s=1.0)).send([{"topic": "t", "value": b"v", "partition": 0}])
    with pytest.raises(BrokerUnavailable, match="1 messages not delivered"):
        acks.wait()


def test_answered_serves_reports_without_blocking_and_counts_failures(settings: Settings) -> None:
    """``answered`` is what the batch window asks between its slices (batch.settle_if_answered):
    False while a report is owed, True once every message was acknowledged or failed, and it never
    waits for them; a failed message still makes ``wait`` raise."""
    import time

    from confluent_kafka import Producer

    producer = Producer(producer_config(settings, **{"linger.ms": 0}))
    acks = Acks(producer).send([{"topic": settings.topic("deadletter"), "value": b"a%d" % i, "partition": 0}
                                for i in range(3)])
    first = acks.answered()
    deadline = time.monotonic() + 30
    while not acks.answered():
        assert time.monotonic() < deadline, "three messages never acknowledged"
        time.sleep(0.005)
    assert not first or acks.acked == 3
    assert acks.acked == 3 and acks.wait() == 3
    nowhere = Producer({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 200})
    lost = Acks(nowhere).send([{"topic": "t", "value": b"v", "partition": 0}])
    assert not lost.answered()  # a call that waited for the report would have seen the failure
    deadline = time.monotonic() + 30
    while not lost.answered():
        assert time.monotonic() < deadline, "the failure was never reported"
        time.sleep(0.01)
    with pytest.raises(DeliveryError, match="1 failed"):
        lost.wait(5)
