"""Broker profiles: client settings per broker kind, chosen by ``Settings.profile``.

Production runs on Apache Kafka ("kafka"); developers and CI run on the tansu binary ("tansu",
see docs/design.md, "The embedded broker"). tansu is Kafka-compatible but has quirks that need client
settings. Those workarounds live here, next to a note saying why, so that no service ever
branches on the broker kind: services ask for ``producer_config(settings)`` etc., and code that
depends on a broker capability asks :func:`quirks` (a capability, not a name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unlearn.infra.settings import Settings

__all__ = [
    "BrokerQuirks",
    "admin_config",
    "consumer_config",
    "faust_app_kwargs",
    "producer_config",
    "quirks",
    "topic_config",
]

# Headroom over the largest payload for record/batch framing, so a payload of exactly
# max_message_bytes still fits in one produce request and one fetch.
_FRAMING_SLACK = 64 * 1024


@dataclass(frozen=True)
class BrokerQuirks:
    """What code may rely on, per broker kind (True = behaves like Apache Kafka)."""

    list_offsets_latest_exact: bool
    """tansu: ListOffsets(latest) returns start-of-last-batch + 1 when the last produced batch
    held >1 record; the high watermark in Fetch responses is right. Do not size "read to the end"
    loops by ``query_watermark_offsets`` unless every producer sends one record per batch."""
    compaction_runs: bool
    """tansu accepts cleanup.policy=compact but never compacts: readers of a compacted topic
    must keep the last value per key themselves (they must anyway, before compaction runs)."""
    aborted_transactions_hidden: bool
    """tansu shows records of aborted transactions to read_committed consumers: correctness
    must not depend on transactions (docs/design.md section 4)."""
    aiokafka_idempotence: bool
    """tansu rejects aiokafka's InitProducerId v0: faust exactly_once cannot start there."""
    auto_creates_topics_with_4_partitions: bool
    """tansu auto-creates unknown topics with 4 partitions: always create topics explicitly."""
    fetch_returns_on_data: bool
    """Kafka answers a long-polling Fetch as soon as data arrives; tansu holds every Fetch for the
    full max wait (measured: median delivery latency = about half of fetch.wait.max.ms). On tansu
    consumers must poll with a short max wait or every hop adds hundreds of milliseconds."""


_QUIRKS = {
    "tansu": BrokerQuirks(
        list_offsets_latest_exact=False,
        compaction_runs=False,
        aborted_transactions_hidden=False,
        aiokafka_idempotence=False,
        auto_creates_topics_with_4_partitions=True,
        fetch_returns_on_data=False,
    ),
    "kafka": BrokerQuirks(
        list_offsets_latest_exact=True,
        compaction_runs=True,
        aborted_transactions_hidden=True,
        aiokafka_idempotence=True,
        auto_creates_topics_with_4_partitions=False,
        fetch_returns_on_data=True,
    ),
}


def quirks(settings: Settings) -> BrokerQuirks:
    """Capabilities of the configured broker kind."""
    return _QUIRKS[settings.profile]


def fetch_max_wait_ms(settings: Settings) -> int:
    """Long-poll wait for consumers: short where the broker holds fetches (tansu), else Kafka's
    default. Costs an idle fetch request every few ms per consumer on tansu (localhost only)."""
    return settings.fetch_max_wait_ms if not quirks(settings).fetch_returns_on_data else 500


def _bootstrap(settings: Settings) -> str:
    if not settings.bootstrap:
        raise ValueError(
            "no broker address: set UNLEARN_BOOTSTRAP (or KAFKA_BOOTSTRAP), or pass bootstrap= to "
            "Settings; `unlearn broker` starts a local one and prints it"
        )
    return settings.bootstrap


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """confluent-kafka Producer config; overrides win, by librdkafka name:
    ``producer_config(s, **{"linger.ms": 5})``."""
    conf: dict[str, Any] = {
        "bootstrap.servers": _bootstrap(settings),
        # Ordering is the contract (a subject's add precedes its delete; one head's deltas are
        # totally ordered): idempotence keeps retries from reordering or duplicating within a
        # partition. librdkafka's idempotent producer works on tansu too (aiokafka's does not).
        "enable.idempotence": True,
        "acks": "all",
        # Packed deltas and heads with a posterior (d x d float64) can be tens of MB. tansu has
        # no broker-side size limit (topic max.message.bytes is ignored), so the client limit is
        # the only one; on Kafka the topic gets max.message.bytes too (see topic_config).
        "message.max.bytes": settings.max_message_bytes + _FRAMING_SLACK,
    }
    # tansu needs nothing more here: librdkafka batching is fine for produce/consume (only
    # ListOffsets(latest) suffers from multi-record batches; see BrokerQuirks).
    conf.update(overrides)
    return conf


