"""The generation topics a writer owns (:class:`FamilyTopics`): created on first use, listed,
trimmed, and deleted a grace period after they were superseded, through one admin client.

Why one holder: every writer of a topic family (``topic_family``) needs the same mechanism, and
its rules are easy to get subtly wrong twice: every admin call rides through a broker restart
with a *new* admin client on each retry (an AdminClient that met FENCED_LEADER_EPOCH may keep
answering it for minutes: docs/ledger-processor.md, "Broker faults"); a superseded generation is
deleted only after the grace, because a reader still fetching from a deleted topic crashes
librdkafka (``topic_reader.source_partitions``); a failed deletion only costs space (the next
owner retires what it finds), so it is logged, not raised. What the records mean, and when to
rotate, trim or compact, is the writer's policy: it chooses by ``BrokerQuirks`` and tells this
holder which topic config a generation gets and how long the grace is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.retry import BrokerUnavailable, RetryPolicy
from unlearn.runtime.topic_family import TopicFamily
from unlearn.runtime.topics import TopicError, delete_records, delete_topics, ensure_topic

__all__ = ["FamilyTopics"]

log = logging.getLogger("unlearn.runtime.family_topics")

T = TypeVar("T")


class FamilyTopics:
    """Creates, lists, trims and retires generation topics (module docstring). ``grace_s``: how
    long a retired topic lives; ``config``: the extra topic configs of a new generation (created
    compacted); ``share``: a holder whose admin client this one uses (one set of librdkafka
    threads for several families of one process)."""

    def __init__(self, settings: Settings, *, grace_s: float, config: Mapping[str, str] | None = None,
                 share: FamilyTopics | None = None) -> None:
        self.settings = settings
        self.grace_s = grace_s
        self.config = dict(config or {})
        self.retry = RetryPolicy.of(settings)  # every admin call rides through a broker restart
        self.retiring: list[tuple[float, list[str]]] = []  # (due, superseded topics)
        self.created: set[str] = set()  # known to exist: ensure() skips them (dropped when a listing lacks them)
        self._share = share
        self._admin_client: Any = None

    # ------------------------------------------------------------------ the admin client
    def admin(self) -> Any:
        """One admin client for the holder's life (creating one per call reconnects every time)."""
        if self._share is not None:
            return self._share.admin()
        if self._admin_client is None:
            self._admin_client = clients.admin(self.settings)
        return self._admin_client

    def fresh_admin(self) -> None:
        """Drop the admin client before a retry (runtime.retry: its metadata may be stale)."""
        if self._share is not None:
            self._share.fresh_admin()
        self._admin_client = None

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` under the retry policy, with a new admin client for each retry."""
        return self.retry.call(what, fn, on_retry=self.fresh_admin)

    # ------------------------------------------------------------------ listing and creating
    def topic_names(self) -> list[str]:
        """Every topic on the broker, asked once (for a caller's own retried read): whole-cluster
        metadata, since naming a topic would auto-create it on the embedded broker. A created
        topic the listing lacks was deleted by someone else: ``ensure`` creates it again."""
        names = list(self.admin().list_topics(timeout=self.settings.admin_timeout).topics)
        self.created.intersection_update(names)
        return names

    def listed(self) -> list[str]:
        """Every topic on the broker (:meth:`topic_names` under the retry policy)."""
        return self.call("listing topics", self.topic_names)

    def generations(self, family: TopicFamily, partition: int) -> list[int]:
        """The generations of ``family``'s ``partition`` that exist on the broker, ascending."""
        return family.generations(self.listed(), partition)

    def ensure(self, name: str) -> None:
        """Create ``name`` (compacted, with ``config``) unless this holder knows it exists, and
        wait until it is visible (TopicError if it cannot; creating an existing topic is no error)."""
        if name in self.created:
            return
        self.call(f"creating {name}", lambda: ensure_topic(
            self.settings, name, compacted=True, admin=self.admin(), config=self.config))
        self.created.add(name)

    def adopt(self, name: str) -> None:
        """``name`` exists (a read found it): :meth:`ensure` need not ask the broker."""
        self.created.add(name)

    # ------------------------------------------------------------------ retiring
    def delete(self, names: list[str]) -> bool:
        """Delete ``names`` now (a missing one is fine). False if the broker refused or stayed
        away: logged, since only space is at stake."""
        if not names:
            return True
        self.created.difference_update(names)
        try:
            self.call(f"deleting {names}", lambda: delete_topics(self.settings, names, admin=self.admin()))
        except (TopicError, BrokerUnavailable) as exc:
            log.warning("could not delete superseded topics %s: %s", names, exc)
            return False
        return True

    def retire(self, names: list[str]) -> None:
        """Delete ``names`` once readers have had ``grace_s`` to move off them."""
        if names:
            self.retiring.append((time.monotonic() + self.grace_s, list(names)))

    def retire_due(self, force: bool = False) -> list[str]:
        """Delete the retired topics whose grace is over (all of them with ``force``); returns
        those deleted ([] if none was due or the deletion failed). Cheap when none is due."""
        now = time.monotonic()
        due = [t for at, names in self.retiring if force or at <= now for t in names]
        if not due:
            return []
        self.retiring = [(at, names) for at, names in self.retiring if not (force or at <= now)]
        return due if self.delete(due) else []

    # ------------------------------------------------------------------ offsets
    def trim(self, topic: str, below: int) -> bool:
        """DeleteRecords below ``below`` on ``topic`` partition 0, where the broker has it
        (``BrokerQuirks.delete_records``); False if the broker refused (logged: the caller tries
        again later). DeleteRecords is idempotent: a transient error is asked again."""
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
