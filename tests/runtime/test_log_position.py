"""``runtime.log_position.watermarks``: a partition whose leader is moving (a Kafka node's loss) is
asked again until the timeout; any other error, or the timeout, is raised. The real-broker proof is
``bench.chaos --engine kafka --nodes 3`` (bench/results/chaos_kafka.md): the ledger's recovery hit
NOT_LEADER_FOR_PARTITION there and exited before this."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from unlearn.runtime.log_position import watermarks


class Answers:
    """A stand-in for a consumer's ``get_watermark_offsets``: raises the queued errors, then answers."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.calls = 0

    def get_watermark_offsets(self, _tp: object, timeout: float) -> tuple[int, int]:
        self.calls += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 3, 17


def test_a_moving_leader_is_asked_again() -> None:
    c = Answers(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError._TRANSPORT)
    assert watermarks(c, "t", 0, timeout=10) == (3, 17)
    assert c.calls == 4


def test_other_errors_are_raised_at_once() -> None:
    c = Answers(KafkaError.UNKNOWN_TOPIC_OR_PART)
    with pytest.raises(KafkaException):
        watermarks(c, "t", 0, timeout=10)
    assert c.calls == 1


def test_a_leader_that_never_comes_back_is_raised_after_the_timeout() -> None:
    c = Answers(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 100)
    with pytest.raises(KafkaException):
        watermarks(c, "t", 0, timeout=0.6)
    assert 2 <= c.calls < 10
