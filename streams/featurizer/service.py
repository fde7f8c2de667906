"""``unlearn featurizer``: requests -> exact deltas (the thin confluent-kafka shell).

All decisions are in :mod:`streams.featurizer.core` and :mod:`streams.featurizer.router` (pure)
and all durable state in :mod:`streams.featurizer.cache`; this module moves bytes. One consumer
(one group, one join) reads two topics (docs/featurizer.md): ``requests`` records are **routed**
to ``<requests>.by-head`` at their head's partition, and the by-head records are **featurized**
per micro-batch through the cache's outbox.

:class:`FeaturizerService` is the process (settings, lifecycle, the poll loop over a
:class:`~streams.featurizer.batch_window.BatchWindow`, and the group's rebalance callbacks) and
owns three parts: a :class:`~streams.featurizer.router.Router` (forwards
requests records), :class:`~streams.featurizer.partitions.Partitions` (the owned partitions'
caches and keys: assign, revoke) and a :class:`~streams.featurizer.batch_processor.BatchProcessor`
(one batch's steps and the commit sequence), which share one
:class:`~streams.featurizer.delivery.Delivery` (the producer).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import replace
from typing import Any

from unlearn.infra.log_position import topic_id
from unlearn.infra.registry import RegistryView
from unlearn.infra.settings import ErasureSettings, HeadSettings, Settings, consumer_config, producer_config, quirks
from unlearn.schemas.envelope import source_stream
from unlearn.streams.featurizer.auth_gate import AuthGate
from unlearn.streams.featurizer.batch_processor import BatchProcessor
from unlearn.streams.featurizer.batch_window import BatchWindow
from unlearn.streams.featurizer.delivery import Delivery
from unlearn.streams.featurizer.model import (
    CoreConfig,
    DeliveryError,
    Encoder,
    FaultHook,
    FeaturizerError,
    LostCacheError,
    ReadyHook,
    RegistryEncoder,
    Topics,
)
from unlearn.streams.featurizer.partitions import Partitions
from unlearn.streams.featurizer.router import Router
from unlearn.streams.featurizer.settings import FeaturizerSettings
from unlearn.streams.featurizer.shredder import Erasure
from unlearn.streams.featurizer.topic_check import check_topics
from unlearn.streams.featurizer.transit import group_committed
from unlearn.streams.featurizer.trim import Trimmer

__all__ = ["DeliveryError", "FeaturizerError", "FeaturizerService", "LostCacheError"]

log = logging.getLogger("unlearn.featurizer")


def _topics(settings: Settings, config: CoreConfig) -> Topics:
    """The featurizer's topic names. The changelog backs the shared requests topic only: a
    federated site's per-sample q must stay on its site, and another requests topic's by-head
    topic need not be co-partitioned with it."""
    shared = not config.federated and config.requests_topic == settings.topic("requests")
    return Topics(requests=config.requests_topic, by_head=config.input_topic,
                  changelog=settings.topic("featurizer-cache") if shared else None,
                  origin_stream=source_stream(config.requests_topic, settings.topic_prefix))


class FeaturizerService:
    """One featurizer process: a consumer group member on the requests topic (routing) and its
    by-head topic (featurizing).

    ``run(stop)`` blocks until ``stop`` is set (then finishes the current batch, flushes, commits
    and returns 0). ``encoder`` replaces the backbone registry (tests); ``fault`` is a crash hook;
    ``on_ready`` is called once the group has assigned this member its partitions (``ready`` is
    set then too), which is when a readiness line means something. The parts (``router``,
    ``partitions``, ``batches``) exist while ``run`` runs.
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
        self.topics = _topics(settings, self.config)
        self.group = group or f"{settings.topic_prefix}featurizer" + (f".{client_id}" if federated else "")
        # the cache directory: full topic name (+ client), so deployments sharing a data dir never mix
        self.stream_dir = self.topics.by_head + (f"[{client_id}]" if federated else "")
        fs = FeaturizerSettings.of(settings)
        self.window = BatchWindow(int(max_batch or fs.batch_max_events),
                                  int(fs.batch_max_ms if max_ms is None else max_ms))
        self.device = device or HeadSettings.of(settings).device
        self.encoder: Encoder = encoder or RegistryEncoder(self.device)
        self.fault, self.on_ready = fault, on_ready
        self.ready = threading.Event()
        self.auth = AuthGate(settings)  # UNLEARN_AUTH_MODE=signed: the client registry and replay windows
        self.stats = {"batches": 0, "routed": 0, "events": 0, "reforwarded": 0, "gaps": 0, "accepted": 0, "rows": 0,
                      "deadletters": 0, "receipts": 0, "deltas": 0, "replayed": 0}
        self._fatal: BaseException | None = None  # raised in a rebalance callback, re-raised by the poll loop
        self._consumer: Any = None
        self._producer: Any = None
        self.registry: RegistryView | None = None  # the declared head contracts, followed while running
        self.erasure: Erasure | None = None  # per-sample keys and shredding (docs/erasure.md)
        self.trimmer: Trimmer | None = None  # DeleteRecords of taken-over raw inputs, where the broker can
        self.router: Router | None = None
        self.partitions: Partitions | None = None
        self.batches: BatchProcessor | None = None

    # ------------------------------------------------------------------ lifecycle
    def run(self, stop: threading.Event | None = None) -> int:
        """Consume until ``stop`` is set; returns 0 after a clean stop (raises on fatal errors)."""
        stop = stop or threading.Event()
        clean = False
        try:
            self._start()
            last_report = time.monotonic()
            while not stop.is_set():
                self._turn(stop)
                if time.monotonic() - last_report > 30:
                    log.info("featurizer stats %s", self.stats)
                    last_report = time.monotonic()
            assert self.batches is not None
            self.batches.settle()
            clean = True
            return 0
        finally:
            self._stop(clean)

    def _start(self) -> None:
        """Connect, check the topics, build the parts and join the group."""
        from confluent_kafka import Consumer, Producer

        s = self.settings
        # linger.ms=0: a batch's phase 1 (the deltas) leaves when produced; the flush(0) after it does
        # not beat librdkafka's linger (delivery.deliver_overlapped).
        self._producer = Producer(producer_config(s, **{"linger.ms": 0}))
        self._consumer = Consumer(consumer_config(s, self.group))
        t = self.topics
        if FeaturizerSettings.of(s).seal_rows and t.changelog is not None:  # with transit keys (docs/erasure.md s.5)
            self.erasure = Erasure(s, self.config.deltas_topic, t.requests, t.by_head,
                                   lambda: group_committed(s, self.group, t.requests, self.topics.requests_partitions))
        by_head_partitions, requests_partitions = check_topics(s, self._consumer, t.requests, t.by_head,
                                                               self.config.registry_topic, t.changelog)
        self.registry = RegistryView(s).start(wait_caught_up=s.admin_timeout)
        self.auth.start()
        t = self.topics = replace(t, requests_id=topic_id(s, t.requests), by_head_id=topic_id(s, t.by_head),
                                  by_head_partitions=by_head_partitions, requests_partitions=requests_partitions)
        if quirks(s).delete_records and t.changelog is not None and ErasureSettings.of(s).trim_every_seconds > 0:
            self.trimmer = Trimmer(s, self.group, (t.requests, t.by_head))  # a federated cache has no changelog
        delivery = Delivery(self._producer, t.changelog, self.erasure.delivered if self.erasure is not None else None)
        self.router = Router(t.origin_stream, t.by_head, t.by_head_partitions, delivery)
        self.partitions = Partitions(s, t, group=self.group, stream_dir=self.stream_dir,
                                     client_id=self.config.client_id, delivery=delivery, erasure=self.erasure,
                                     stats=self.stats)
        self.batches = BatchProcessor(s, self.config, t, consumer=self._consumer, delivery=delivery,
                                      router=self.router, partitions=self.partitions, registry=self.registry,
                                      encoder=self.encoder, auth=self.auth, erasure=self.erasure, fault=self.fault,
                                      stats=self.stats)
        self._consumer.subscribe([t.requests, t.by_head], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_revoke)
        log.info("featurizer group=%s requests=%s routed=%s (%d partitions) stream=%s federated=%s auth=%s "
                 "batch<=%d/%dms", self.group, t.requests, t.by_head, t.by_head_partitions, self.config.stream,
                 self.config.federated, s.auth_mode, self.window.max_batch, self.window.max_ms)

    def _turn(self, stop: threading.Event) -> None:
        """One turn of the poll loop: a batch processed (or, idle, the one in flight settled), then
        the erasure and trim timers."""
        assert self.batches is not None and self.partitions is not None
        batch = self.window.poll(self._consumer, stop, self._check_fatal)
        if batch:
            self.batches.process(batch)
        else:
            self.batches.settle()
        if self.erasure is not None:
            self.erasure.tick(self.partitions.caches)
        if self.trimmer is not None and self.trimmer.due():
            self.trimmer.offer(self._consumer.assignment())

    def _stop(self, clean: bool) -> None:
        """Leave the group and release everything; after a crash the batch in flight is not
        settled (its outbox stays, as kill -9 would leave it)."""
        if not clean and self.batches is not None:
            self.batches.abandon()
        if self._consumer is not None:
            try:
                self._consumer.close()  # leaves the group; on_revoke closes the caches
            except Exception as exc:  # closing after a crash: report, do not mask the crash
                log.warning("consumer close: %s", exc)
        if clean:
            self._producer.flush(self.settings.admin_timeout)
        if self.partitions is not None:
            self.partitions.close()
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

    # ------------------------------------------------------------------ the group's rebalances
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Requests partitions start a router session at the group's committed offset; by-head
        partitions bring their cache up and seek past its last offset."""
        assert self.batches is not None and self.router is not None and self.partitions is not None
        try:
            self.batches.settle()
            for tp in partitions:
                if tp.topic == self.topics.requests:
                    self.router.reset(tp.partition)
            self.partitions.assign(consumer, [tp for tp in partitions if tp.topic != self.topics.requests])
            consumer.assign(partitions)
        except BaseException as exc:  # surfaced by the poll loop (exceptions in callbacks are fragile)
            self._fatal = exc
            with contextlib.suppress(Exception):
                consumer.unassign()  # consume nothing; the poll loop raises right after
            return
        if not self.ready.is_set():
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready()

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        assert self.batches is not None and self.partitions is not None
        try:  # before the caches close; on failure the next owner re-sends the outbox
            self.batches.settle()
        except BaseException as exc:  # surfaced by the poll loop
            self._fatal = exc
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.window.drop(gone)  # not yet processed: the next owner reads them again
        for topic, p in gone:
            if topic == self.topics.by_head:
                self.partitions.revoke(p)
        with contextlib.suppress(Exception):  # already unassigned (on_lost, close)
            consumer.unassign()
