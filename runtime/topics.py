"""The project's topics: names, creation (idempotent) and readiness.

Topics are always created explicitly: tansu auto-creates an unknown topic with 4 partitions on
first use, which would silently give a deployment the wrong partition count (and keying by
subject/head only orders events within a partition). ``featurizer-cache`` is compacted: it is a
table. Head updates and the ledger's state are not here: they are topic families
(``common``) that the ledger creates, and trims (``delete_records``) or rotates, per
``deltas`` partition.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from unlearn.infra.cli_args import CliUsageError, add_broker_args, settings_from_args, settings_help
from unlearn.infra.polling import poll_until
from unlearn.infra.settings import ErasureSettings, Settings
from unlearn.runtime import clients
from unlearn.runtime.clients import quirks, topic_config

__all__ = [
    "COMPACTED",
    "RAW_INPUT",
    "TOPICS",
    "TopicError",
    "create_topics",
    "delete_records",
    "delete_topics",
    "ensure_topic",
    "key_family_config",
    "raw_input_config",
    "topic_names",
    "topics_main",
    "trimmed_changelog_config",
    "wait_for_topics",
]

log = logging.getLogger(__name__)

TOPICS: tuple[str, ...] = ("requests", "requests.by-head", "deltas", "receipts", "deadletter", "featurizer-cache",
                           "head-registry", "client-registry", "transit-keys")
"""Logical topic names; the full name is ``settings.topic(name)`` (prefix + name). ``requests.by-head``
is the featurizer's internal repartition topic (``streams/featurizer/routing.py``); ``head-registry``
holds the head contracts (``services/registry``, docs/registry.md); ``client-registry`` the clients'
keys and rights (docs/security.md); ``transit-keys`` the public halves of the featurizers' transit
keys (docs/erasure.md section 5)."""

COMPACTED: frozenset[str] = frozenset({"featurizer-cache", "head-registry", "client-registry", "transit-keys"})
"""Logical topics created with cleanup.policy=compact."""

RAW_INPUT: frozenset[str] = frozenset({"requests", "requests.by-head"})
"""Logical topics holding upstream raw inputs: created with ``retention.ms`` =
``UNLEARN_REQUESTS_RETENTION_MS`` when it is set (docs/erasure.md section 5; the embedded broker
accepts the setting but never deletes anything)."""


def raw_input_config(settings: Settings) -> dict[str, str]:
    """The extra topic configs of a raw-input topic: ``retention.ms`` when set, and where the
    featurizer trims them (DeleteRecords) ``segment.ms``, so trimmed records leave the disk within
    a bound (a segment is deleted only once it is no longer the active one)."""
    erasure = ErasureSettings.of(settings)
    conf = {"retention.ms": str(erasure.requests_retention_ms)} if erasure.requests_retention_ms > 0 else {}
    if quirks(settings).delete_records and erasure.trim_every_seconds > 0:
        conf["segment.ms"] = str(erasure.segment_ms)
    return conf


def trimmed_changelog_config(settings: Settings) -> dict[str, str]:
    """The extra configs of a compacted topic its writer also trims with DeleteRecords (the
    ledger's ``ledger-state`` and ``heads``), where the broker can: Kafka refuses DeleteRecords
    (POLICY_VIOLATION) unless cleanup.policy includes ``delete``, and ``retention.ms`` = -1 keeps
    that policy from ever deleting by age: only the writer's trims and compaction remove records."""
    if not quirks(settings).delete_records:
        return {}
    return {"cleanup.policy": "compact,delete", "retention.ms": "-1", "retention.bytes": "-1"}


def key_family_config(settings: Settings) -> dict[str, str]:
    """The extra configs of a key-family generation (``subject-keys``, ``transit-private``) where
    compaction runs: a destroyed key's tombstone (a key id, no key material) stays
    ``delete.retention.ms`` = 5 x ``UNLEARN_SEGMENT_MS`` after its segment is cleaned, instead of
    Kafka's default day, so the family holds the live keys plus the last few minutes' tombstones. A
    reader folds the family to its end within ``UNLEARN_ADMIN_TIMEOUT`` (common
    ``_read``), far less, so no read sees a destroyed key's record without its tombstone."""
    if not quirks(settings).compaction_runs:
        return {}
    return {"delete.retention.ms": str(5 * ErasureSettings.of(settings).segment_ms)}


class TopicError(RuntimeError):
    """A topic could not be created or did not become visible in time."""


def topic_names(settings: Settings, extra: Iterable[str] = ()) -> dict[str, str]:
    """Logical name -> full topic name, for the project's topics plus ``extra``."""
    return {name: settings.topic(name) for name in (*TOPICS, *extra)}


def create_topics(
    settings: Settings, partitions: int | None = None, extra: Iterable[str] = ()
) -> dict[str, int]:
    """Create the project's topics (plus logical names in ``extra``) if missing.

    Idempotent: a topic that already exists is left as it is (a different partition count is
    logged, not changed: repartitioning would break key order). Returns full name -> partition
    count as the broker reports it once every topic is visible.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    n = partitions if partitions is not None else settings.partitions
    if n < 1:
        raise ValueError(f"partitions must be >= 1, got {n}")
    names = topic_names(settings, extra)
    admin = clients.admin(settings)
    new = [
        NewTopic(
            full,
            num_partitions=n,
            replication_factor=1 if settings.profile == "tansu" else -1,  # -1: broker default
            config={**topic_config(settings, compacted=logical in COMPACTED),
                    **(raw_input_config(settings) if logical in RAW_INPUT else {})},
        )
        for logical, full in names.items()
    ]
    futures = admin.create_topics(new, request_timeout=settings.admin_timeout)
    unauthorized = []
    for full, fut in futures.items():
        try:
            fut.result(timeout=settings.admin_timeout)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                # A worker principal without CREATE (docs/security.md, ACL matrix): Kafka answers
                # this before it checks existence, so the topic may well exist; the wait decides.
                unauthorized.append(full)
            elif err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicError(f"cannot create topic {full!r}: {err.str()}") from exc
    try:
        counts = wait_for_topics(settings, names.values(), admin=admin)
    except TopicError as exc:
        if unauthorized:
            raise TopicError(f"{exc}; not authorized to create {unauthorized}: create them as the operator "
                             "principal (`unlearn topics create`)") from exc
        raise
    for full, count in counts.items():
        if count != n:
            log.warning("topic %s exists with %d partitions (asked for %d); left as is", full, count, n)
    return counts


def ensure_topic(settings: Settings, name: str, *, partitions: int = 1, compacted: bool = False,
                 admin: Any = None, config: dict[str, str] | None = None) -> None:
    """Create one topic by its full name if it is missing, and wait until it is visible: what
    workers use for the topics they own (the ledger's state and heads generations)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    client = admin if admin is not None else clients.admin(settings)
    rf = 1 if settings.profile == "tansu" else -1
    conf = {**topic_config(settings, compacted=compacted), **(config or {})}
    fut = client.create_topics([NewTopic(name, partitions, rf, config=conf)],
                               request_timeout=settings.admin_timeout)[name]
    try:
        fut.result(timeout=settings.admin_timeout)
    except KafkaException as exc:
        # TOPIC_AUTHORIZATION_FAILED: no CREATE right; the topic may exist all the same (as in create_topics)
        if exc.args[0].code() not in (KafkaError.TOPIC_ALREADY_EXISTS, KafkaError.TOPIC_AUTHORIZATION_FAILED):
            raise TopicError(f"cannot create topic {name!r}: {exc.args[0].str()}") from None
    wait_for_topics(settings, [name], admin=client)


def wait_for_topics(
    settings: Settings,
    names: Iterable[str],
    timeout: float | None = None,
    *,
    admin: Any = None,
) -> dict[str, int]:
    """Block until every full topic name in ``names`` is in the cluster metadata with all its
    partitions led, and every leader answers ListOffsets for it; return name -> partition count.

    Asks for the whole metadata, never for a single topic: on tansu a metadata request naming an
    unknown topic auto-creates it (with 4 partitions). The ListOffsets round: Apache Kafka (KRaft)
    shows a new partition's leader in metadata a moment before that leader serves it, and a reader
    asking for the log end in that moment gets NOT_LEADER_FOR_PARTITION.
    """

    client = admin if admin is not None else clients.admin(settings)
    wanted = list(names)
    limit = timeout if timeout is not None else settings.admin_timeout
    missing: list[str] = wanted

    def visible(remaining: float) -> dict[str, int] | None:
        nonlocal missing
        try:
            md = client.list_topics(timeout=max(0.5, min(remaining, 5.0)))
            counts: dict[str, int] = {}
            missing = []
            for name in wanted:
                t = md.topics.get(name)
                if t is None or t.error is not None or not t.partitions or any(
                        p.leader < 0 for p in t.partitions.values()):
                    missing.append(name)
                else:
                    counts[name] = len(t.partitions)
            if not missing:
                not_served = _not_served(client, md, wanted, max(0.5, min(remaining, 5.0)))
                if not not_served:
                    return counts
                missing = [f"{not_served} (leader not serving yet)"]
        except Exception as exc:  # KafkaException: broker briefly unreachable
            missing = [f"{wanted} (metadata failed: {exc})"]
        return None

    return poll_until(visible, limit, interval=0.05, timed_out=lambda: TopicError(
        f"topics not visible after {timeout or settings.admin_timeout}s: {missing}"))


def _not_served(admin: Any, md: Any, names: list[str], timeout: float) -> list[str]:
    """The topics among ``names`` of which some partition's leader does not answer ListOffsets."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    parts = {TopicPartition(n, p): OffsetSpec.latest() for n in names for p in md.topics[n].partitions}
    bad: set[str] = set()
    for tp, fut in admin.list_offsets(parts, request_timeout=timeout).items():
        try:
            fut.result(timeout=timeout)
        except KafkaException as exc:  # NOT_LEADER_FOR_PARTITION, UNKNOWN_TOPIC_OR_PART...
            if exc.args[0].code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:  # served, not to us
                bad.add(tp.topic)
        except Exception:  # a timeout
            bad.add(tp.topic)
    return sorted(bad)


def delete_topics(settings: Settings, names: Iterable[str], *, admin: Any = None) -> None:
    """Delete full topic names (missing ones are fine): superseded generations, test cleanup."""
    from confluent_kafka import KafkaError, KafkaException

    wanted = list(names)
    if not wanted:
        return
    client = admin if admin is not None else clients.admin(settings)
    for full, fut in client.delete_topics(wanted, request_timeout=settings.admin_timeout).items():
        try:
            fut.result(timeout=settings.admin_timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise TopicError(f"cannot delete topic {full!r}: {exc.args[0].str()}") from exc
        except TimeoutError as exc:  # no answer (a Kafka node lost with the request in flight): a TopicError too
            raise TopicError(f"cannot delete topic {full!r}: no answer in {settings.admin_timeout:g}s") from exc


def delete_records(settings: Settings, below: Mapping[tuple[str, int], int], *,
                   admin: Any = None) -> dict[tuple[str, int], int]:
    """DeleteRecords: move each (topic, partition)'s log start up to ``below[...]`` (the records
    under it are unreadable at once; their segments leave the disk once rolled). Only where the
    broker has it (``BrokerQuirks.delete_records``). Returns the new log starts; ``TopicError``
    if the broker refused or did not answer."""
    from confluent_kafka import KafkaException, TopicPartition

    if not below:
        return {}
    client = admin if admin is not None else clients.admin(settings)
    timeout = settings.admin_timeout
    todo = [TopicPartition(t, p, off) for (t, p), off in sorted(below.items())]
    out: dict[tuple[str, int], int] = {}
    for tp, fut in client.delete_records(todo, request_timeout=timeout).items():
        try:
            out[(tp.topic, tp.partition)] = int(fut.result(timeout=timeout).low_watermark)
        except KafkaException as exc:
            raise TopicError(f"cannot delete records of {tp.topic}[{tp.partition}]: {exc.args[0].str()}") from exc
        except TimeoutError as exc:
            raise TopicError(f"cannot delete records of {tp.topic}[{tp.partition}]: no answer in {timeout:g}s") from exc
    return out


def topics_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn topics create|list [--bootstrap B] [--partitions N] [--prefix P]``."""
    parser = argparse.ArgumentParser(prog="unlearn topics", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("create", "list"))
    add_broker_args(parser, "bootstrap")
    parser.add_argument("--partitions", type=int, help="default: UNLEARN_PARTITIONS")
    add_broker_args(parser, "prefix", "profile")
    settings_help(parser, ErasureSettings)
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args, partitions=args.partitions)
    except CliUsageError as exc:
        parser.error(str(exc))
    try:
        counts = create_topics(settings) if args.action == "create" else _existing(settings)
    except (TopicError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name in topic_names(settings).values():
        count = counts.get(name)
        if count is None:
            print(f"{name}\tmissing")
            continue
        policy = " compact" if name in {settings.topic(c) for c in COMPACTED} else ""
        print(f"{name}\tpartitions={count}{policy}")
    return 0


def _existing(settings: Settings) -> dict[str, int]:
    """Full name -> partition count of the project's topics that exist (no auto-creation)."""

    md = clients.admin(settings).list_topics(timeout=settings.admin_timeout)
    names = set(topic_names(settings).values())
    return {n: len(t.partitions) for n, t in md.topics.items() if n in names and t.error is None}


def prefixed_topics(settings: Settings) -> list[str]:
    """Every topic under the settings' prefix: the project's topics and those workers create
    (ledger-state generations). Asks for the whole metadata (naming topics auto-creates them)."""

    md = clients.admin(settings).list_topics(timeout=settings.admin_timeout)
    return sorted(t for t in md.topics if t.startswith(settings.topic_prefix))
