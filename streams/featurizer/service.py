"""``unlearn featurizer``: requests -> exact deltas (the thin confluent-kafka shell).

All decisions are pure functions (:mod:`streams.featurizer.featurize` and the modules it calls)
and all durable state is in :mod:`streams.featurizer.feature_cache`; the service moves bytes. One
consumer (one group, one join) reads two topics (docs/featurizer.md): ``requests`` records are
**routed** to ``<requests>.by-head`` at their head's partition, and the by-head records are
**featurized** per micro-batch through the cache's outbox.

:class:`FeaturizerService` is the processor the runtime's poll loop runs
(runtime/poll_loop.py: batches from a :class:`~streams.featurizer.batch_window.BatchWindow`,
the group's rebalances) and owns three parts: a :class:`~streams.featurizer.routing.Router`
(forwards requests records), :class:`~streams.featurizer.owned_partitions.Partitions` (the owned
partitions' caches and keys: assign, revoke) and a :class:`~streams.featurizer.batch.BatchProcessor`
(one batch's steps and the commit sequence), which share one
:class:`~streams.featurizer.delivery.Delivery` (the producer).
At start-up :func:`check_topics` checks the topics exist (docs/featurizer.md: exit 2 on missing
topics), under ``runtime.retry`` like every broker read of the featurizer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import replace
from typing import Any

from unlearn.common.registry import RegistryView
from unlearn.infra.settings import ErasureSettings, HeadSettings, Settings
from unlearn.infra.worker_metrics import WorkerMetrics
from unlearn.runtime import clients
from unlearn.runtime.clients import quirks
from unlearn.runtime.delivery import DeliveryError
from unlearn.runtime.log_position import topic_id
from unlearn.runtime.poll_loop import PollLoop
from unlearn.runtime.retry import RetryPolicy
from unlearn.runtime.topics import ensure_topic, raw_input_config
from unlearn.schemas.source_id import source_stream
from unlearn.streams.featurizer.add_encoding import Encoder, RegistryEncoder
from unlearn.streams.featurizer.auth import AuthGate
from unlearn.streams.featurizer.batch import BatchProcessor
from unlearn.streams.featurizer.batch_window import BatchWindow
from unlearn.streams.featurizer.core_config import CoreConfig
from unlearn.streams.featurizer.delivery import Delivery
from unlearn.streams.featurizer.erasure import Erasure
from unlearn.streams.featurizer.featurizer_errors import FeaturizerError, LostCacheError
from unlearn.streams.featurizer.owned_partitions import Partitions
from unlearn.streams.featurizer.raw_input_trim import Trimmer
from unlearn.streams.featurizer.routing import Router
from unlearn.streams.featurizer.service_types import FaultHook, ReadyHook, Topics
from unlearn.streams.featurizer.settings import FeaturizerSettings
from unlearn.streams.featurizer.transit_keys import group_committed

__all__ = [
    "check_topics",
    "DeliveryError",
    "FeaturizerError",
    "FeaturizerService",
    "LostCacheError",
]

log = logging.getLogger("unlearn.featurizer")


def check_topics(settings: Settings, consumer: Any, requests_topic: str, routed_topic: str, registry_topic: str,
                 changelog_topic: str | None) -> tuple[int, int]:
    """(the by-head topic's partition count, which heads are routed by; the requests topic's
    partition count, which transit keys are followed by). Why checked: a missing
    topic would be auto-created by tansu with 4 partitions. The requests topic must exist; its
    by-head topic is created if missing (with the requests topic's partition count); the head
    registry must exist; the changelog must exist (never auto-created) with a partition per
    by-head partition. FeaturizerError otherwise. The listings run under ``runtime.retry``: a broker
    restarting is waited for, never taken for a missing topic."""
    retry = RetryPolicy.of(settings)

    def listing() -> Any:  # all topics: never creates one
        return retry.call("listing topics", lambda: consumer.list_topics(timeout=settings.admin_timeout))
    md = listing()
    req = md.topics.get(requests_topic)
    if req is None or req.error is not None or not req.partitions:
        raise FeaturizerError(f"requests topic {requests_topic!r} is missing: run `unlearn topics create`")
    routed = md.topics.get(routed_topic)
    if routed is None or routed.error is not None or not routed.partitions:
        retry.call(f"creating {routed_topic}", lambda: ensure_topic(
            settings, routed_topic, partitions=len(req.partitions), config=raw_input_config(settings)))
        md = listing()
        routed = md.topics[routed_topic]
    route_partitions, request_partitions = len(routed.partitions), len(req.partitions)
    reg = md.topics.get(registry_topic)
    if reg is None or reg.error is not None:
        raise FeaturizerError(f"head registry topic {registry_topic!r} is missing: run `unlearn topics create`")
    if changelog_topic is None:
        return route_partitions, request_partitions
    cl = md.topics.get(changelog_topic)
    if cl is None or cl.error is not None:
        raise FeaturizerError(f"changelog topic {changelog_topic!r} is missing: run `unlearn topics create`")
    if len(cl.partitions) < route_partitions:
        raise FeaturizerError(f"changelog topic {changelog_topic!r} has {len(cl.partitions)} partitions, "
                              f"{routed_topic!r} has {route_partitions}: they must be co-partitioned")
    return route_partitions, request_partitions


def _topics(settings: Settings, config: CoreConfig) -> Topics:
    """The featurizer's topic names. The changelog backs the shared requests topic only: a
    federated site's per-sample q must stay on its site, and another requests topic's by-head
    topic need not be co-partitioned with it."""
    shared = not config.federated and config.requests_topic == settings.topic("requests")
    return Topics(requests=config.requests_topic, by_head=config.input_topic,
                  changelog=settings.topic("featurizer-cache") if shared else None,
                  origin_stream=source_stream(config.requests_topic, settings.topic_prefix))


#: The featurizer's counters that are outcomes of a request event (``unlearn_featurizer_events_total``).
FEATURIZER_OUTCOMES = {"accepted": "accepted", "deadletters": "dead_lettered", "reforwarded": "dropped_copy",
                       "gaps": "dropped_gap"}


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
        metrics: WorkerMetrics | None = None,
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
        # UNLEARN_AUTH_MODE=signed: the client registry and replay windows (None: off)
        self.auth = AuthGate(settings) if settings.auth_mode == "signed" else None
        self.stats = {"batches": 0, "routed": 0, "events": 0, "reforwarded": 0, "gaps": 0, "accepted": 0, "rows": 0,
                      "deadletters": 0, "receipts": 0, "deltas": 0, "replayed": 0, "lane_deletes": 0}
        self.metrics = metrics or WorkerMetrics("featurizer")
        self.metrics.count(self.stats, FEATURIZER_OUTCOMES, {"events": "events_judged"})
        self.metrics.checkpoint_ages(lambda: self.batches.checkpoint_ages() if self.batches is not None else {})
        self.loop: PollLoop | None = None
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
        """Consume until ``stop`` is set; returns 0 after a clean stop (raises on fatal errors). The
        runtime's poll loop (runtime/poll_loop.py) calls the hooks below."""
        try:
            self._start()
        except BaseException:  # nothing ran yet: release what the start made
            if self._consumer is not None:
                with contextlib.suppress(Exception):
                    self._consumer.close()
            self.close(False)
            raise
        assert self.loop is not None
        self.loop.run(stop or threading.Event())
        return 0

    def _start(self) -> None:
        """Connect, check the topics, build the parts and join the group."""

        s = self.settings
        # linger.ms=0: a batch's phase 1 (the deltas) leaves when produced; the flush(0) after it does
        # not beat librdkafka's linger (delivery.deliver_overlapped).
        self._producer = clients.producer(s, **{"linger.ms": 0})
        self._consumer = clients.consumer(s, self.group, **self.metrics.consumer_settings())
        t = self.topics
        if FeaturizerSettings.of(s).seal_rows and t.changelog is not None:  # with transit keys (docs/erasure.md s.5)
            self.erasure = Erasure(s, self.config.deltas_topic, t.requests, t.by_head,
                                   lambda: group_committed(s, self.group, t.requests, self.topics.requests_partitions))
        by_head_partitions, requests_partitions = check_topics(s, self._consumer, t.requests, t.by_head,
                                                               self.config.registry_topic, t.changelog)
        # the follower rides through a broker restart itself: wait for it up to the retry deadline
        self.registry = RegistryView(s).start(wait_caught_up=RetryPolicy.of(s).deadline_s)
        if self.auth is not None:
            self.auth.start()
        t = self.topics = replace(t, requests_id=topic_id(s, t.requests), by_head_id=topic_id(s, t.by_head),
                                  by_head_partitions=by_head_partitions, requests_partitions=requests_partitions)
        if quirks(s).delete_records and t.changelog is not None and ErasureSettings.of(s).trim_every_seconds > 0:
            self.trimmer = Trimmer(s, self.group, (t.requests, t.by_head))  # a federated cache has no changelog
        delivery = Delivery(self._producer, t.changelog, self.erasure.delivered if self.erasure is not None else None,
                            RetryPolicy.of(s))
        self.router = Router(t.origin_stream, t.by_head, t.by_head_partitions, delivery)
        self.partitions = Partitions(s, t, group=self.group, stream_dir=self.stream_dir,
                                     client_id=self.config.client_id, delivery=delivery, erasure=self.erasure,
                                     stats=self.stats)
        self.batches = BatchProcessor(s, self.config, t, consumer=self._consumer, delivery=delivery,
                                      router=self.router, partitions=self.partitions, registry=self.registry,
                                      encoder=self.encoder, auth=self.auth, erasure=self.erasure, fault=self.fault,
                                      stats=self.stats, window=self.window)
        self.window.waiting = self.batches.settle_if_answered
        self.loop = PollLoop(self._consumer, self, self.window, on_ready=self._became_ready)
        self.loop.subscribe([t.requests, t.by_head])
        log.info("featurizer group=%s requests=%s routed=%s (%d partitions) stream=%s federated=%s auth=%s "
                 "batch<=%d/%dms", self.group, t.requests, t.by_head, t.by_head_partitions, self.config.stream,
                 self.config.federated, s.auth_mode, self.window.max_batch, self.window.max_ms)

    def process(self, batch: list[Any]) -> None:
        assert self.batches is not None
        with self.metrics.timed():
            self.batches.process(batch)

    def idle(self) -> None:
        """Nothing came: the batch in flight is settled (its outputs acknowledged, offsets committed)."""
        assert self.batches is not None
        self.batches.settle()

    def tick(self) -> None:
        """The erasure and trim timers, after every turn."""
        assert self.partitions is not None
        if self.erasure is not None:
            self.erasure.tick(self.partitions.caches)
        if self.trimmer is not None:
            self.trimmer.check()
        if self.trimmer is not None and self.trimmer.due():
            self.trimmer.offer(self._consumer.assignment())

    def finish(self) -> None:
        assert self.batches is not None
        self.batches.settle()

    def abandon(self) -> None:
        """After a crash the batch in flight is not settled (its outbox stays, as kill -9 would leave it)."""
        if self.batches is not None:
            self.batches.abandon()

    def close(self, clean: bool) -> None:
        """Release everything, once the consumer left the group (its revocation closed the caches)."""
        if clean:
            self._producer.flush(self.settings.admin_timeout)
        if self.partitions is not None:
            self.partitions.close()
        if self.registry is not None:
            self.registry.stop()
        if self.auth is not None:
            self.auth.stop()
        if self.erasure is not None:
            self.erasure.close()
        if self.trimmer is not None:
            self.trimmer.close()
        if clean and self._producer is not None:
            clients.close_producer(self._producer, self.settings.admin_timeout)
        self._consumer = self._producer = None  # release the librdkafka handles now
        log.info("featurizer stopped (%s) stats %s", "clean" if clean else "error", self.stats)

    def _became_ready(self) -> None:
        self.ready.set()
        if self.on_ready is not None:
            self.on_ready()

    # ------------------------------------------------------------------ the group's rebalances
    def assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Requests partitions start a router session at the group's committed offset; by-head
        partitions bring their cache up and seek past its last offset."""
        assert self.batches is not None and self.router is not None and self.partitions is not None
        self.batches.settle()
        for tp in partitions:
            if tp.topic == self.topics.requests:
                self.router.reset(tp.partition)
        self.partitions.assign(consumer, [tp for tp in partitions if tp.topic != self.topics.requests])
        consumer.assign(partitions)

    def revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Settle the batch in flight (on failure the next owner re-sends the outbox), then drop the
        partitions; a settle failure is raised once they are dropped."""
        assert self.batches is not None and self.partitions is not None
        failure: BaseException | None = None
        try:  # before the caches close
            self.batches.settle()
        except BaseException as exc:
            failure = exc
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.window.drop(gone)  # not yet processed: the next owner reads them again
        self.batches.forget(gone)
        for topic, p in gone:
            if topic == self.topics.by_head:
                self.partitions.revoke(p)
        with contextlib.suppress(Exception):  # already unassigned (on_lost, close)
            consumer.unassign()
        if failure is not None:
            raise failure

    lost = revoke
