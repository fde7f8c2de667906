"""Does a worker's saved position belong to the log it is about to read?

Every stateful worker (the featurizer's feature cache, the ledger's checkpoints) saves "the next
offset to read" with its state. Resuming from a saved position is only right if the log is the
one the state was built from. A recreated topic, a fresh broker, a truncated log or events lost
to retention must never be met by silently skipping (resuming past the end reads nothing and says
nothing) or by silently re-applying: ``check_resume`` raises :class:`StaleStateError` naming the
mismatch, and the worker stops with that message (exit code 2).

``topic_id`` and ``log_bounds`` ask the broker; ``check_resume`` is pure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.retry import BrokerUnavailable, RetryPolicy, is_retriable

log = logging.getLogger("unlearn.log_position")

__all__ = ["StaleStateError", "check_resume", "log_bounds", "log_ends", "topic_id", "watermarks"]



class StaleStateError(RuntimeError):
    """Saved state does not belong to the log: stop rather than skip or double."""


def check_resume(what: str, next_offset: int | None, saved_topic_id: str, topic_id: str, log_start: int,
                 log_end: int, fix: str) -> int:
    """The offset to resume at, or :class:`StaleStateError`.

    ``what``: the state's name in messages; ``next_offset``: saved next offset (None: no state,
    so start at the beginning of the log); ``saved_topic_id``/``topic_id``: the topic id the state
    was built from and the topic's id now ("" where unknown); ``log_start``/``log_end``: the first
    offset and one past the last offset the partition holds now; ``fix``: what the operator can do.
    """
    if next_offset is None:
        if log_start > 0:
            raise StaleStateError(f"{what}: no saved state, and the log starts at offset {log_start}: the "
                                  f"events before it are gone (retention), so it cannot be rebuilt; {fix}")
        return 0
    if saved_topic_id and topic_id and saved_topic_id != topic_id:
        raise StaleStateError(f"{what} belongs to topic id {saved_topic_id}, but the topic now has id {topic_id} "
                              f"(recreated): {fix}")
    if next_offset > log_end:
        raise StaleStateError(f"{what} resumes at offset {next_offset}, but the log ends at {log_end} (truncated, "
                              f"recreated or a different broker): refusing to skip; {fix}")
    if next_offset < log_start:
        raise StaleStateError(f"{what} resumes at offset {next_offset}, but the log starts at {log_start}: the "
                              f"events in between are gone (retention); {fix}")
    return next_offset


def topic_id(settings: Settings, topic: str) -> str:
    """The topic's id ("" where the broker gives none): it names one incarnation of the topic."""
    from confluent_kafka import TopicCollection


    def ask() -> str:  # a new client per try: one that met a leader change may keep stale metadata
        admin = clients.admin(settings)  # kept alive until the result is in
        fut = admin.describe_topics(TopicCollection([topic]))[topic]
        return str(fut.result(timeout=settings.admin_timeout).topic_id or "")
    try:  # a transient error must not pass for "no topic ids" (the incarnation check would be skipped)
        return RetryPolicy.of(settings).call(f"describing {topic}", ask)
    except BrokerUnavailable:
        raise
    except Exception as exc:  # a broker without topic ids: the offset checks still apply
        log.warning("topic id of %s unavailable (%s); recreated topics are detected by offsets only", topic, exc)
        return ""


def watermarks(consumer: Any, topic: str, partition: int, timeout: float) -> tuple[int, int]:
    """(low, high) watermarks of a partition, as ``consumer.get_watermark_offsets``, asked again
    until ``timeout`` while its leader is moving: on a multi-node Kafka a node's loss answers
    NOT_LEADER_FOR_PARTITION until the partition's new leader is in the client's metadata (about
    the broker session timeout), and a worker must ride through that, not exit."""
    from confluent_kafka import KafkaException, TopicPartition

    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            got = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=max(0.5, remaining))
            low, high = got
            return int(low), int(high)
        except KafkaException as exc:
            if not is_retriable(exc) or remaining <= 0:  # runtime.retry: leader, epoch or connection moving
                raise
            log.info("watermarks of %s/%d: %s; asking again", topic, partition, exc)
            time.sleep(0.25)


def log_bounds(settings: Settings, consumer: Any, topic: str, partition: int, at_least: int = 0) -> tuple[int, int]:
    """(first offset, one past the last offset) of a partition. ListOffsets can report an end that
    is too early on the embedded broker (after multi-record batches); when ``at_least`` lies beyond
    it, the true end is read from a fetch (partition EOF), so a correct state is never refused."""


    timeout = settings.admin_timeout
    low, high = watermarks(consumer, topic, partition, timeout)
    low, high = max(0, int(low)), max(0, int(high))
    if at_least <= high:
        return low, high
    probe = clients.consumer(settings, f"{settings.topic_prefix}log-probe", **{"enable.partition.eof": True})
    try:
        return low, _read_ends(probe, {(topic, partition): high}, timeout)[(topic, partition)]
    finally:
        probe.close()


def log_ends(settings: Settings, consumer: Any, parts: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """One past the true last offset of each (topic, partition) in ``parts``, read to partition EOF
    (ListOffsets can be early on the embedded broker) in one pass over all of them. ``consumer``
    must be assign-only with ``enable.partition.eof`` (it is assigned here): one consumer for every
    partition, where ``log_bounds`` starts a probe consumer per call."""
    timeout = settings.admin_timeout
    highs = {}
    for t, q in dict.fromkeys(parts):
        _, high = watermarks(consumer, t, q, timeout)
        highs[(t, q)] = max(0, int(high))
    return _read_ends(consumer, highs, timeout) if highs else {}


def _read_ends(probe: Any, highs: dict[tuple[str, int], int], timeout: float) -> dict[tuple[str, int], int]:
    """Assign ``probe`` at each partition's reported end and read on to partition EOF (or until
    ``timeout``): the true ends."""
    from confluent_kafka import KafkaError, TopicPartition

    probe.assign([TopicPartition(t, q, h) for (t, q), h in highs.items()])
    ends, waiting = dict(highs), set(highs)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        m = probe.poll(0.2)
        if m is None:
            continue
        err, off, tp = m.error(), m.offset(), (m.topic(), m.partition())
        if off is None or tp not in ends:  # set on every fetched message and partition-EOF event
            continue
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                ends[tp] = max(ends[tp], off)
                waiting.discard(tp)
            continue
        ends[tp] = max(ends[tp], off + 1)
    return ends
