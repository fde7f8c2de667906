"""Trimming raw inputs (:class:`Trimmer`): DeleteRecords on ``requests`` and ``requests.by-head``
below what every consumer group of the deployment (groups under the topic prefix, e.g. a
federated featurizer's ``featurizer.<client>``) has committed, where the broker supports it
(``BrokerQuirks.delete_records``); docs/erasure.md, section 5.

Once the featurizer group has committed an offset on a partition, every record below it is
durably elsewhere (a ``requests`` offset is committed only after its forward to by-head is
acknowledged; a by-head offset only after the batch's changelog records and outputs are), so
nothing needs it again. A partition this featurizer's own group never committed on is left alone
(:func:`trim_bounds`, pure). Off the poll loop: the poll loop offers
its assignment when a trim is due (:meth:`Trimmer.offer`) and one background thread lists the
groups' offsets and deletes, at most once per ``UNLEARN_TRIM_EVERY_SECONDS``; a failed trim is
logged and retried on the next period (it delays erasure, never correctness).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from unlearn.infra.settings import ErasureSettings, Settings
from unlearn.runtime import clients
from unlearn.runtime.retry import BrokerUnavailable, RetryPolicy, is_retriable, kafka_error
from unlearn.runtime.topics import delete_records

__all__ = ["TP", "Trimmer", "trim_bounds"]

log = logging.getLogger("unlearn.featurizer.erasure")

TP = tuple[str, int]


def trim_bounds(own: str, committed: Mapping[str, Mapping[TP, int]], partitions: Iterable[TP]) -> dict[TP, int]:
    """Where each partition may be trimmed to: the lowest offset any group committed on it, for
    the partitions that ``own`` (the featurizer's group) committed on; the others are left out.
    Pure: ``committed`` maps group -> (topic, partition) -> committed offset (absent: none)."""
    out: dict[TP, int] = {}
    for tp in partitions:
        if committed.get(own, {}).get(tp, -1) < 0:
            continue
        out[tp] = min(offs[tp] for offs in committed.values() if offs.get(tp, -1) >= 0)
    return out


class Trimmer:
    """DeleteRecords below every group's committed offsets on the featurizer's raw-input topics,
    for the partitions its member is assigned (module docstring)."""

    def __init__(self, settings: Settings, group: str, topics: Iterable[str]) -> None:

        self.settings = settings
        self.group = group
        self.topics = frozenset(topics)
        self.every = ErasureSettings.of(settings).trim_every_seconds
        self.admin: Any = clients.admin(settings)
        self.trimmed: dict[TP, int] = {}  # the log start this trimmer last set, per partition
        self._readers: dict[str, Any] = {}  # group -> consumer reading its committed offsets
        self.stats = {"trims": 0, "records": 0, "failures": 0}
        self._next = time.monotonic() + self.every
        self._offered: list[TP] | None = None
        self.fatal: BaseException | None = None  # a non-transient broker error: raised by the poll loop (check)
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="featurizer-trim", daemon=True)
        self._thread.start()

    def due(self) -> bool:
        """Whether the poll loop should offer its assignment now (cheap: a clock read)."""
        return time.monotonic() >= self._next

    def offer(self, assignment: Iterable[Any]) -> None:
        """Hand the member's assigned partitions (``TopicPartition``s) to the background thread."""
        self._next = time.monotonic() + self.every
        tps = [(tp.topic, tp.partition) for tp in assignment if tp.topic in self.topics]
        with self._cv:
            self._offered = tps
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._offered is None and not self._closed:
                    self._cv.wait()
                tps, self._offered = self._offered, None
                if self._closed or tps is None:
                    return
            try:  # runtime.retry: DeleteRecords is idempotent, a new admin client and readers per try
                RetryPolicy.of(self.settings).call("raw-input trim", functools.partial(self.trim, tps),
                                                   on_retry=self._renew)
            except Exception as exc:  # transient past the deadline: retried next period (delays erasure only)
                self.stats["failures"] += 1
                if not isinstance(exc, BrokerUnavailable) and kafka_error(exc) is not None and not is_retriable(exc):
                    self.fatal = exc  # authorization, configuration: the featurizer stops (check)
                    log.error("raw-input trim failed: %s", exc)
                    return
                log.warning("raw-input trim failed (retried in %.1fs): %s", self.every, exc)

    def check(self) -> None:
        """Raise the trim's fatal error on the caller's thread (the poll loop), if there was one."""
        if self.fatal is not None:
            raise self.fatal

    def _renew(self) -> None:
        """Before a new try: a new admin client and new offset readers (ones that met a restart
        may keep stale metadata, runtime.retry)."""

        self.admin = clients.admin(self.settings)
        readers, self._readers = self._readers, {}
        for c in readers.values():
            c.close()

    def committed(self, partitions: Iterable[TP]) -> dict[str, dict[TP, int]]:
        """group -> (topic, partition) -> committed offset on ``partitions``, for every consumer
        group under the topic prefix that this principal can see.

        Read with a consumer of each group (OffsetFetch through its coordinator, never joining the
        group), not the admin client's ListConsumerGroupOffsets: librdkafka 2.16 dereferences a
        consumer group the admin client does not have when that response carries a coordinator
        error, which killed the featurizer with SIGSEGV while a node was down."""
        from confluent_kafka import TopicPartition

        timeout = self.settings.admin_timeout
        listing = self.admin.list_consumer_groups(request_timeout=timeout).result(timeout=timeout)
        groups = {g.group_id for g in listing.valid if g.group_id.startswith(self.settings.topic_prefix)}
        groups.add(self.group)
        asked = [TopicPartition(t, p) for t, p in sorted(set(partitions))]
        out: dict[str, dict[TP, int]] = {}
        for g in sorted(groups):
            res = self._reader(g).committed(asked, timeout=timeout)
            out[g] = {(tp.topic, tp.partition): tp.offset for tp in res
                      if tp.topic in self.topics and tp.error is None and tp.offset >= 0}
        return out

    def _reader(self, group: str) -> Any:
        """A consumer of ``group`` that only reads its committed offsets (kept per group)."""

        if group not in self._readers:
            self._readers[group] = clients.consumer(self.settings, group, **{"enable.auto.commit": False})
        return self._readers[group]

    def trim(self, partitions: Iterable[TP]) -> int:
        """Trim ``partitions`` now (the background thread's step; tests call it directly). Returns
        how many partitions got a new log start."""
        wanted = sorted(set(partitions))
        if not wanted:
            return 0
        bounds = trim_bounds(self.group, self.committed(wanted), wanted)
        todo = {tp: off for tp, off in bounds.items() if off > self.trimmed.get(tp, 0)}
        if not todo:
            return 0
        lows = delete_records(self.settings, todo, admin=self.admin)
        for tp, low in lows.items():
            self.stats["records"] += max(0, low - self.trimmed.get(tp, 0))
            self.trimmed[tp] = low
        done = len(lows)
        self.stats["trims"] += 1
        log.debug("trimmed %s", {f"{t}[{p}]": o for (t, p), o in self.trimmed.items()})
        return done

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=self.settings.admin_timeout)
        if not self._thread.is_alive():  # the thread's consumers are closed by the thread's owner only
            for c in self._readers.values():
                c.close()
            self._readers.clear()
