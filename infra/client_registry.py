"""Reading and writing the client registry: ``<prefix>client-registry``, key = client id, value
= an ``unlearn.client/v1`` document (``schemas/client_record.py``).

The same rules as the head registry (``infra/head_registry.py``): the latest record of a client
is the one with the highest version (the later record on a tie); records that do not parse, or
whose key is not their client id, are skipped with a warning. Only the operator principal may
write this topic (docs/security.md, ACL matrix): whoever can write it can grant any right.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from unlearn.infra.settings import Settings
from unlearn.infra.topic_reader import LogRecord, TopicFollower, read_topic
from unlearn.schemas.client_record import ClientError, ClientRecord, decode_client, encode_client

__all__ = ["CLIENT_REGISTRY_TOPIC", "ClientRegistryError", "ClientRegistryView", "fold_clients", "publish_client",
           "read_clients"]

log = logging.getLogger("unlearn.clients")

CLIENT_REGISTRY_TOPIC = "client-registry"
"""The registry's logical topic name (full name: ``settings.topic(CLIENT_REGISTRY_TOPIC)``)."""


class ClientRegistryError(RuntimeError):
    """The client registry could not be read or written."""


def _apply(latest: dict[str, ClientRecord], rec: LogRecord) -> None:
    """Fold one record into ``latest`` (the rule in the module docstring)."""
    if rec.value is None:
        return  # a tombstone: clients are revoked, never deleted
    key = rec.key.decode("utf-8", "replace") if rec.key is not None else None
    try:
        c = decode_client(rec.value)
    except ClientError as exc:
        log.warning("client-registry %d@%d: skipped, invalid record: %s", rec.partition, rec.offset, exc)
        return
    if key != c.client_id:
        log.warning("client-registry %d@%d: skipped, key %r is not client_id %r", rec.partition, rec.offset, key,
                    c.client_id)
        return
    old = latest.get(c.client_id)
    if old is None or c.version >= old.version:
        latest[c.client_id] = c


def fold_clients(records: Iterable[LogRecord]) -> dict[str, ClientRecord]:
    """Client id -> latest record, from registry records in log order."""
    latest: dict[str, ClientRecord] = {}
    for rec in records:
        _apply(latest, rec)
    return latest


def read_clients(settings: Settings, timeout: float = 30.0) -> dict[str, ClientRecord]:
    """Client id -> latest record, reading the registry to its end. Raises ``TopicReadError``
    when the topic is missing (run ``unlearn topics create``)."""
    return fold_clients(read_topic(settings, settings.topic(CLIENT_REGISTRY_TOPIC), timeout=timeout,
                                   role="clients"))


def publish_client(settings: Settings, record: ClientRecord) -> None:
    """Write one client record version and wait for the broker's acknowledgement."""
    from confluent_kafka import Producer

    from unlearn.infra.profiles import producer_config

    errors: list[str] = []
    producer = Producer(producer_config(settings))
    producer.produce(settings.topic(CLIENT_REGISTRY_TOPIC), key=record.client_id.encode(),
                     value=encode_client(record),
                     on_delivery=lambda err, _msg: errors.append(err.str()) if err is not None else None)
    if producer.flush(settings.admin_timeout) > 0:
        errors.append(f"not acknowledged within {settings.admin_timeout:g}s")
    if errors:
        raise ClientRegistryError(f"cannot write client {record.client_id!r}: {errors[0]}")


class ClientRegistryView:
    """The latest record per client, kept current by a follower thread (what the featurizer
    consults in signed mode); ``snapshot()`` is a consistent copy, so one batch is judged against
    one registry state. A revocation takes effect within the follower's poll interval."""

    def __init__(self, settings: Settings) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, ClientRecord] = {}
        self._follower = TopicFollower(settings, settings.topic(CLIENT_REGISTRY_TOPIC), self._on_record,
                                       role="clients")

    def _on_record(self, rec: LogRecord) -> None:
        with self._lock:
            _apply(self._latest, rec)

    def start(self, wait_caught_up: float | None = None) -> ClientRegistryView:
        """Start following; with ``wait_caught_up``, block until the registry was read to its end
        once (raises :class:`ClientRegistryError` after that many seconds)."""
        self._follower.start()
        if wait_caught_up is not None and not self._follower.caught_up.wait(wait_caught_up):
            raise ClientRegistryError(f"client registry {self._follower.topic!r} not read within {wait_caught_up:g}s "
                                      f"({self._follower.error}); a missing topic: run `unlearn topics create`")
        return self

    def stop(self) -> None:
        """Stop the follower thread."""
        self._follower.stop()

    def snapshot(self) -> dict[str, ClientRecord]:
        """Client id -> latest record, as known now."""
        with self._lock:
            return dict(self._latest)
