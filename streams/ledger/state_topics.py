"""The ledger's own topics on the broker (:class:`StateTopics`): ``ledger-state`` and ``heads`` per
deltas partition, created on first use, trimmed, and deleted after a grace, through one admin client.

Created compacted, and where the broker has DeleteRecords also ``cleanup.policy=compact,delete``
with ``retention.ms=-1`` (``streams.runtime.topics.trimmed_changelog_config``): Kafka refuses DeleteRecords
on a compact-only topic. Why the store trims or rotates: ``changelog_store``'s docstring.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from unlearn.infra.settings import Settings
from unlearn.streams.ledger.settings import LedgerSettings
from unlearn.streams.runtime import clients
from unlearn.streams.runtime.retry import BrokerUnavailable, RetryPolicy
from unlearn.streams.runtime.topics import (
    TopicError,
    delete_records,
    delete_topics,
    ensure_topic,
    trimmed_changelog_config,
)

__all__ = [
    "StateTopics",
]

log = logging.getLogger("unlearn.ledger")

T = TypeVar("T")


class StateTopics:
    """Creates, lists, trims and retires the ledger's topics (module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.retiring: list[tuple[float, list[str]]] = []  # (due, superseded topics)
        self.created: set[str] = set()
        self._admin_client: Any = None
        self.retry = RetryPolicy.of(settings)  # every admin call rides through a broker restart

    def admin(self) -> Any:
        """One admin client for the store's life (creating one per call reconnects every time)."""
        if self._admin_client is None:

            self._admin_client = clients.admin(self.settings)
        return self._admin_client

    def fresh_admin(self) -> None:
        """Drop the admin client before a retry (streams.runtime.retry: its metadata may be stale)."""
        self._admin_client = None

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` under the retry policy, with a new admin client for each retry."""
        return self.retry.call(what, fn, on_retry=self.fresh_admin)

    def ensure(self, name: str) -> None:
        """Create ``name`` if this store has not yet (TopicError if it cannot)."""
        if name in self.created:
            return
        self.call(f"creating {name}", lambda: ensure_topic(
            self.settings, name, compacted=True, admin=self.admin(), config=trimmed_changelog_config(self.settings)))
        self.created.add(name)

    def delete(self, names: list[str]) -> None:
        try:
            self.call(f"deleting {names}", lambda: delete_topics(self.settings, names, admin=self.admin()))
        except (TopicError, BrokerUnavailable) as exc:  # only space: say so, go on (the next rotation retries nothing)
            log.warning("could not delete superseded topics %s: %s", names, exc)
        self.created.difference_update(names)

    def listed(self) -> list[str]:
        """Every topic on the broker (whole-cluster metadata: naming a topic would auto-create
        it on the embedded broker)."""
        return list(self.call("listing topics", lambda: self.admin().list_topics(
            timeout=self.settings.admin_timeout).topics))

    def retire(self, names: list[str]) -> None:
        """Delete ``names`` once readers have had ``UNLEARN_HEADS_RETIRE_SECONDS`` to move off
        them (streams.runtime.topic_reader.source_partitions says why a reader must not be on a topic when it
        is deleted)."""
        if names:
            self.retiring.append((time.monotonic() + LedgerSettings.of(self.settings).heads_retire_seconds, names))

    def retire_due(self) -> None:
        """Delete the retired topics whose grace period is over (cheap when none is)."""
        if not self.retiring or self.retiring[0][0] > time.monotonic():
            return
        now = time.monotonic()
        due = [t for at, names in self.retiring if at <= now for t in names]
        self.retiring = [(at, names) for at, names in self.retiring if at > now]
        self.delete(due)

    def trim(self, topic: str, below: int) -> bool:
        """DeleteRecords below ``below`` on ``topic`` partition 0; False if the broker refused
        (logged: retried by the next rewrite or recovery, the erasure stays pending). DeleteRecords
        is idempotent: a transient error is asked again within the retry deadline."""
        try:
            self.call(f"trimming {topic}", lambda: delete_records(self.settings, {(topic, 0): below},
                                                                         admin=self.admin()))
        except (TopicError, BrokerUnavailable) as exc:
            log.warning("could not trim %s below offset %d: %s", topic, below, exc)
            return False
        log.debug("trimmed %s below offset %d", topic, below)
        return True

    def end_offset(self, topic: str) -> int:
        """One past the last record of ``topic`` partition 0 (ListOffsets latest: exact on every
        broker that trims, and never too high elsewhere, so trimming below it keeps all newer).
        A leader or epoch change (FENCED_LEADER_EPOCH after a restart) is asked again within the
        retry deadline; TopicError if the broker refuses, BrokerUnavailable if it stays away."""
        from confluent_kafka import KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        timeout = self.settings.admin_timeout
        tp = TopicPartition(topic, 0)

        def ask() -> int:
            try:
                fut = self.admin().list_offsets({tp: OffsetSpec.latest()}, request_timeout=timeout)[tp]
                return int(fut.result(timeout=timeout).offset)
            except (KafkaException, TimeoutError) as exc:
                raise TopicError(f"cannot read the end of {topic}: {exc}") from exc
        return self.call(f"reading the end of {topic}", ask)