def consumer_config(settings: Settings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """confluent-kafka Consumer config: manual commits, earliest reset, large fetches."""
    fetch = settings.max_message_bytes + _FRAMING_SLACK
    conf: dict[str, Any] = {
        "bootstrap.servers": _bootstrap(settings),
        "group.id": group_id,
        # At-least-once (docs/design.md section 4): a service commits only after its outputs are
        # produced, so auto-commit (which commits what was merely polled) is off.
        "enable.auto.commit": False,
        # A new group must see the whole history (requests before the worker started).
        "auto.offset.reset": "earliest",
        "max.partition.fetch.bytes": fetch,
        "fetch.max.bytes": fetch,
        # librdkafka requires receive.message.max.bytes >= fetch.max.bytes + 512.
        "receive.message.max.bytes": fetch + 1024 * 1024,
        "fetch.wait.max.ms": fetch_max_wait_ms(settings),  # see BrokerQuirks.fetch_returns_on_data
    }
    if settings.profile == "tansu":
        # tansu completes a group join after about one session timeout (measured: 1 s at 1-2 s,
        # 2 s at 3 s, 6 s at 6 s; 23 s with librdkafka's 45 s default), and a killed member's
        # partitions move after it. 3 s keeps a restarted worker's join near 2 s; librdkafka
        # heartbeats from its own thread, so a busy Python thread does not miss them. Kafka keeps
        # its defaults (its brokers also refuse sessions below group.min.session.timeout.ms).
        conf["session.timeout.ms"] = 3000
        conf["heartbeat.interval.ms"] = 500
    conf.update(overrides)
    return conf


def admin_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """confluent-kafka AdminClient config."""
    conf: dict[str, Any] = {"bootstrap.servers": _bootstrap(settings)}
    conf.update(overrides)
    return conf


def topic_config(settings: Settings, compacted: bool = False) -> dict[str, str]:
    """Per-topic configs for create_topics.

    ``max.message.bytes`` lets Kafka accept our large messages (tansu ignores it but accepts it,
    so both profiles send the same).
    """
    conf = {"max.message.bytes": str(settings.max_message_bytes + _FRAMING_SLACK)}
    if compacted:
        # tansu accepts but never runs compaction (BrokerQuirks.compaction_runs).
        conf["cleanup.policy"] = "compact"
    return conf


class _DriverModuleProxy:
    """Stands in for the ``aiokafka`` module inside faust's driver only, with another consumer."""

    def __init__(self, module: Any, consumer: Any) -> None:
        self._module = module
        self.AIOKafkaConsumer = consumer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def tune_faust_consumer(settings: Settings) -> None:
    """faust 0.15 hard-codes ``fetch_max_wait_ms=1500`` for its consumer. On a broker that holds
    every fetch for the full wait (tansu) that adds ~750 ms per hop, so the tansu profile swaps
    in a consumer with ``fetch_max_wait_ms(settings)`` -- inside faust's driver module only, not
    for other users of aiokafka. A no-op where fetches return on data (Kafka)."""
    if quirks(settings).fetch_returns_on_data:
        return
    import faust.transport.drivers.aiokafka as driver

    real = driver.aiokafka._module if isinstance(driver.aiokafka, _DriverModuleProxy) else driver.aiokafka
    wait = fetch_max_wait_ms(settings)

    class ShortPollConsumer(real.AIOKafkaConsumer):  # type: ignore[misc, name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["fetch_max_wait_ms"] = wait
            super().__init__(*args, **kwargs)

    driver.aiokafka = _DriverModuleProxy(real, ShortPollConsumer)


def faust_app_kwargs(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """Keyword arguments for ``faust.App(id, **faust_app_kwargs(settings))``: broker parts only."""
    size = settings.max_message_bytes + _FRAMING_SLACK
    kw: dict[str, Any] = {
        "broker": ";".join(f"kafka://{b.strip()}" for b in _bootstrap(settings).split(",")),
        # faust exactly_once has open duplicate/crash bugs and needs transactions that tansu
        # mishandles: the ledger is designed for at-least-once (docs/design.md section 4).
        "processing_guarantee": "at_least_once",
        "consumer_auto_offset_reset": "earliest",
        "producer_max_request_size": size,
        "consumer_max_fetch_size": size,  # aiokafka max_partition_fetch_bytes
        "producer_acks": -1,
        "topic_partitions": settings.partitions,
    }
    if settings.profile == "tansu":
        # ListOffsets(latest) is wrong after a multi-record batch, and faust table recovery uses
        # it: with default batching recovery crashed (ConsistencyError) or silently lost table
        # updates. aiokafka's max_batch_size is in bytes; 1 forces one record per batch, which
        # made recovery correct (memory and rocksdb stores). Costs producer throughput.
        kw["producer_max_batch_size"] = 1
        # Not tuned on purpose: faust's default session/rebalance timeouts make a group join on
        # tansu take ~30 s, and 6 s timeouts make it ~3 s -- but with them a two-worker rebalance
        # test stalled (a worker stopped consuming without error) in 2 of 20 runs under load.
        # Slow joins are a test-time cost; a stalled ledger is not acceptable.
    kw.update(overrides)
    return kw
