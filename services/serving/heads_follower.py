"""The heads follower (:class:`HeadsFollower`): every head update, from the beginning, offered to
serving's store.

Head updates live in the ``heads`` topic family (``<prefix>heads.p<P>.g<G>``, one topic per
``deltas`` partition; docs/ledger-processor.md says how the ledger bounds it). The follower reads
every generation it finds, from the log start, and the store keeps the newest update per head
(``HeadUpdate.supersedes``), so the order in which topics are read does not matter. Reading is
the shared :class:`~unlearn.runtime.topic_reader.TopicFollower` (explicit assignment, no consumer
group, waits for the topic and the broker, EOF-based ``caught_up``, lag from fetch responses), so
the broker rules live in one place; the follower only decodes, offers and counts.
"""

from __future__ import annotations

import logging
import threading

from unlearn.common.families import heads_family
from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import LogRecord, TopicFollower
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.head import decode_head
from unlearn.services.serving.metrics import Metrics
from unlearn.services.serving.predict import HeadStore

__all__ = ["HeadsFollower"]

log = logging.getLogger("unlearn.serving")


class HeadsFollower:
    """Follows the heads family on a daemon thread and offers every update to ``store``.

    ``caught_up`` is set once every partition reached its end at least once (``/healthz``
    ``ready``); ``error`` says why it is waiting or why it stopped.
    """

    def __init__(self, settings: Settings, store: HeadStore, metrics: Metrics | None = None,
                 poll_interval: float = 0.1) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics or Metrics()
        self.topic = heads_family(settings.topic_prefix)
        self.reader = TopicFollower(settings, self.topic, self.on_record, start_at="beginning", role="serving",
                                    poll_interval=poll_interval)

    @property
    def running(self) -> bool:
        return self.reader.running

    @property
    def caught_up(self) -> threading.Event:
        return self.reader.caught_up

    @property
    def error(self) -> str | None:
        return self.reader.error

    @property
    def partitions(self) -> list[str]:
        """The ``topic/partition`` pairs being followed."""
        return [f"{t}/{p}" for t, p in sorted(self.reader.partitions)]

    def lag(self) -> dict[int | str, int]:
        """Messages not yet read per ``topic/partition`` (refreshed by the reader every 0.5 s)."""
        return self.reader.lag()

    def start(self) -> HeadsFollower:
        """Start reading (idempotent; returns at once: serving may start before the topic exists)."""
        self.reader.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close its consumer (blocking up to ``timeout``)."""
        self.reader.stop(timeout)

    def on_record(self, record: LogRecord) -> None:
        """Decode one record and offer it; tombstones are skipped, undecodable ones counted."""
        if record.value is None:  # a tombstone: nothing to serve
            return
        try:
            u = decode_head(record.value)
        except CodecError as exc:
            self.metrics.head_update("invalid")
            log.warning("undecodable head update at %s/%d@%d: %s", record.topic, record.partition, record.offset, exc)
            return
        result = self.store.offer(u)
        self.metrics.head_update(result)
        if result == "accepted":
            log.debug("head %s now version %d (%s)", u.head_id, u.version, u.mode)
