"""The registry topics: one JSON record per version of a key, nothing ever deleted; the head
registry (head contracts) and the client registry (signing clients).

**Versioned topics.** Both registries must be read by the same rules, so they are written once,
here:

- the latest record of a key is the one with the highest version (the later record on a tie);
- a tombstone is ignored (a registry revokes or extends, it never deletes);
- a record that does not parse, or whose record key is not its id field, is skipped with a
  warning, so one bad producer cannot hide a key.

A :class:`VersionedTopic` names the topic and its record format; it folds, reads to the end and
publishes. A :class:`VersionedView` follows the topic in a thread for long-running services.

**The head registry**: ``<prefix>head-registry``, key = head id, value = an
``unlearn.head-contract/v1`` document (``schemas/head_contract.py``). On Kafka the topic is compacted, so
it keeps about one record per head; on tansu (no compaction) it keeps every version ever written,
which is small: a record per create or extend.

**The client registry**: ``<prefix>client-registry``, key = client id, value = an
``unlearn.client/v1`` document (``schemas/client_record.py``). Only the operator principal may
write this topic (docs/security.md, ACL matrix): whoever can write it can grant any right.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.topic_reader import LogRecord, TopicFollower, read_topic
from unlearn.schemas.client_record import ClientError, ClientRecord, decode_client, encode_client
from unlearn.schemas.head_contract import ContractError, HeadContract, decode_contract, encode_contract

__all__ = [
    "Versioned",
    "VersionedTopic",
    "VersionedView",
    "REGISTRY_TOPIC",
    "ContractSource",
    "RegistryError",
    "RegistryView",
    "contract_at",
    "fold_contracts",
    "publish_contract",
    "read_contracts",
    "CLIENT_REGISTRY_TOPIC",
    "ClientRegistryError",
    "ClientRegistryView",
    "fold_clients",
    "publish_client",
    "read_clients",
]

log = logging.getLogger("unlearn.registry")

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


        errors: list[str] = []
        producer = clients.producer(settings)
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


_HEADS: VersionedTopic[HeadContract] = VersionedTopic(
    topic=REGISTRY_TOPIC, role="registry", key_field="head_id", key_of=lambda c: c.head_id, decode=decode_contract,
    encode=encode_contract, invalid=ContractError, noun="contract", error=RegistryError,
    write_failed="cannot write the contract of head {key!r}: {error}",
    not_read="head registry not read within {waited:g}s: {error}", log=log)


def fold_contracts(records: Iterable[LogRecord]) -> dict[str, HeadContract]:
    """Head id -> latest contract, from registry records in log order."""
    return _HEADS.fold(records)


def read_contracts(settings: Settings, timeout: float = 30.0) -> dict[str, HeadContract]:
    """Head id -> latest contract, reading the registry to its end. Raises ``TopicReadError``
    when the topic is missing (run ``unlearn topics create``)."""
    return _HEADS.read(settings, timeout)


def publish_contract(settings: Settings, contract: HeadContract) -> None:
    """Write one contract version and wait for the broker's acknowledgement."""
    _HEADS.publish(settings, contract)


class RegistryView(VersionedView[HeadContract]):
    """The latest contract per head, kept current by a follower thread: what long-running
    services (featurizer, serving) consult. ``snapshot()`` is a consistent copy, so one batch
    is judged against one registry state; ``start(wait_caught_up)`` raises ``RegistryError``
    when the registry is not read in time. It also keeps every version it has read
    (:meth:`get_version`)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(_HEADS, settings, keep_versions=True)

    def get(self, head_id: str) -> HeadContract | None:
        """A head's latest contract, or None when it is not declared (yet)."""
        with self._lock:
            return self._latest.get(head_id)

    def get_version(self, head_id: str, version: int) -> HeadContract | None:
        """A head's contract at ``version``, or None when this view has not read it (see
        :func:`contract_at`)."""
        with self._lock:
            return self._versions.get((head_id, version))


CLIENT_REGISTRY_TOPIC = "client-registry"
"""The registry's logical topic name (full name: ``settings.topic(CLIENT_REGISTRY_TOPIC)``)."""


class ClientRegistryError(RuntimeError):
    """The client registry could not be read or written."""


_CLIENTS: VersionedTopic[ClientRecord] = VersionedTopic(
    topic=CLIENT_REGISTRY_TOPIC, role="clients", key_field="client_id", key_of=lambda c: c.client_id,
    decode=decode_client, encode=encode_client, invalid=ClientError, noun="record", error=ClientRegistryError,
    write_failed="cannot write client {key!r}: {error}",
    not_read="client registry {topic!r} not read within {waited:g}s ({error}); a missing topic: run "
             "`unlearn topics create`",
    log=logging.getLogger("unlearn.clients"))


def fold_clients(records: Iterable[LogRecord]) -> dict[str, ClientRecord]:
    """Client id -> latest record, from registry records in log order."""
    return _CLIENTS.fold(records)


def read_clients(settings: Settings, timeout: float = 30.0) -> dict[str, ClientRecord]:
    """Client id -> latest record, reading the registry to its end. Raises ``TopicReadError``
    when the topic is missing (run ``unlearn topics create``)."""
    return _CLIENTS.read(settings, timeout)


def publish_client(settings: Settings, record: ClientRecord) -> None:
    """Write one client record version and wait for the broker's acknowledgement."""
    _CLIENTS.publish(settings, record)


class ClientRegistryView(VersionedView[ClientRecord]):
    """The latest record per client, kept current by a follower thread (what the featurizer
    consults in signed mode); ``snapshot()`` is a consistent copy, so one batch is judged against
    one registry state. A revocation takes effect within the follower's poll interval.
    ``start(wait_caught_up)`` raises :class:`ClientRegistryError` when the registry is not read
    in time."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(_CLIENTS, settings)
