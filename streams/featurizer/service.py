"""``unlearn featurizer``: requests -> exact deltas (the thin confluent-kafka shell).

All decisions are in :mod:`streams.featurizer.core` and :mod:`streams.featurizer.model` (pure)
and all durable state in :mod:`streams.featurizer.cache`; the service moves bytes. One consumer
(one group, one join) reads two topics (docs/featurizer.md): ``requests`` records are **routed**
to ``<requests>.by-head`` at their head's partition, and the by-head records are **featurized**
per micro-batch through the cache's outbox.

:class:`FeaturizerService` is the process (settings, lifecycle, the poll loop over a
:class:`~streams.featurizer.batch.BatchWindow`, and the group's rebalance callbacks) and
owns three parts: a :class:`~streams.featurizer.model.Router` (forwards requests records),
:class:`Partitions` (the owned partitions' caches and keys: assign, revoke) and a
:class:`~streams.featurizer.batch.BatchProcessor` (one batch's steps and the commit sequence),
which share one :class:`~streams.featurizer.delivery.Delivery` (the producer). At start-up
:func:`check_topics` checks the topics exist (docs/featurizer.md: exit 2 on missing topics).

**Partitions**: the by-head partitions one featurizer owns, their feature caches and key stores,
brought up on assignment and dropped on revocation (the consumer group's rebalances). A by-head
partition's cache comes up by ``cache.resume_plan``: keep the local cache if the changelog's
last batch is its own (re-produce its leftover outbox), else rebuild it from the changelog (and
finish delivering the changelog's last batch), or upload a local cache the changelog lacks; then
the partition is sought to (cache's recorded offset + 1), after checking the cache belongs to
these topics. Re-produced deltas carry the same ``source_id`` as the first copy, so the ledger
skips a duplicate.

**Broker faults** (``infra.retry``, docs/featurizer.md): every read of assignment (the changelog's
position and restore, committed offsets, log bounds), the topic checks and the deliveries run
under the one retry policy; each is a read, or a re-send the outbox and the ledger's source ids
make harmless, so asking again is safe. Offset commits stay as they are (recovery never reads them).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from unlearn.infra.log_position import StaleStateError, check_resume, log_bounds, topic_id
from unlearn.infra.registry import RegistryView
from unlearn.infra.retry import RetryPolicy
from unlearn.infra.settings import ErasureSettings, HeadSettings, Settings, consumer_config, producer_config, quirks
from unlearn.infra.topics import ensure_topic, raw_input_config
from unlearn.infra.worker_metrics import WorkerMetrics
from unlearn.schemas.envelope import source_stream
from unlearn.streams.featurizer.auth import AuthGate
from unlearn.streams.featurizer.batch import BatchProcessor, BatchWindow
from unlearn.streams.featurizer.cache import (
    PHASE_CHANGELOG,
    PHASE_OUTPUT,
    ChangelogReader,
    FeatureCache,
    FoldedChangelog,
    Position,
    batch_records,
    resume_plan,
    snapshot_mutations,
)
from unlearn.streams.featurizer.delivery import Delivery, outbox_messages
from unlearn.streams.featurizer.erasure import Erasure
from unlearn.streams.featurizer.model import (
    CoreConfig,
    DeliveryError,
    Encoder,
    FaultHook,
    FeaturizerError,
    LostCacheError,
    OutMessage,
    ReadyHook,
    RegistryEncoder,
    Router,
    Topics,
)
from unlearn.streams.featurizer.raw_input_trim import Trimmer
from unlearn.streams.featurizer.settings import FeaturizerSettings
from unlearn.streams.featurizer.transit_keys import group_committed

__all__ = [
    "Partitions",
    "check_topics",
    "DeliveryError",
    "FeaturizerError",
    "FeaturizerService",
    "LostCacheError",
]

log = logging.getLogger("unlearn.featurizer")

_STALE_FIX = ("move the data dir away to start over with an empty cache (and a fresh ledger), or point the featurizer "
              "at the broker and topics its cache came from")


class Partitions:
    """The owned by-head partitions: ``caches`` (partition -> its cache) and, with sealing, their
    keys in ``erasure``. :meth:`assign` brings partitions up and sets where each resumes;
    :meth:`revoke` drops them. ``stats["replayed"]`` counts what a crash left and was re-sent."""

    def __init__(self, settings: Settings, topics: Topics, *, group: str, stream_dir: str, client_id: str | None,
                 delivery: Delivery, erasure: Erasure | None, stats: dict[str, int]) -> None:
        self.settings = settings
        self.topics = topics
        self.group = group
        self.stream_dir = stream_dir
        self.client_id = client_id
        self.delivery = delivery
        self.erasure = erasure
        self.stats = stats
        self.caches: dict[int, FeatureCache] = {}
        self.retry = RetryPolicy.of(settings)  # the broker reads of assignment (module docstring)
        self._reader = ChangelogReader(settings, topics.changelog) if topics.changelog else None

    def assign(self, consumer: Any, partitions: Sequence[Any]) -> None:
        """Bring each by-head ``TopicPartition`` up and set its ``offset`` to where it resumes."""
        origin_ends: dict[int, int] = {}  # requests partition -> log end, shared by the routing checks
        for tp in partitions:
            p = tp.partition
            if self.erasure is not None:
                self.erasure.load(p)  # before the cache: a rebuild opens sealed sample records
            cache = self.caches.get(p)
            if cache is None:
                ident = {"topic": self.topics.by_head, "client_id": self.client_id or ""}
                cache = FeatureCache.open_partition(  # sqlite NORMAL where the changelog covers a power cut
                    self.settings.data_dir, self.stream_dir, p, ident,
                    synchronous="FULL" if self._reader is None else "NORMAL")
                self.caches[p] = cache
            if self._reader is None:
                self._assign_local(consumer, tp, cache, origin_ends)
            else:
                self._assign_with_changelog(consumer, tp, cache, self._reader, origin_ends)

    def revoke(self, partition: int) -> None:
        """Close the partition's cache and drop its keys (the next owner takes them from Kafka)."""
        cache = self.caches.pop(partition, None)
        if cache is not None:
            cache.close()
        if self.erasure is not None:
            self.erasure.drop(partition)

    def close(self) -> None:
        """Close every cache (on stop; what a crash left stays in their outboxes)."""
        for cache in self.caches.values():
            cache.close()
        self.caches.clear()

    def _assign_local(self, consumer: Any, tp: Any, cache: FeatureCache, origin_ends: dict[int, int]) -> None:
        """No changelog (federated site, own requests topic): the local file is the only copy."""
        p = tp.partition
        self._reproduce(p, cache)
        off = cache.applied_offset
        if off < 0:
            self._check_not_lost(consumer, p, f"the feature cache {cache.path} is empty",
                                 "Restore the cache file (or move the partition back to the host that has it)")
        tp.offset = self._resume_offset(consumer, p, cache, origin_ends)
        log.info("partition %d assigned: cache at offset %d, %d samples", p, off, cache.count())

    def _assign_with_changelog(self, consumer: Any, tp: Any, cache: FeatureCache, reader: ChangelogReader,
                               origin_ends: dict[int, int]) -> None:
        """Local cache vs changelog (``resume_plan``): continue, rebuild, seed or start fresh."""
        p = tp.partition
        latest, delivered = self.retry.call(f"reading the changelog position of partition {p}",
                                            lambda: reader.latest_position(p))  # a new reader per try
        plan = resume_plan(cache.local_position(), latest)
        folded = self._rebuild(p, cache, reader) if plan == "rebuild" else None
        if cache.applied_offset < 0:
            self._check_not_lost(
                consumer, p, f"both the feature cache {cache.path} and the changelog {self.topics.changelog}/{p} "
                             "are empty", "Restore the cache file or the changelog topic")
        tp.offset = self._resume_offset(consumer, p, cache, origin_ends)
        if plan == "continue" and delivered >= cache.generation:
            # another owner already finished this cache's last batch from the changelog
            cache.ack_outbox(r.seq for r in cache.pending_outbox())
        elif plan == "continue":
            self._reproduce(p, cache)
        elif plan == "seed":
            self._seed(p, cache)
        elif folded is not None and folded.position is not None and folded.pending:
            self._finish_changelog_batch(p, folded, folded.position)
        log.info("partition %d assigned (%s): cache at offset %d, %d samples", p, plan, cache.applied_offset,
                 cache.count())

    def _rebuild(self, p: int, cache: FeatureCache, reader: ChangelogReader) -> FoldedChangelog:
        """The cache becomes the changelog's copy (refused if the changelog belongs to another topic)."""
        t0 = time.monotonic()
        opener = self.erasure.opener(p) if self.erasure is not None else None
        folded = self.retry.call(f"restoring partition {p} from {self.topics.changelog}",
                                 lambda: reader.restore(p, opener))  # read again from the start, a new reader
        pos = folded.position
        if pos is None:
            raise FeaturizerError(f"partition {p}: changelog position vanished while rebuilding")
        if pos.topic != self.topics.by_head:
            raise StaleStateError(
                f"changelog {self.topics.changelog}/{p} belongs to {pos.topic!r}, not {self.topics.by_head!r}: "
                "start over with a fresh ledger, featurizer-cache topic and consumer group")
        cache.replace_all(folded.samples.values(), folded.heads.values(), pos, folded.tombstones.values(),
                          folded.events.values())
        log.warning("partition %d: feature cache rebuilt from %s (%d samples, %d tombstones, offset %d) in %.2fs",
                    p, self.topics.changelog, len(folded.samples), len(folded.tombstones), pos.applied_offset,
                    time.monotonic() - t0)
        return folded

    def _finish_changelog_batch(self, p: int, folded: FoldedChangelog, pos: Position) -> None:
        """The changelog's last batch may not have been delivered: finish it (same source ids), with
        its sample/head records written again (a crash may have cut them short)."""
        assert self.topics.changelog is not None
        records = [OutMessage(self.topics.changelog, k, v, p, PHASE_OUTPUT) for k, v in folded.pending_records]
        msgs = [*folded.pending, *records]
        log.warning("partition %d: re-producing %d message(s) of the changelog's last batch", p, len(msgs))
        self.delivery.deliver(msgs)
        self.delivery.mark_delivered(p, pos.generation)
        self.stats["replayed"] += len(msgs)

    def _seed(self, p: int, cache: FeatureCache) -> None:
        """Upload a local cache the changelog lacks, as one batch that also carries whatever the
        local outbox still had to deliver."""
        changelog = self.topics.changelog
        assert changelog is not None
        downstream = [OutMessage(r.topic, r.key, r.value, headers=r.headers) for r in
                      outbox_messages(cache.pending_outbox(), changelog, p) if r.topic != changelog]
        gen = cache.generation + 1
        pos = Position(p, cache.applied_offset, self.topics.by_head, cache.topic_id or self.topics.by_head_id,
                       cache.lineage, gen, 0, "", cache.origin_offsets(), cache.origin_topic_id,
                       cache.route_partitions)
        msgs = batch_records(p, changelog, snapshot_mutations(cache.all_samples(), cache.heads(),
                                                              cache.all_tombstones(), cache.all_events()),
                             downstream, pos, self.settings.changelog_max_bytes,
                             self.erasure.sample_sealer(p) if self.erasure is not None else None) + downstream
        if self.erasure is not None:
            self.erasure.flush()  # keys of samples cached before sealing existed
        seqs = cache.replace_outbox([m for m in msgs if m.phase == PHASE_CHANGELOG], gen)
        log.warning("partition %d: uploading the local feature cache (%d samples) to %s", p, cache.count(), changelog)
        self.delivery.deliver(msgs)
        cache.ack_outbox(seqs)
        self.delivery.mark_delivered(p, gen)
        self.stats["replayed"] += len(downstream)

    def _reproduce(self, p: int, cache: FeatureCache) -> None:
        """Re-produce the outbox rows a crash left (in their phases), then forget them."""
        rows = cache.pending_outbox()
        if rows:
            msgs = outbox_messages(rows, self.topics.changelog, p)  # phase 1 rebuilt from the txn
            log.warning("partition %d: re-producing %d outbox message(s) left by a crash", p, len(msgs))
            self.delivery.deliver(msgs)
            cache.ack_outbox(r.seq for r in rows)
            self.stats["replayed"] += len(msgs)
            self.delivery.mark_delivered(p, cache.generation)

    def _check_not_lost(self, consumer: Any, p: int, what: str, fix: str) -> None:
        from confluent_kafka import TopicPartition

        committed = self.retry.call(f"reading the committed offset of partition {p}", lambda: consumer.committed(
            [TopicPartition(self.topics.by_head, p)], timeout=self.settings.admin_timeout))
        if committed and committed[0].offset > 0:
            raise LostCacheError(
                f"partition {p}: {what}, but group {self.group!r} committed offset {committed[0].offset}: deletes "
                f"need the cached q of earlier adds. {fix}, or start over with a fresh ledger and a new consumer "
                "group.")

    def _resume_offset(self, consumer: Any, partition: int, cache: FeatureCache, origin_ends: dict[int, int]) -> int:
        """Where the partition resumes: after the cache's last offset, if the cache belongs to
        this log (same topic incarnation, offset within the log) and its routing state to these
        topics (``_check_routing``); else StaleStateError."""
        off = cache.applied_offset
        next_offset = off + 1 if off >= 0 else None
        low, end = self._log_bounds(consumer, self.topics.by_head, partition, next_offset or 0)
        start = check_resume(f"feature cache {cache.path} (partition {partition})", next_offset, cache.topic_id,
                             self.topics.by_head_id, low, end, _STALE_FIX)
        self._check_routing(consumer, partition, cache, origin_ends)
        cache.bind_topic_id(self.topics.by_head_id)
        cache.bind_routing(self.topics.requests_id, self.topics.by_head_partitions)
        return start

    def _log_bounds(self, consumer: Any, topic: str, partition: int, at_least: int) -> tuple[int, int]:
        return self.retry.call(f"reading the bounds of {topic}/{partition}",
                               lambda: log_bounds(self.settings, consumer, topic, partition, at_least))

    def _check_routing(self, consumer: Any, partition: int, cache: FeatureCache, origin_ends: dict[int, int]) -> None:
        """The cache's routing state must belong to these topics: heads routed by the same
        by-head partition count (else they would be looked up in other partitions' caches),
        origin offsets of the same requests topic incarnation and within its log (else the new
        log's records would be dropped as copies). ``origin_ends`` caches the requests log ends."""
        what = f"feature cache {cache.path} (partition {partition})"
        t = self.topics
        if cache.route_partitions and cache.route_partitions != t.by_head_partitions:
            raise StaleStateError(f"{what} holds heads routed by {cache.route_partitions} partitions of "
                                  f"{t.by_head}, which now has {t.by_head_partitions}: {_STALE_FIX}")
        if cache.origin_topic_id and t.requests_id and cache.origin_topic_id != t.requests_id:
            raise StaleStateError(f"{what} judged requests of topic id {cache.origin_topic_id}, but "
                                  f"{t.requests} now has id {t.requests_id} (recreated): {_STALE_FIX}")
        for p, last in sorted(cache.origin_offsets().items()):
            if origin_ends.get(p, -1) < last + 1:
                origin_ends[p] = self._log_bounds(consumer, t.requests, p, last + 1)[1]
            if origin_ends[p] < last + 1:
                raise StaleStateError(f"{what} judged {t.requests}/{p} up to offset {last}, but the log ends "
                                      f"at {origin_ends[p]} (truncated, recreated or a different broker): refusing to "
                                      f"drop its records as copies; {_STALE_FIX}")


