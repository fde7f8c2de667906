"""Kafka clients made from the settings: every Producer, Consumer or AdminClient of the product
comes from here (built by ``infra/kafka_client.py``, the one place that instantiates them;
tests/test_architecture.py checks it), and the client configuration per broker kind.

**Broker profiles**: client settings per broker kind, chosen by ``Settings.profile``. Production
runs on Apache Kafka ("kafka"); developers and CI run on the tansu binary ("tansu", see
docs/design.md, "The embedded broker"). tansu is Kafka-compatible but has quirks that need client
settings. Those workarounds live here, next to a note saying why, so that no service ever
branches on the broker kind: code asks for ``producer(settings)`` etc., and code that depends on a
broker capability asks :func:`quirks` (a capability, not a name)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unlearn.infra.kafka_client import new_admin, new_consumer, new_producer
from unlearn.infra.settings import ErasureSettings, Settings, security_config

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
    """tansu rejects aiokafka's InitProducerId v0: aiokafka-based frameworks (faust's exactly_once)
    cannot use idempotence or transactions there. The project's clients are librdkafka's."""
    auto_creates_topics_with_4_partitions: bool
    """tansu auto-creates unknown topics with 4 partitions: always create topics explicitly."""
    idempotent_producer_reliable: bool
    """tansu (s3:// storage, seen in bench.chaos) answers idempotent produce requests of live
    producers with OUT_OF_ORDER_SEQUENCE_NUMBER, a fatal error for librdkafka: every worker then
    dies. Where False, producers run without idempotence, one request in flight."""
    delete_records: bool
    """Kafka's DeleteRecords moves a partition's log start (the records below are unreadable at
    once, their segments leave the disk at the next roll). tansu has no DeleteRecords: only
    deleting a topic frees a record, so raw inputs stay unless sealed for transit."""
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
        idempotent_producer_reliable=False,
        delete_records=False,
        fetch_returns_on_data=False,
    ),
    "kafka": BrokerQuirks(
        list_offsets_latest_exact=True,
        compaction_runs=True,
        aborted_transactions_hidden=True,
        aiokafka_idempotence=True,
        auto_creates_topics_with_4_partitions=False,
        idempotent_producer_reliable=True,
        delete_records=True,
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


def _connection(settings: Settings) -> dict[str, Any]:
    """What every client config starts with: the brokers, the security config, and an
    ``error_cb`` that names a connection failure's cause (infra/connection_errors.py)."""
    from unlearn.infra.connection_errors import ConnectionErrorLog

    conf: dict[str, Any] = {"bootstrap.servers": _bootstrap(settings), **security_config(settings)}
    conf["error_cb"] = ConnectionErrorLog(conf)
    return conf


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """confluent-kafka Producer config; overrides win, by librdkafka name:
    ``producer_config(s, **{"linger.ms": 5})``."""
    conf: dict[str, Any] = {
        **_connection(settings),
        # Ordering is the contract (a subject's add precedes its delete; one head's deltas are
        # totally ordered): idempotence keeps retries from reordering or duplicating within a
        # partition (see idempotent_producer_reliable for the embedded broker).
        "enable.idempotence": True,
        "acks": "all",
        # Packed deltas and heads with a posterior (d x d float64) can be tens of MB. tansu has
        # no broker-side size limit (topic max.message.bytes is ignored), so the client limit is
        # the only one; on Kafka the topic gets max.message.bytes too (see topic_config).
        "message.max.bytes": settings.max_message_bytes + _FRAMING_SLACK,
    }
    if not quirks(settings).idempotent_producer_reliable:
        # Ordered, at-least-once instead: one request in flight per connection keeps a retry
        # from overtaking the batch after it; a retried duplicate is harmless (deltas carry
        # source ids the ledger dedupes, head updates and receipts are idempotent, snapshot
        # pieces are addressed by the offsets their delivery reports).
        conf["enable.idempotence"] = False
        conf["max.in.flight.requests.per.connection"] = 1
    conf.update(overrides)
    return conf


def consumer_config(settings: Settings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """confluent-kafka Consumer config: manual commits, earliest reset, large fetches."""
    fetch = settings.max_message_bytes + _FRAMING_SLACK
    conf: dict[str, Any] = {
        **_connection(settings),
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
        # see BrokerQuirks.fetch_returns_on_data; a reader that waits for partition EOF (the end of
        # the log) learns of it from an empty fetch, which every broker holds for the full wait:
        # on Kafka's 500 ms each read to the end took ~0.6 s (measured; 0.13 s at 10 ms)
        "fetch.wait.max.ms": (settings.fetch_max_wait_ms if overrides.get("enable.partition.eof")
                              else fetch_max_wait_ms(settings)),
    }
    if settings.profile == "tansu":
        # tansu completes a group join after about one session timeout, at least ~1 s (measured:
        # 1 s at 1-2 s, 2 s at 3 s, 6 s at 6 s; 23 s with librdkafka's 45 s default), and a
        # killed member's partitions move only once its session expires; it does not support
        # static membership (a join with group.instance.id hangs). 1.5 s brings a kill -9 ->
        # restart -> assigned cycle to ~3 s. librdkafka heartbeats from its own thread, so a busy
        # Python thread does not miss them; a missed one costs a rebalance, never exactness.
        conf["session.timeout.ms"] = 1500
        conf["heartbeat.interval.ms"] = 300
    else:
        # Apache Kafka: a worker killed with -9 holds its partitions until its session expires,
        # and a restarted one waits that long to join (librdkafka's default: 45 s). 6 s is the
        # broker's group.min.session.timeout.ms default, the shortest Kafka accepts: a killed
        # worker's partitions move in ~6 s. Heartbeats come from librdkafka's own thread.
        conf["session.timeout.ms"] = 6000
        conf["heartbeat.interval.ms"] = 1000
    conf.update(overrides)
    return conf


def admin_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """confluent-kafka AdminClient config."""
    conf: dict[str, Any] = _connection(settings)
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
        if quirks(settings).compaction_runs:
            # Erasure by tombstone (docs/erasure.md): a destroyed key's record must leave the log
            # within a bound. The active segment is never compacted: roll it after segment.ms (on
            # the next append), then compact a segment no later than max.compaction.lag.ms, whatever
            # the dirty ratio; tombstones themselves (no secret) stay a day for late readers.
            segment_ms = str(ErasureSettings.of(settings).segment_ms)
            conf.update({"segment.ms": segment_ms, "max.compaction.lag.ms": segment_ms,
                         "delete.retention.ms": str(86_400_000)})
    return conf


def producer(settings: Settings, **overrides: Any) -> Any:
    """A confluent-kafka Producer (:func:`producer_config`; overrides by librdkafka name)."""
    return new_producer(producer_config(settings, **overrides))


def close_producer(producer: Any, timeout: float) -> int:
    """Flush ``producer`` for up to ``timeout`` seconds, then close it unless messages are still
    queued; returns how many are (0: closed). Why close: a worker run in a process that goes on
    (tests, benchmarks, the demo) would otherwise leave its handle to the garbage collector, still
    reconnecting to brokers that may be gone. Why not with messages queued: ``close`` flushes
    again with no bound, and whether to drop them is the caller's decision."""
    left = int(producer.flush(timeout))
    if left == 0:
        producer.close()
    return left


def consumer(settings: Settings, group_id: str, **overrides: Any) -> Any:
    """A confluent-kafka Consumer of ``group_id`` (:func:`consumer_config`)."""
    return new_consumer(consumer_config(settings, group_id, **overrides))


def admin(settings: Settings, **overrides: Any) -> Any:
    """A confluent-kafka AdminClient (:func:`admin_config`)."""
    return new_admin(admin_config(settings, **overrides))
