"""Workers call ``create_topics`` / ``ensure_topic`` at start (the ledger creates every project
topic, the featurizer its by-head topic). Under the ACL matrix a worker principal has no CREATE on
most of them, and Kafka answers CreateTopics with TOPIC_AUTHORIZATION_FAILED before it checks
existence: that must mean "wait for it to exist", not "stop the worker". A fake admin client
stands in for an authorizing broker (none can run here)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from unlearn.infra.settings import Settings
from unlearn.runtime.topics import TopicError, create_topics, ensure_topic, topic_names


class _Admin:
    """CreateTopics is refused for authorization; metadata lists ``existing``."""

    def __init__(self, existing: set[str], code: int = KafkaError.TOPIC_AUTHORIZATION_FAILED) -> None:
        self.existing, self.code = existing, code

    def create_topics(self, new: list[Any], request_timeout: float) -> dict[str, Future[None]]:
        out: dict[str, Future[None]] = {}
        for t in new:
            f: Future[None] = Future()
            f.set_exception(KafkaException(KafkaError(self.code)))
            out[t.topic] = f
        return out

    def list_topics(self, timeout: float) -> Any:
        part = SimpleNamespace(leader=1)
        return SimpleNamespace(topics={n: SimpleNamespace(error=None, partitions={0: part, 1: part})
                                       for n in self.existing})

    def list_offsets(self, parts: dict[Any, Any], request_timeout: float) -> dict[Any, Future[None]]:
        """Every leader serves (wait_for_topics asks once metadata shows the topics)."""
        out: dict[Any, Future[None]] = {}
        for tp in parts:
            out[tp] = Future()
            out[tp].set_result(None)
        return out


@pytest.fixture
def settings() -> Settings:
    return Settings(bootstrap="kafka:9092", profile="kafka", partitions=2, admin_timeout=0.3)


def _patch(monkeypatch: pytest.MonkeyPatch, admin: _Admin) -> None:
    import confluent_kafka.admin

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", lambda conf: admin)


def test_unauthorized_create_of_existing_topics_is_fine(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    names = set(topic_names(settings).values())
    _patch(monkeypatch, _Admin(names))
    assert create_topics(settings) == dict.fromkeys(names, 2)
    ensure_topic(settings, settings.topic("requests.by-head"), partitions=2, admin=_Admin(names))


def test_unauthorized_create_of_a_missing_topic_names_the_fix(settings: Settings,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    names = set(topic_names(settings).values()) - {settings.topic("deltas")}
    _patch(monkeypatch, _Admin(names))
    with pytest.raises(TopicError, match=r"not authorized to create .*unlearn topics create"):
        create_topics(settings)
    with pytest.raises(TopicError, match="not visible"):
        ensure_topic(settings, settings.topic("deltas"), admin=_Admin(names))


def test_other_errors_still_stop(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    _patch(monkeypatch, _Admin(set(topic_names(settings).values()), KafkaError.POLICY_VIOLATION))
    with pytest.raises(TopicError, match="cannot create topic"):
        create_topics(settings)
