"""One retry policy for every call a worker makes to the broker: transient errors are ridden
through within a deadline, fatal ones stop the worker at once, loudly.

Why one place: a broker restart or a leader move answers *every* kind of call for a moment with
an error that means "ask again" (FENCED_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR,
transport errors, request timeouts). A worker that treats any of them as fatal dies on the first
restart; one that treats everything as transient hides misconfiguration (no ACL, a message too
large) behind an endless loop. So the decision is made here, once, from what the client itself
says (librdkafka's ``KafkaError.fatal()`` and ``.retriable()``, the same split as Kafka Streams'
``RetriableException``) plus the codes that mean a leader, epoch or coordinator is moving, which
librdkafka does not always flag on admin and offset requests.

This module knows nothing of unlearning: it is the seed of a neutral stream runtime. Callers wrap
a *retry-safe* step (a read, an idempotent admin call such as DeleteRecords, a flush of queued
messages, a write whose duplicates are harmless) in :meth:`RetryPolicy.call`; the deadline is
``UNLEARN_BROKER_RETRY_SECONDS`` (docs/configuration.md). Past it, :class:`BrokerUnavailable`
names the step, the time spent and the last error: a worker that stops then is restarted by its
supervisor and recovers from its checkpoint (nothing lost, nothing doubled).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "TRANSIENT_CODES",
    "BrokerUnavailable",
    "RetryPolicy",
    "flush_within",
    "is_retriable",
    "kafka_error",
]

log = logging.getLogger("unlearn.retry")

T = TypeVar("T")

#: Error names that mean "the cluster is moving, ask again" even where librdkafka does not set
#: ``retriable()`` on them (admin and ListOffsets results carry the broker's code without the flag).
#: Not UNKNOWN_TOPIC_OR_PART: a missing topic is an answer (a generation deleted by a rotation is
#: met that way and handled at once), unless the client itself flags it retriable.
TRANSIENT_CODES = frozenset({
    # leaders and epochs: a node restarted, left or rejoined; the client's metadata is behind
    "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH", "NOT_LEADER_FOR_PARTITION", "NOT_LEADER_OR_FOLLOWER",
    "LEADER_NOT_AVAILABLE", "_LEADER_NOT_AVAILABLE",
    "NOT_CONTROLLER", "REPLICA_NOT_AVAILABLE", "OFFSET_NOT_AVAILABLE", "KAFKA_STORAGE_ERROR",
    "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    # coordinators (group, transaction) moving or loading
    "NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS", "_WAIT_COORD",
    "REBALANCE_IN_PROGRESS",
    # the connection: a node is down or restarting
    "_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_MSG_TIMED_OUT", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION",
    "_RESOLVE", "_DESTROY_BROKER", "_WAIT_CACHE", "THROTTLING_QUOTA_EXCEEDED",
    # the admin client's ListOffsets/DeleteRecords while no node leads the partition (measured on
    # Kafka 4.4 with the only node down: "Failed to query partition leaders: No leaders found")
    "_NOENT",
})


class BrokerUnavailable(RuntimeError):
    """A transient broker error outlasted the retry deadline: the worker stops (its supervisor
    restarts it, and it recovers from its checkpoint)."""


def kafka_error(exc: BaseException | None) -> Any:
    """The ``confluent_kafka.KafkaError`` behind ``exc``: its own (a ``KafkaException``, or an
    exception with a ``kafka_error`` attribute) or its cause's, following ``raise ... from``."""
    seen = 0
    while exc is not None and seen < 8:
        err = getattr(exc, "kafka_error", None)
        if err is None and exc.args and hasattr(exc.args[0], "code") and hasattr(exc.args[0], "retriable"):
            err = exc.args[0]
        if err is not None:
            return err
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def is_retriable(exc: BaseException) -> bool:
    """True if ``exc`` (or what caused it) is a transient broker condition worth asking again:
    a ``KafkaError`` that is not fatal and is retriable or in :data:`TRANSIENT_CODES`, or a
    timeout (a request or a wait that got no answer). Fatal and other errors: False."""
    err = kafka_error(exc)
    if err is not None:
        if err.fatal():
            return False
        return bool(err.retriable()) or err.name() in TRANSIENT_CODES
    cur: BaseException | None = exc
    for _ in range(8):
        if cur is None:
            break
        if isinstance(cur, TimeoutError):  # concurrent.futures' too (an admin future with no answer)
            return True
        cur = cur.__cause__ or cur.__context__
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """Retry a retry-safe broker step on transient errors, with jittered exponential backoff,
    for at most ``deadline_s`` seconds (module docstring)."""

    deadline_s: float = 120.0
    first_backoff_s: float = 0.1
    max_backoff_s: float = 2.0

    @classmethod
    def of(cls, settings: Any) -> RetryPolicy:
        """The policy of a process's settings (``UNLEARN_BROKER_RETRY_SECONDS``)."""
        return cls(float(settings.broker_retry_seconds))

    def call(self, what: str, fn: Callable[[], T], on_retry: Callable[[], None] | None = None) -> T:
        """``fn()``, asked again while it fails with a transient error and the deadline allows;
        a fatal error is raised as it is; a transient one past the deadline as BrokerUnavailable.
        ``on_retry`` runs before each new try: drop a client whose metadata went stale (measured on
        Kafka 4.4: an AdminClient that met FENCED_LEADER_EPOCH across a restart kept answering it
        for minutes; a new client asks for fresh metadata)."""
        started = time.monotonic()
        backoff = self.first_backoff_s
        attempt = 0
        while True:
            try:
                result = fn()
            except Exception as exc:
                if not is_retriable(exc):
                    raise
                attempt += 1
                spent = time.monotonic() - started
                if spent + backoff > self.deadline_s:
                    raise BrokerUnavailable(f"{what}: the broker kept failing for {spent:.1f}s "
                                            f"(UNLEARN_BROKER_RETRY_SECONDS={self.deadline_s:g}, {attempt} tries): "
                                            f"{exc}") from exc
                (log.warning if attempt == 1 else log.debug)("%s: transient broker error (%s); asking again",
                                                             what, exc)
                time.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(self.max_backoff_s, backoff * 2)
                if on_retry is not None:
                    on_retry()
                continue
            if attempt:
                log.info("%s: succeeded after %d retries in %.1fs", what, attempt, time.monotonic() - started)
            return result


def flush_within(producer: Any, policy: RetryPolicy, what: str) -> None:
    """Wait until every message ``producer`` holds is delivered (or has its delivery report), for
    up to the policy's deadline: while a broker restarts, produced messages wait in the client's
    queue and go out when it is back (the client retries them itself), so a flush that has not
    finished yet is not a failure until the deadline. BrokerUnavailable past it."""
    started = time.monotonic()
    while True:
        left = policy.deadline_s - (time.monotonic() - started)
        remaining = producer.flush(max(0.0, min(5.0, left)))
        if not remaining:
            return
        if left <= 5.0:
            raise BrokerUnavailable(f"{what}: {remaining} messages not delivered within "
                                    f"UNLEARN_BROKER_RETRY_SECONDS={policy.deadline_s:g}")
        log.info("%s: %d messages still waiting for the broker", what, remaining)
