"""A versioned registry topic: one JSON record per version of a key, nothing ever deleted.

The head registry (``infra/head_registry.py``, head contracts) and the client registry
(``infra/client_registry.py``, signing clients) are both such a topic, and both must read it by
the same rules, so they are written once here:

- the latest record of a key is the one with the highest version (the later record on a tie);
- a tombstone is ignored (a registry revokes or extends, it never deletes);
- a record that does not parse, or whose record key is not its id field, is skipped with a
  warning, so one bad producer cannot hide a key.

A :class:`VersionedTopic` names the topic and its record format; it folds, reads to the end and
publishes. A :class:`VersionedView` follows the topic in a thread for long-running services.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

from unlearn.infra.settings import Settings
from unlearn.infra.topic_reader import LogRecord, TopicFollower, read_topic

__all__ = ["Versioned", "VersionedTopic", "VersionedView"]


class Versioned(Protocol):
    """What the fold needs of a record besides its key: its version."""

    @property
    def version(self) -> int: ...


R = TypeVar("R", bound=Versioned)


@dataclass(frozen=True)
class VersionedTopic(Generic[R]):
    """One registry topic and its record format. The message templates keep each registry's
    own wording (operators grep for it): ``write_failed`` takes ``key`` and ``error``,
    ``not_read`` takes ``topic``, ``waited`` and ``error``."""

    topic: str
    """The logical topic name; also what its warnings start with."""
    role: str
    """The reader role (consumer group prefix; docs/security.md grants it)."""
    key_field: str
    """The record's id field, e.g. ``head_id``: the record key must equal it."""
    key_of: Callable[[R], str]
    decode: Callable[[bytes], R]
    encode: Callable[[R], bytes]
    invalid: type[ValueError]
    """What ``decode`` raises for a record it refuses."""
    noun: str
    """What a record is called in the warning about an invalid one ("contract", "record")."""
    error: type[RuntimeError]
    """What reading or writing the registry raises."""
    write_failed: str
    not_read: str
    log: logging.Logger

    def apply(self, latest: dict[str, R], rec: LogRecord, versions: dict[tuple[str, int], R] | None = None) -> None:
        """Fold one record into ``latest`` (the rules in the module docstring) and, when given,
        into ``versions`` ((key, version) -> the latest record of that version)."""
        if rec.value is None:
            return  # a tombstone: nothing is deleted from a registry
        key = rec.key.decode("utf-8", "replace") if rec.key is not None else None
        try:
            r = self.decode(rec.value)
        except self.invalid as exc:
            self.log.warning("%s %d@%d: skipped, invalid %s: %s", self.topic, rec.partition, rec.offset, self.noun,
                             exc)
            return
        rid = self.key_of(r)
        if key != rid:
            self.log.warning("%s %d@%d: skipped, key %r is not %s %r", self.topic, rec.partition, rec.offset, key,
                             self.key_field, rid)
            return
        if versions is not None:
            versions[(rid, r.version)] = r
        old = latest.get(rid)
        if old is None or r.version >= old.version:
            latest[rid] = r

    def fold(self, records: Iterable[LogRecord]) -> dict[str, R]:
        """Key -> latest record, from registry records in log order."""
        latest: dict[str, R] = {}
        for rec in records:
            self.apply(latest, rec)
        return latest

    def read(self, settings: Settings, timeout: float) -> dict[str, R]:
        """Key -> latest record, reading the topic to its end once. Raises ``TopicReadError``
        when the topic is missing (run ``unlearn topics create``)."""
        return self.fold(read_topic(settings, settings.topic(self.topic), timeout=timeout, role=self.role))

    def publish(self, settings: Settings, record: R) -> None:
        """Write one record version and wait for the broker's acknowledgement, so a caller
        that returns has its change on the log."""
        from confluent_kafka import Producer

        from unlearn.infra.profiles import producer_config

        errors: list[str] = []
        producer = Producer(producer_config(settings))
        producer.produce(settings.topic(self.topic), key=self.key_of(record).encode(), value=self.encode(record),
                         on_delivery=lambda err, _msg: errors.append(err.str()) if err is not None else None)
        if producer.flush(settings.admin_timeout) > 0:
            errors.append(f"not acknowledged within {settings.admin_timeout:g}s")
        if errors:
            raise self.error(self.write_failed.format(key=self.key_of(record), error=errors[0]))


class VersionedView(Generic[R]):
    """The latest record per key, kept current by a follower thread, for long-running services;
    ``snapshot()`` is a consistent copy, so one batch is judged against one registry state.
    With ``keep_versions`` it also keeps every (key, version) it has read."""

    def __init__(self, registry: VersionedTopic[R], settings: Settings, *, keep_versions: bool = False) -> None:
        self._registry = registry
        self._keep_versions = keep_versions
        self._lock = threading.Lock()
        self._latest: dict[str, R] = {}
        self._versions: dict[tuple[str, int], R] = {}
        self._follower = TopicFollower(settings, settings.topic(registry.topic), self._on_record, role=registry.role)

    def _on_record(self, rec: LogRecord) -> None:
        with self._lock:
            self._registry.apply(self._latest, rec, self._versions if self._keep_versions else None)

    def start(self, wait_caught_up: float | None = None) -> Self:
        """Start following; with ``wait_caught_up``, block until the registry was read to its end
        once (raises the registry's error after that many seconds)."""
        self._follower.start()
        if wait_caught_up is not None and not self._follower.caught_up.wait(wait_caught_up):
            raise self._registry.error(self._registry.not_read.format(
                topic=self._follower.topic, waited=wait_caught_up, error=self._follower.error))
        return self

    def stop(self) -> None:
        """Stop the follower thread."""
        self._follower.stop()

    def snapshot(self) -> dict[str, R]:
        """Key -> latest record, as known now."""
        with self._lock:
            return dict(self._latest)
