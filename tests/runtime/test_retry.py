"""runtime.retry: which broker errors a worker rides through (with the client's own KafkaError
objects), the deadline and backoff of the one policy, and the flush that waits for a restarting
broker; then the call that killed the ledger worker in issue 35 (the end of a state topic read
while the broker restarts), on a real Apache Kafka with a data dir."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from unlearn.runtime.retry import BrokerUnavailable, RetryPolicy, flush_within, is_retriable, kafka_error
from unlearn.runtime.topic_reader import TopicReadError
from unlearn.streams.ledger.changelog_store import StateStoreError


def _exc(code: int, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, "from the test", **flags))


@pytest.mark.parametrize("code", [KafkaError.FENCED_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION,
                                  KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
                                  KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.REQUEST_TIMED_OUT,
                                  KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT])
def test_leader_epoch_coordinator_and_connection_errors_are_transient(code: int) -> None:
    assert is_retriable(_exc(code))  # librdkafka does not flag these retriable on admin results


@pytest.mark.parametrize("code", [KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.MSG_SIZE_TOO_LARGE,
                                  KafkaError.INVALID_CONFIG, KafkaError.POLICY_VIOLATION,
                                  KafkaError.CLUSTER_AUTHORIZATION_FAILED])
def test_refusals_are_not_transient(code: int) -> None:
    assert not is_retriable(_exc(code))


def test_the_client_flags_decide_and_fatal_wins() -> None:
    assert is_retriable(_exc(KafkaError.UNKNOWN, retriable=True))
    assert not is_retriable(_exc(KafkaError.FENCED_LEADER_EPOCH, fatal=True))
    assert not is_retriable(ValueError("not a broker error"))
    assert is_retriable(TimeoutError("no answer"))


def test_wrapped_errors_are_classified_by_their_cause() -> None:
    """What the state store raises (StateStoreError from a TopicError from the KafkaException)
    is judged by the error behind it, as in the traceback of issue 35."""
    try:
        try:
            raise _exc(KafkaError.FENCED_LEADER_EPOCH)
        except KafkaException as inner:
            raise StateStoreError("cannot read the end of unlearn.heads.p0.g0") from inner
    except StateStoreError as exc:
        assert is_retriable(exc)
        assert kafka_error(exc).code() == KafkaError.FENCED_LEADER_EPOCH
    read = TopicReadError("reading x/0: ...")
    read.kafka_error = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert not is_retriable(read)


def test_the_policy_retries_transient_errors_then_succeeds() -> None:
    calls = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 4:
            raise _exc(KafkaError.FENCED_LEADER_EPOCH)
        return "done"

    assert RetryPolicy(5.0, first_backoff_s=0.01, max_backoff_s=0.05).call("reading", flaky) == "done"
    assert len(calls) == 4


def test_a_fatal_error_is_raised_at_once() -> None:
    calls = []

    def refused() -> None:
        calls.append(1)
        raise _exc(KafkaError.TOPIC_AUTHORIZATION_FAILED)

    with pytest.raises(KafkaException):
        RetryPolicy(5.0).call("reading", refused)
    assert calls == [1]


def test_a_transient_error_past_the_deadline_stops_loudly() -> None:
    tries: list[int] = []

    def away() -> None:
        tries.append(1)
        raise _exc(KafkaError._TRANSPORT)

    with pytest.raises(BrokerUnavailable, match=r"reading the end of t: .*UNLEARN_BROKER_RETRY_SECONDS=0.3") as info:
        RetryPolicy(0.3, first_backoff_s=0.05, max_backoff_s=0.1).call("reading the end of t", away)
    assert 2 <= len(tries) <= 13  # retried with backoff, then stopped at the deadline (0.3 s, >= 0.025 s apart)
    assert kafka_error(info.value).code() == KafkaError._TRANSPORT


class _SlowProducer:
    """A producer whose queue empties after ``after`` flush calls (the broker is back)."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.calls = 0

    def flush(self, timeout: float) -> int:
        self.calls += 1
        return 0 if self.calls >= self.after else 3


def test_flush_within_waits_for_the_broker_and_gives_up_at_the_deadline() -> None:
    p = _SlowProducer(3)
    flush_within(p, RetryPolicy(60.0), "outputs")
    assert p.calls == 3
    with pytest.raises(BrokerUnavailable, match="3 messages not delivered"):
        flush_within(_SlowProducer(10**6), RetryPolicy(0.01), "outputs")


@pytest.mark.broker
def test_the_end_of_a_state_topic_is_read_through_a_broker_restart(tmp_path: Path) -> None:
    """Issue 35's crash: ``end_offset`` (begin_heads_rewrite) while the only node restarts from
    its data dir. It waits for the node and answers the true end, instead of raising."""
    from confluent_kafka import Producer

    from unlearn.infra.local.kafka import LocalKafka
    from unlearn.infra.settings import Settings
    from unlearn.runtime.clients import producer_config
    from unlearn.streams.ledger.state_topics import StateTopics

    # die_with_parent=False: the node is started again from a short-lived thread
    cluster = LocalKafka(1, data_dir=tmp_path / "kafka", die_with_parent=False).start()
    try:
        s = Settings.from_env().with_(bootstrap=cluster.bootstrap, profile="kafka", topic_prefix="t.retry.",
                                      admin_timeout=5.0, broker_retry_seconds=120.0)
        topics = StateTopics(s)
        topics.ensure("t.retry.heads.p0.g0")
        p = Producer(producer_config(s))
        for i in range(5):
            p.produce("t.retry.heads.p0.g0", key=b"k", value=str(i).encode(), partition=0)
        assert p.flush(30) == 0
        assert topics.end_offset("t.retry.heads.p0.g0") == 5
        cluster.kill_node(1)
        restarted = threading.Thread(target=lambda: (time.sleep(2.0), cluster.start_node(1)), daemon=True)
        restarted.start()
        assert topics.end_offset("t.retry.heads.p0.g0") == 5  # the node was down when asked
        restarted.join(120)
        assert topics.trim("t.retry.heads.p0.g0", 3)
    finally:
        cluster.stop()
