"""Reading and writing the head registry: ``<prefix>head-registry``, key = head id, value = an
``unlearn.head-contract/v1`` document (``schemas/head_contract.py``).

The latest contract of a head is the one with the highest version (the later record on a tie);
records that do not parse, or whose key is not their head id, are skipped with a warning, so one
bad producer cannot hide a head (the rules of every versioned registry,
``infra/versioned_registry.py``). On Kafka the topic is compacted, so it keeps about one record
per head; on tansu (no compaction) it keeps every version ever written, which is small: a record
per create or extend, a few hundred bytes each.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from unlearn.infra.settings import Settings
from unlearn.infra.topic_reader import LogRecord
from unlearn.infra.versioned_registry import VersionedTopic, VersionedView
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


_REGISTRY: VersionedTopic[HeadContract] = VersionedTopic(
    topic=REGISTRY_TOPIC, role="registry", key_field="head_id", key_of=lambda c: c.head_id, decode=decode_contract,
    encode=encode_contract, invalid=ContractError, noun="contract", error=RegistryError,
    write_failed="cannot write the contract of head {key!r}: {error}",
    not_read="head registry not read within {waited:g}s: {error}", log=log)


def fold_contracts(records: Iterable[LogRecord]) -> dict[str, HeadContract]:
    """Head id -> latest contract, from registry records in log order."""
    return _REGISTRY.fold(records)


def read_contracts(settings: Settings, timeout: float = 30.0) -> dict[str, HeadContract]:
    """Head id -> latest contract, reading the registry to its end. Raises ``TopicReadError``
    when the topic is missing (run ``unlearn topics create``)."""
    return _REGISTRY.read(settings, timeout)


def publish_contract(settings: Settings, contract: HeadContract) -> None:
    """Write one contract version and wait for the broker's acknowledgement."""
    _REGISTRY.publish(settings, contract)


class RegistryView(VersionedView[HeadContract]):
    """The latest contract per head, kept current by a follower thread: what long-running
    services (featurizer, serving) consult. ``snapshot()`` is a consistent copy, so one batch
    is judged against one registry state; ``start(wait_caught_up)`` raises ``RegistryError``
    when the registry is not read in time. It also keeps every version it has read
    (:meth:`get_version`)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(_REGISTRY, settings, keep_versions=True)

    def get(self, head_id: str) -> HeadContract | None:
        """A head's latest contract, or None when it is not declared (yet)."""
        with self._lock:
            return self._latest.get(head_id)

    def get_version(self, head_id: str, version: int) -> HeadContract | None:
        """A head's contract at ``version``, or None when this view has not read it (see
        :func:`contract_at`)."""
        with self._lock:
            return self._versions.get((head_id, version))
