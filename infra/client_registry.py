"""Reading and writing the client registry: ``<prefix>client-registry``, key = client id, value
= an ``unlearn.client/v1`` document (``schemas/client_record.py``).

The same rules as the head registry (``infra/head_registry.py``), both written once in
``infra/versioned_registry.py``: the latest record of a client is the one with the highest
version (the later record on a tie); records that do not parse, or whose key is not their client
id, are skipped with a warning. Only the operator principal may write this topic
(docs/security.md, ACL matrix): whoever can write it can grant any right.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from unlearn.infra.settings import Settings
from unlearn.infra.topic_reader import LogRecord
from unlearn.infra.versioned_registry import VersionedTopic, VersionedView
from unlearn.schemas.client_record import ClientError, ClientRecord, decode_client, encode_client

__all__ = ["CLIENT_REGISTRY_TOPIC", "ClientRegistryError", "ClientRegistryView", "fold_clients", "publish_client",
           "read_clients"]

log = logging.getLogger("unlearn.clients")

CLIENT_REGISTRY_TOPIC = "client-registry"
"""The registry's logical topic name (full name: ``settings.topic(CLIENT_REGISTRY_TOPIC)``)."""


class ClientRegistryError(RuntimeError):
    """The client registry could not be read or written."""


_REGISTRY: VersionedTopic[ClientRecord] = VersionedTopic(
    topic=CLIENT_REGISTRY_TOPIC, role="clients", key_field="client_id", key_of=lambda c: c.client_id,
    decode=decode_client, encode=encode_client, invalid=ClientError, noun="record", error=ClientRegistryError,
    write_failed="cannot write client {key!r}: {error}",
    not_read="client registry {topic!r} not read within {waited:g}s ({error}); a missing topic: run "
             "`unlearn topics create`",
    log=log)


def fold_clients(records: Iterable[LogRecord]) -> dict[str, ClientRecord]:
    """Client id -> latest record, from registry records in log order."""
    return _REGISTRY.fold(records)


def read_clients(settings: Settings, timeout: float = 30.0) -> dict[str, ClientRecord]:
    """Client id -> latest record, reading the registry to its end. Raises ``TopicReadError``
    when the topic is missing (run ``unlearn topics create``)."""
    return _REGISTRY.read(settings, timeout)


def publish_client(settings: Settings, record: ClientRecord) -> None:
    """Write one client record version and wait for the broker's acknowledgement."""
    _REGISTRY.publish(settings, record)


class ClientRegistryView(VersionedView[ClientRecord]):
    """The latest record per client, kept current by a follower thread (what the featurizer
    consults in signed mode); ``snapshot()`` is a consistent copy, so one batch is judged against
    one registry state. A revocation takes effect within the follower's poll interval.
    ``start(wait_caught_up)`` raises :class:`ClientRegistryError` when the registry is not read
    in time."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(_REGISTRY, settings)