def check_topics(settings: Settings, consumer: Any, requests_topic: str, routed_topic: str, registry_topic: str,
                 changelog_topic: str | None) -> tuple[int, int]:
    """(the by-head topic's partition count, which heads are routed by; the requests topic's
    partition count, which transit keys are followed by). Why checked: a missing
    topic would be auto-created by tansu with 4 partitions. The requests topic must exist; its
    by-head topic is created if missing (with the requests topic's partition count); the head
    registry must exist; the changelog must exist (never auto-created) with a partition per
    by-head partition. FeaturizerError otherwise. The listings run under ``infra.retry``: a broker
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
                      "deadletters": 0, "receipts": 0, "deltas": 0, "replayed": 0}
        self.metrics = metrics or WorkerMetrics("featurizer")
        self.metrics.count(self.stats, FEATURIZER_OUTCOMES, {"events": "events_judged"})
        self.metrics.checkpoint_ages(lambda: self.batches.checkpoint_ages() if self.batches is not None else {})
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
            while not stop.is_set():
                self._turn(stop)
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
        self._consumer = Consumer({**consumer_config(s, self.group), **self.metrics.consumer_settings()})
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
            with self.metrics.timed():
                self.batches.process(batch)
        else:
            self.batches.settle()
        if self.erasure is not None:
            self.erasure.tick(self.partitions.caches)
        if self.trimmer is not None:
            self.trimmer.check()
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
        if self.auth is not None:
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
        self.batches.forget(gone)
        for topic, p in gone:
            if topic == self.topics.by_head:
                self.partitions.revoke(p)
        with contextlib.suppress(Exception):  # already unassigned (on_lost, close)
            consumer.unassign()
