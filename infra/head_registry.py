"""Reading and writing the head registry: ``<prefix>head-registry``, key = head id, value = an
``unlearn.head-contract/v1`` document (``schemas/head_contract.py``).

The latest contract of a head is the one with the highest version (the later record on a tie);
records that do not parse, or whose key is not their head id, are skipped with a warning, so one
bad producer cannot hide a head. On Kafka the topic is compacted, so it keeps about one record
per head; on tansu (no compaction) it keeps every version ever written, which is small: a record
per create or extend, a few hundred bytes each.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Protocol

from unlearn.infra.settings import Settings
from unlearn.infra.topic_reader import LogRecord, TopicFollower, read_topic
from unlearn.schemas.head_contract import ContractError, HeadContract, decode_contract, encode_contract

__all__ = ["REGISTRY_TOPIC", "ContractSource", "RegistryError", "RegistryView", "contract_at", "fold_contracts",
           "publish_contract", "read_contracts"]

log = logging.getLogger("unlearn.registry")

REGISTRY_TOPIC = "head-registry"
"""The registry's logical topic name (full name: ``settings.topic(REGISTRY_TOPIC)``)."""


class RegistryError(RuntimeError):
    """The registry could not be read or written."""


class ContractSource(Protocol):
    """Where a service looks up a head's latest contract: a :class:`RegistryView`, or a plain
    mapping (tests, offline use)."""

    def get(self, head_id: str, /) -> HeadContract | None: ...


def contract_at(source: ContractSource, head_id: str, version: int | None) -> HeadContract | None:
    """The contract a head update names (``HeadUpdate.contract_version``): that version when
    ``source`` keeps versions (a :class:`RegistryView`) and has read it, else the head's latest
    (an update that names none, a plain mapping, or a version compacted away or not read yet:
    versions of a head differ only in their label space, ``HeadContract.extend``)."""
    if version is not None:
        by_version = getattr(source, "get_version", None)
        if by_version is not None:
            found: HeadContract | None = by_version(head_id, version)
            if found is not None:
                return found
    return source.get(head_id)


def _apply(latest: dict[str, HeadContract], rec: LogRecord,
           versions: dict[tuple[str, int], HeadContract] | None = None) -> None:
    """Fold one record into ``latest`` (the rule in the module docstring) and, when given, into
    ``versions`` ((head id, version) -> the latest record of that version)."""
    key = rec.key.decode("utf-8", "replace") if rec.key is not None else None
    if rec.value is None:
        return  # a tombstone: heads are never deleted from the registry
    try:
        c = decode_contract(rec.value)
    except ContractError as exc:
        log.warning("head-registry %d@%d: skipped, invalid contract: %s", rec.partition, rec.offset, exc)
        return
    if key != c.head_id:
        log.warning("head-registry %d@%d: skipped, key %r is not head_id %r", rec.partition, rec.offset, key, c.head_id)
        return
    if versions is not None:
        versions[(c.head_id, c.version)] = c
    old = latest.get(c.head_id)
    if old is None or c.version >= old.version:
        latest[c.head_id] = c


def fold_contracts(records: Iterable[LogRecord]) -> dict[str, HeadContract]:
    """Head id -> latest contract, from registry records in log order."""
    latest: dict[str, HeadContract] = {}
    for rec in records:
        _apply(latest, rec)
    return latest


def read_contracts(settings: Settings, timeout: float = 30.0) -> dict[str, HeadContract]:
    """Head id -> latest contract, reading the registry to its end. Raises ``TopicReadError``
    when the topic is missing (run ``unlearn topics create``)."""
    return fold_contracts(read_topic(settings, settings.topic(REGISTRY_TOPIC), timeout=timeout, role="registry"))


def publish_contract(settings: Settings, contract: HeadContract) -> None:
    """Write one contract version and wait for the broker's acknowledgement."""
    from confluent_kafka import Producer

    from unlearn.infra.profiles import producer_config

    errors: list[str] = []
    producer = Producer(producer_config(settings))
    producer.produce(settings.topic(REGISTRY_TOPIC), key=contract.head_id.encode(), value=encode_contract(contract),
                     on_delivery=lambda err, _msg: errors.append(err.str()) if err is not None else None)
    if producer.flush(settings.admin_timeout) > 0:
        errors.append(f"not acknowledged within {settings.admin_timeout:g}s")
    if errors:
        raise RegistryError(f"cannot write the contract of head {contract.head_id!r}: {errors[0]}")


class RegistryView:
    """The latest contract per head, kept current by a follower thread: what long-running
    services (featurizer, serving) consult. ``snapshot()`` is a consistent copy, so one batch
    is judged against one registry state."""

    def __init__(self, settings: Settings) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, HeadContract] = {}
        self._versions: dict[tuple[str, int], HeadContract] = {}
        self._follower = TopicFollower(settings, settings.topic(REGISTRY_TOPIC), self._on_record, role="registry")

    def _on_record(self, rec: LogRecord) -> None:
        with self._lock:
            _apply(self._latest, rec, self._versions)

    def start(self, wait_caught_up: float | None = None) -> RegistryView:
        """Start following; with ``wait_caught_up``, block until the registry was read to its end
        once (raises ``RegistryError`` after that many seconds)."""
        self._follower.start()
        if wait_caught_up is not None and not self._follower.caught_up.wait(wait_caught_up):
            raise RegistryError(f"head registry not read within {wait_caught_up:g}s: {self._follower.error}")
        return self

    def stop(self) -> None:
        """Stop the follower thread."""
        self._follower.stop()

    def get(self, head_id: str) -> HeadContract | None:
        """A head's latest contract, or None when it is not declared (yet)."""
        with self._lock:
            return self._latest.get(head_id)

    def get_version(self, head_id: str, version: int) -> HeadContract | None:
        """A head's contract at ``version``, or None when this view has not read it (see
        :func:`contract_at`)."""
        with self._lock:
            return self._versions.get((head_id, version))

    def snapshot(self) -> dict[str, HeadContract]:
        """Head id -> latest contract, as known now."""
        with self._lock:
            return dict(self._latest)
