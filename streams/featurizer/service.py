"""``unlearn featurizer``: requests -> exact deltas (the thin confluent-kafka shell).

All decisions are in :mod:`streams.featurizer.core` and :mod:`streams.featurizer.router` (pure)
and all durable state in :mod:`streams.featurizer.cache`; this module moves bytes. One consumer
(one group, one join) reads two topics (docs/featurizer.md): ``requests`` records are **routed**
to ``<requests>.by-head`` at their head's partition, and the by-head records are **featurized**
per micro-batch through the cache's outbox.

The code is split by concept: this module is the process (settings, lifecycle, the poll loop);
:mod:`streams.featurizer.batch_pipeline` handles each batch (route, judge, seal, commit, deliver
in phases, settle the overlapped phase 1, commit offsets); :mod:`streams.featurizer.assignment`
handles the group's rebalances (bring a partition's cache up from the local file or the
changelog and seek past it; drop a revoked partition's state).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from unlearn.infra.head_registry import RegistryView
from unlearn.infra.log_position import topic_id
from unlearn.infra.profiles import consumer_config, producer_config, quirks
from unlearn.infra.settings import Settings
from unlearn.schemas.source_id import source_stream
from unlearn.streams.featurizer.assignment import PartitionAssignment
from unlearn.streams.featurizer.auth_gate import AuthGate
from unlearn.streams.featurizer.batch_pipeline import Inflight
from unlearn.streams.featurizer.cache import FeatureCache
from unlearn.streams.featurizer.changelog_store import ChangelogReader
from unlearn.streams.featurizer.core import CoreConfig, Encoder, RegistryEncoder
from unlearn.streams.featurizer.model import (
    DeliveryError,
    FaultHook,
    FeaturizerError,
    LostCacheError,
    ReadyHook,
)
from unlearn.streams.featurizer.router import RouterSession, might_delete
from unlearn.streams.featurizer.shredder import Erasure
from unlearn.streams.featurizer.topic_check import check_topics
from unlearn.streams.featurizer.transit import group_committed
from unlearn.streams.featurizer.trim import Trimmer

__all__ = ["DeliveryError", "FeaturizerError", "FeaturizerService", "LostCacheError"]

log = logging.getLogger("unlearn.featurizer")


class FeaturizerService(PartitionAssignment):
    """One featurizer process: a consumer group member on the requests topic (routing) and its
    by-head topic (featurizing).

    ``run(stop)`` blocks until ``stop`` is set (then finishes the current batch, flushes, commits
    and returns 0). ``encoder`` replaces the backbone registry (tests); ``fault`` is a crash hook;
    ``on_ready`` is called once the group has assigned this member its partitions (``ready`` is
    set then too), which is when a readiness line means something.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        group: str | None = None,
        federated: bool = False,
        client_id: str | None = None,
        requests_topic: str | None = None,
        max_batch: int | None = None,
        max_ms: int | None = None,
        device: str | None = None,
        encoder: Encoder | None = None,
        fault: FaultHook | None = None,
        on_ready: ReadyHook | None = None,
    ) -> None:
        if federated and not client_id:
            raise ValueError("--federated needs --client-id (the data owner this site serves)")
        if client_id and not federated:
            raise ValueError("--client-id is only meaningful with --federated")
        self.settings = settings
        self.config = CoreConfig.from_settings(settings, requests_topic=requests_topic, federated=federated,
                                               client_id=client_id)
        self.requests_topic = self.config.requests_topic
        self.topic = self.config.input_topic  # the by-head topic: what the caches follow
        # the stream in origin headers: the requests topic without the prefix ("requests")
        self.origin_stream = source_stream(self.requests_topic, settings.topic_prefix)
        default_group = f"{settings.topic_prefix}featurizer" + (f".{client_id}" if federated else "")
        self.group = group or default_group
        self.max_batch = int(max_batch or settings.batch_max_events)
        self.max_ms = int(settings.batch_max_ms if max_ms is None else max_ms)
        self.close_on_delete = settings.batch_close_on_delete
        if self.max_batch < 1 or self.max_ms < 0:
            raise ValueError("max_batch must be >= 1 and max_ms >= 0")
        self.device = device or settings.device
        self.encoder: Encoder = encoder or RegistryEncoder(self.device)
        self.fault = fault
        self.on_ready = on_ready
        self.ready = threading.Event()
        # the cache directory: full topic name (+ client), so deployments sharing a data dir never mix
        self.stream_dir = self.topic + (f"[{client_id}]" if federated else "")
        self.caches: dict[int, FeatureCache] = {}
        # The changelog backs the shared requests topic only: a federated site's per-sample q must
        # stay on its site, and another requests topic's by-head topic need not be
        # co-partitioned with it.
        shared = not federated and self.requests_topic == settings.topic("requests")
        self.changelog_topic: str | None = settings.topic("featurizer-cache") if shared else None
        self._reader = ChangelogReader(settings, self.changelog_topic) if self.changelog_topic else None
        self._pending: list[Any] = []
        self._inflight: Inflight | None = None
        self._fatal: BaseException | None = None
        self._consumer: Any = None
        self.topic_id = ""  # the by-head topic's id, read at start
        self.requests_topic_id = ""  # the requests topic's id, read at start
        self.route_partitions = self._request_partitions = 0  # by-head and requests partition counts, read at start
        self._router: RouterSession | None = None
        self._producer: Any = None
        self.registry: RegistryView | None = None  # the declared head contracts, followed while running
        self.auth = AuthGate(settings)  # UNLEARN_AUTH_MODE=signed: the client registry and replay windows
        self.erasure: Erasure | None = None  # per-sample keys and shredding (docs/erasure.md), set by run()
        self.trimmer: Trimmer | None = None  # DeleteRecords of taken-over raw inputs, set by run() where the broker can
        self.stats = {"batches": 0, "routed": 0, "events": 0, "reforwarded": 0, "gaps": 0, "accepted": 0, "rows": 0,
                      "deadletters": 0, "receipts": 0, "deltas": 0, "replayed": 0}

    # ------------------------------------------------------------------ lifecycle
    def run(self, stop: threading.Event | None = None) -> int:
        """Consume until ``stop`` is set; returns 0 after a clean stop (raises on fatal errors)."""
        from confluent_kafka import Consumer, Producer

        stop = stop or threading.Event()
        # linger.ms=0: a batch's phase 1 (the deltas) leaves when produced. The flush(0) after it did
        # not beat librdkafka's linger (the flush's "no linger" flag is dropped when the call
        # returns, usually before the broker thread looks): with linger.ms=5 the delete's deltas
        # hop was 10 ms median, 5 without. Batches still form behind the one request in flight;
        # adds throughput showed no difference (bench/results/pipeline_bench.md section 15).
        self._producer = Producer(producer_config(self.settings, **{"linger.ms": 0}))
        self._consumer = Consumer(consumer_config(self.settings, self.group))
        if self.settings.seal_rows and self.changelog_topic is not None:  # with transit keys (docs/erasure.md s.5)
            self.erasure = Erasure(self.settings, self.config.deltas_topic, self.requests_topic, self.topic,
                                   lambda: group_committed(self.settings, self.group, self.requests_topic,
                                                           self._request_partitions))
        clean = False
        try:
            self.route_partitions, self._request_partitions = check_topics(
                self.settings, self._consumer, self.requests_topic, self.topic, self.config.registry_topic,
                self.changelog_topic)
            self.registry = RegistryView(self.settings).start(wait_caught_up=self.settings.admin_timeout)
            self.auth.start()
            self.topic_id = topic_id(self.settings, self.topic)
            self.requests_topic_id = topic_id(self.settings, self.requests_topic)
            self._router = RouterSession(self.origin_stream, self.route_partitions)
            if (quirks(self.settings).delete_records and self.changelog_topic is not None
                    and self.settings.trim_every_seconds > 0):  # a federated site's cache has no changelog
                self.trimmer = Trimmer(self.settings, self.group, (self.requests_topic, self.topic))
            self._consumer.subscribe([self.requests_topic, self.topic], on_assign=self._on_assign,
                                     on_revoke=self._on_revoke, on_lost=self._on_revoke)
            log.info("featurizer group=%s requests=%s routed=%s (%d partitions) stream=%s federated=%s auth=%s "
                     "batch<=%d/%dms", self.group, self.requests_topic, self.topic, self.route_partitions,
                     self.config.stream, self.config.federated, self.settings.auth_mode, self.max_batch, self.max_ms)
            last_report = time.monotonic()
            while not stop.is_set():
                batch = self._poll_batch(stop)
                if batch:
                    self._process(batch)
                else:
                    self._settle()
                if self.erasure is not None:
                    self.erasure.tick(self.caches)
                if self.trimmer is not None and self.trimmer.due():
                    self.trimmer.offer(self._consumer.assignment())
                if time.monotonic() - last_report > 30:
                    log.info("featurizer stats %s", self.stats)
                    last_report = time.monotonic()
            self._settle()
            clean = True
            return 0
        finally:
            self._inflight = self._inflight if clean else None  # a crash leaves its outbox, as kill -9 would
            try:
                self._consumer.close()  # leaves the group; on_revoke closes the caches
            except Exception as exc:  # closing after a crash: report, do not mask the crash
                log.warning("consumer close: %s", exc)
            if clean:
                self._producer.flush(self.settings.admin_timeout)
            for cache in self.caches.values():
                cache.close()
            self.caches.clear()
            if self.registry is not None:
                self.registry.stop()
            self.auth.stop()
            if self.erasure is not None:
                self.erasure.close()
            if self.trimmer is not None:
                self.trimmer.close()
            self._consumer = self._producer = None  # release the librdkafka handles now
            log.info("featurizer stopped (%s) stats %s", "clean" if clean else "error", self.stats)

    def _check_fatal(self) -> None:
        if self._fatal is not None:
            err, self._fatal = self._fatal, None
            raise err

    # ------------------------------------------------------------------ the loop
    def _poll_batch(self, stop: threading.Event) -> list[Any]:
        """Up to max_batch messages, waiting at most max_ms after the first one; a batch that
        holds a delete closes as soon as what was already fetched is in (``might_delete``): the
        window buys adds throughput, a delete only waits in it."""
        from confluent_kafka import KafkaError

        self._pending = []
        deadline: float | None = None
        urgent = False
        while len(self._pending) < self.max_batch:
            if deadline is None:
                # consume() blocks for its whole timeout unless the batch fills; poll() returns on
                # the first message, which starts the batch window (latency of a lone delete).
                first = self._consumer.poll(0.2)
                got = [] if first is None else [first]
            else:
                timeout = 0.0 if urgent else max(0.0, deadline - time.monotonic())
                got = self._consumer.consume(num_messages=self.max_batch - len(self._pending), timeout=timeout)
            self._check_fatal()
            for m in got:
                err = m.error()
                if err is None:
                    self._pending.append(m)
                    urgent = urgent or (self.close_on_delete and might_delete(m.value()))
                elif err.code() == KafkaError._PARTITION_EOF:
                    continue
                elif err.fatal():
                    raise FeaturizerError(f"consumer: {err.str()}")
                else:
                    log.warning("consumer: %s", err.str())
            if deadline is None:
                if not self._pending:
                    return []  # idle: let the caller look at the stop flag
                deadline = time.monotonic() + self.max_ms / 1000.0
            elif urgent:
                break  # what was already fetched is taken (a non-blocking consume): close now
            if time.monotonic() >= deadline or stop.is_set():
                break
        batch, self._pending = self._pending, []
        return batch
