"""``unlearn featurizer``: requests -> exact deltas (the thin confluent-kafka shell).

All decisions are in :mod:`streams.featurizer.core` and :mod:`streams.featurizer.router` (pure)
and all durable state in :mod:`streams.featurizer.cache`; this module moves bytes. One consumer
(one group, one join) reads two topics (docs/featurizer.md):

- **routing**: each ``requests`` record is forwarded unchanged to ``<requests>.by-head`` at its
  head's partition (``router.RouterSession``), with headers naming its origin; the requests
  offsets are committed after every forward is acknowledged (at-least-once: the featurizer drops
  re-forwarded copies exactly, ``core.admit_routed``);
- **featurizing** the by-head records, per micro-batch (size- and time-bounded) and per
  by-head partition:

1. decide the outcome (``featurize_batch``) against the partition's cache;
2. in ONE sqlite transaction: apply the cache mutations, put the encoded deltas / dead letters /
   rejected receipts into the outbox (with the changelog: only the batch's txn and position,
   ``changelog.batch_records``, which hold them), record the batch's last input offset;
3. produce the outbox rows in two phases, each fully acknowledged: (0) the batch's txn and
   position records on ``featurizer-cache``, (1) the downstream messages and the sample/head
   records, awaited while the next batch is polled and judged (``_settle``); then delete them;
4. commit the input offsets to Kafka (informational for by-head partitions: the cache is
   authoritative; the router's resume point for requests partitions).

On partition assignment (``changelog.resume_plan``): keep the local cache if the changelog's last
batch is its own (re-produce its leftover outbox), else rebuild it from the changelog (and finish
delivering the changelog's last batch), or upload a local cache the changelog lacks; then seek
the partition to (cache's recorded offset + 1). Re-produced deltas carry the same ``source_id``
as the first copy, so the ledger skips a duplicate.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from unlearn.infra.head_registry import RegistryView
from unlearn.infra.log_position import StaleStateError, check_resume, log_bounds, topic_id
from unlearn.infra.profiles import consumer_config, producer_config
from unlearn.infra.settings import Settings
from unlearn.schemas.source_id import source_stream
from unlearn.streams.featurizer.auth_gate import AuthGate
from unlearn.streams.featurizer.cache import FeatureCache, OutboxRow
from unlearn.streams.featurizer.changelog import (
    PHASE_CHANGELOG,
    PHASE_OUTPUT,
    FoldedChangelog,
    Position,
    batch_records,
    delivered_record,
    resume_plan,
    snapshot_mutations,
)
from unlearn.streams.featurizer.changelog_store import ChangelogReader
from unlearn.streams.featurizer.core import (
    CoreConfig,
    Encoder,
    InMessage,
    OutMessage,
    RegistryEncoder,
    featurize_batch,
)
from unlearn.streams.featurizer.delivery import Acks, deliver_overlapped, deliver_phases, outbox_messages
from unlearn.streams.featurizer.heads import with_registry
from unlearn.streams.featurizer.model import (
    DeliveryError,
    FaultHook,
    FeaturizerError,
    LostCacheError,
    ReadyHook,
    count_batch,
)
from unlearn.streams.featurizer.router import RouterSession, read_origin
from unlearn.streams.featurizer.shredder import Erasure
from unlearn.streams.featurizer.topic_check import check_topics
from unlearn.streams.featurizer.transit import group_committed

__all__ = ["DeliveryError", "FeaturizerError", "FeaturizerService", "LostCacheError"]

log = logging.getLogger("unlearn.featurizer")

_STALE_FIX = ("move the data dir away to start over with an empty cache (and a fresh ledger), or point the featurizer "
              "at the broker and topics its cache came from")

class FeaturizerService:
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
        self._inflight: tuple[Acks, list[tuple[int, FeatureCache, list[int], int]], list[Any]] | None = None
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
        self.stats = {"batches": 0, "routed": 0, "events": 0, "reforwarded": 0, "gaps": 0, "accepted": 0, "rows": 0,
                      "deadletters": 0, "receipts": 0, "deltas": 0, "replayed": 0}

    # ------------------------------------------------------------------ lifecycle
    def run(self, stop: threading.Event | None = None) -> int:
        """Consume until ``stop`` is set; returns 0 after a clean stop (raises on fatal errors)."""
        from confluent_kafka import Consumer, Producer

        stop = stop or threading.Event()
        self._producer = Producer(producer_config(self.settings, **{"linger.ms": 5}))
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
            self._consumer = self._producer = None  # release the librdkafka handles now
            log.info("featurizer stopped (%s) stats %s", "clean" if clean else "error", self.stats)

    def _check_fatal(self) -> None:
        if self._fatal is not None:
            err, self._fatal = self._fatal, None
            raise err

    def _hook(self, point: str) -> None:
        if self.fault is not None:
            self.fault(point)

    # ------------------------------------------------------------------ rebalance
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Requests partitions start a router session at the group's committed offset; by-head
        partitions bring their cache up and seek past its last offset."""
        origin_ends: dict[int, int] = {}  # requests partition -> log end, shared by the routing checks
        try:
            self._settle()
            for tp in partitions:
                if tp.topic == self.requests_topic:
                    assert self._router is not None
                    self._router.reset(tp.partition)
                    continue
                p = tp.partition
                if self.erasure is not None:
                    self.erasure.load(p)  # before the cache: a rebuild opens sealed sample records
                cache = self.caches.get(p)
                if cache is None:
                    ident = {"topic": self.topic, "client_id": self.config.client_id or ""}
                    cache = FeatureCache.open_partition(  # sqlite NORMAL where the changelog covers a power cut
                        self.settings.data_dir, self.stream_dir, p, ident,
                        synchronous="FULL" if self._reader is None else "NORMAL")
                    self.caches[p] = cache
                if self._reader is None:
                    self._assign_local(consumer, tp, cache, origin_ends)
                else:
                    self._assign_with_changelog(consumer, tp, cache, self._reader, origin_ends)
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
        latest, delivered = reader.latest_position(p)
        plan = resume_plan(cache.local_position(), latest)
        folded: FoldedChangelog | None = None
        if plan == "rebuild":
            t0 = time.monotonic()
            folded = reader.restore(p, self.erasure.opener(p) if self.erasure is not None else None)
            pos = folded.position
            if pos is None:
                raise FeaturizerError(f"partition {p}: changelog position vanished while rebuilding")
            if pos.topic != self.topic:
                raise StaleStateError(
                    f"changelog {self.changelog_topic}/{p} belongs to {pos.topic!r}, not {self.topic!r} (a changelog "
                    "written before requests were routed by head holds caches per requests partition, which "
                    "cannot be used): start over with a fresh ledger, featurizer-cache topic and consumer group")
            cache.replace_all(folded.samples.values(), folded.heads.values(), pos)
            log.warning("partition %d: feature cache rebuilt from %s (%d samples, offset %d) in %.2fs", p,
                        self.changelog_topic, len(folded.samples), pos.applied_offset, time.monotonic() - t0)
        off = cache.applied_offset
        if off < 0:
            self._check_not_lost(
                consumer, p, f"both the feature cache {cache.path} and the changelog {self.changelog_topic}/{p} "
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
            # the changelog's last batch may not have been delivered: finish it (same source ids)
            pos = folded.position
            assert self.changelog_topic is not None
            msgs = [*folded.pending, *self._state_messages(p, folded)]
            log.warning("partition %d: re-producing %d message(s) of the changelog's last batch", p, len(msgs))
            self._deliver(msgs)
            self._mark_delivered(p, pos.generation)
            self.stats["replayed"] += len(msgs)
        log.info("partition %d assigned (%s): cache at offset %d, %d samples", p, plan, cache.applied_offset,
                 cache.count())

    def _state_messages(self, p: int, folded: FoldedChangelog) -> list[OutMessage]:
        """The last batch's sample/head records, written again (a crash may have cut them short)."""
        assert self.changelog_topic is not None
        return [OutMessage(self.changelog_topic, k, v, p, PHASE_OUTPUT) for k, v in folded.pending_records]

    def _seed(self, p: int, cache: FeatureCache) -> None:
        """Upload a local cache the changelog lacks, as one batch that also carries whatever the
        local outbox still had to deliver."""
        assert self.changelog_topic is not None
        downstream = [OutMessage(r.topic, r.key, r.value) for r in
                      outbox_messages(cache.pending_outbox(), self.changelog_topic, p)
                      if r.topic != self.changelog_topic]
        gen = cache.generation + 1
        pos = Position(p, cache.applied_offset, self.topic, cache.topic_id or self.topic_id, cache.lineage, gen, 0, "",
                       cache.origin_offsets(), cache.origin_topic_id, cache.route_partitions)
        msgs = batch_records(p, self.changelog_topic, snapshot_mutations(cache.all_samples(), cache.heads()),
                             downstream, pos, self.settings.changelog_max_bytes,
                             self.erasure.sample_sealer(p) if self.erasure is not None else None) + downstream
        if self.erasure is not None:
            self.erasure.flush()  # keys of samples cached before sealing existed
        seqs = cache.replace_outbox([m for m in msgs if m.phase == PHASE_CHANGELOG], gen)
        log.warning("partition %d: uploading the local feature cache (%d samples) to %s", p, cache.count(),
                    self.changelog_topic)
        self._deliver(msgs)
        cache.ack_outbox(seqs)
        self._mark_delivered(p, gen)
        self.stats["replayed"] += len(downstream)

    def _reproduce(self, p: int, cache: FeatureCache) -> None:
        """Re-produce the outbox rows a crash left (in their phases), then forget them."""
        rows = cache.pending_outbox()
        if rows:
            msgs = outbox_messages(rows, self.changelog_topic, p)  # phase 1 rebuilt from the txn
            log.warning("partition %d: re-producing %d outbox message(s) left by a crash", p, len(msgs))
            self._deliver(msgs)
            cache.ack_outbox(r.seq for r in rows)
            self.stats["replayed"] += len(msgs)
            if self.changelog_topic is not None:
                self._mark_delivered(p, cache.generation)

    def _check_not_lost(self, consumer: Any, p: int, what: str, fix: str) -> None:
        from confluent_kafka import TopicPartition

        committed = consumer.committed([TopicPartition(self.topic, p)], timeout=self.settings.admin_timeout)
        if committed and committed[0].offset > 0:
            raise LostCacheError(
                f"partition {p}: {what}, but group {self.group!r} committed offset {committed[0].offset}: deletes "
                f"need the cached q of earlier adds. {fix}, or start over with a fresh ledger and a new consumer "
                "group.")

    def _mark_delivered(self, p: int, generation: int) -> None:
        """Tell a future owner generation ``generation`` needs no re-send (best effort, not awaited:
        it rides with the next flush; losing it only costs a duplicate re-send)."""
        if self.changelog_topic is None or generation <= 0:
            return
        m = delivered_record(self.changelog_topic, p, generation)
        with contextlib.suppress(BufferError):
            self._producer.produce(m.topic, value=m.value, key=m.key, partition=m.partition)

    def _resume_offset(self, consumer: Any, partition: int, cache: FeatureCache, origin_ends: dict[int, int]) -> int:
        """Where the partition resumes: after the cache's last offset, if the cache belongs to
        this log (same topic incarnation, offset within the log) and its routing state to these
        topics (``_check_routing``); else StaleStateError."""
        off = cache.applied_offset
        next_offset = off + 1 if off >= 0 else None
        low, end = log_bounds(self.settings, consumer, self.topic, partition, next_offset or 0)
        start = check_resume(f"feature cache {cache.path} (partition {partition})", next_offset, cache.topic_id,
                             self.topic_id, low, end, _STALE_FIX)
        self._check_routing(consumer, partition, cache, origin_ends)
        cache.bind_topic_id(self.topic_id)
        cache.bind_routing(self.requests_topic_id, self.route_partitions)
        return start

    def _check_routing(self, consumer: Any, partition: int, cache: FeatureCache, origin_ends: dict[int, int]) -> None:
        """The cache's routing state must belong to these topics: heads routed by the same
        by-head partition count (else they would be looked up in other partitions' caches),
        origin offsets of the same requests topic incarnation and within its log (else the new
        log's records would be dropped as copies). ``origin_ends`` caches the requests log ends."""
        what = f"feature cache {cache.path} (partition {partition})"
        if cache.route_partitions and cache.route_partitions != self.route_partitions:
            raise StaleStateError(f"{what} holds heads routed by {cache.route_partitions} partitions of "
                                  f"{self.topic}, which now has {self.route_partitions}: {_STALE_FIX}")
        if cache.origin_topic_id and self.requests_topic_id and cache.origin_topic_id != self.requests_topic_id:
            raise StaleStateError(f"{what} judged requests of topic id {cache.origin_topic_id}, but "
                                  f"{self.requests_topic} now has id {self.requests_topic_id} (recreated): "
                                  f"{_STALE_FIX}")
        for p, last in sorted(cache.origin_offsets().items()):
            if origin_ends.get(p, -1) < last + 1:
                origin_ends[p] = log_bounds(self.settings, consumer, self.requests_topic, p, last + 1)[1]
            if origin_ends[p] < last + 1:
                raise StaleStateError(f"{what} judged {self.requests_topic}/{p} up to offset {last}, but the log ends "
                                      f"at {origin_ends[p]} (truncated, recreated or a different broker): refusing to "
                                      f"drop its records as copies; {_STALE_FIX}")

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        try:  # before the caches close; on failure the next owner re-sends the outbox
            self._settle()
        except BaseException as exc:  # surfaced by the poll loop
            self._fatal = exc
        gone = {(tp.topic, tp.partition) for tp in partitions}
        # Not-yet-processed messages of revoked partitions are dropped: the cache offset (or the
        # router's committed offset) says they are not done, so the next owner reads them again.
        self._pending = [m for m in self._pending if (m.topic(), m.partition()) not in gone]
        for topic, p in gone:
            cache = self.caches.pop(p, None) if topic == self.topic else None
            if cache is not None:
                cache.close()
            if topic == self.topic and self.erasure is not None:
                self.erasure.drop(p)
        with contextlib.suppress(Exception):  # already unassigned (on_lost, close)
            consumer.unassign()

    # ------------------------------------------------------------------ the loop
    def _poll_batch(self, stop: threading.Event) -> list[Any]:
        """Up to max_batch messages, waiting at most max_ms after the first one."""
        from confluent_kafka import KafkaError

        self._pending = []
        deadline: float | None = None
        while len(self._pending) < self.max_batch:
            if deadline is None:
                # consume() blocks for its whole timeout unless the batch fills; poll() returns on
                # the first message, which starts the batch window (latency of a lone delete).
                first = self._consumer.poll(0.2)
                got = [] if first is None else [first]
            else:
                timeout = max(0.0, deadline - time.monotonic())
                got = self._consumer.consume(num_messages=self.max_batch - len(self._pending), timeout=timeout)
            self._check_fatal()
            for m in got:
                err = m.error()
                if err is None:
                    self._pending.append(m)
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
            if time.monotonic() >= deadline or stop.is_set():
                break
        batch, self._pending = self._pending, []
        return batch

    def _process(self, batch: list[Any]) -> None:
        """Route the batch's requests records, featurize its by-head records, then commit the
        offsets of both (the router's only after its forwards were acknowledged)."""
        from confluent_kafka import TopicPartition

        forwarded, forwards = self._forward([m for m in batch if m.topic() == self.requests_topic])
        featurized = self._featurize([m for m in batch if m.topic() == self.topic])
        if forwards is not None:  # awaited after the featurizing it overlapped, before any commit
            self.stats["routed"] += forwards.wait()
            self._hook("after_route")
        offsets = [TopicPartition(self.requests_topic, p, last + 1) for p, last in sorted(forwarded.items())]
        offsets += [TopicPartition(self.topic, p, last + 1) for p, last in sorted(featurized.items())]
        if self._inflight is not None:  # committed once the batch's phase 1 is acknowledged (_settle)
            self._inflight[2].extend(offsets)
            if not featurized:
                self._settle()
        else:
            self._commit(offsets)

    def _commit(self, offsets: list[Any]) -> None:
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # e.g. a rebalance in progress: the cache is authoritative, re-forwards are dropped
            log.warning("offset commit failed (harmless: the cache has its offsets, copies are dropped): %s", exc)
        self.stats["batches"] += 1
        self._hook("after_offset_commit")

    def _forward(self, records: list[Any]) -> tuple[dict[int, int], Acks | None]:
        """Forward requests records to their heads' by-head partitions (value, key, headers and timestamp
        kept, origin headers added); return requests partition -> last offset forwarded, and the forwards'
        acks to await before committing it (DeliveryError: the next session forwards them again)."""
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

        if not records:
            return {}, None
        assert self._router is not None
        sends: list[dict[str, Any]] = []
        last: dict[int, int] = {}
        for m in sorted(records, key=lambda r: (r.partition(), r.offset())):
            p, off = m.partition(), m.offset()
            target, headers = self._router.route(m.value(), p, off, m.headers())
            kind, ts = m.timestamp()
            send = {"topic": self.topic, "value": m.value(), "key": m.key(), "partition": target, "headers": headers}
            if kind != TIMESTAMP_NOT_AVAILABLE and ts > 0:
                send["timestamp"] = ts
            sends.append(send)
            last[p] = off
        return last, Acks(self._producer, self._on_acked).send(sends)

    def _featurize(self, records: list[Any]) -> dict[int, int]:
        """Judge by-head records per partition through the outbox (module docstring, steps 1-3);
        return by-head partition -> last offset done."""
        by_partition: dict[int, list[InMessage]] = {}
        applied = {p: c.applied_offset for p, c in self.caches.items()}  # one read per partition, not per record
        for m in records:
            p = m.partition()
            if p not in applied or m.offset() <= applied[p]:
                continue  # revoked meanwhile, or already in the cache (never judged twice)
            by_partition.setdefault(p, []).append(
                InMessage(p, m.offset(), m.value(), m.key(), read_origin(m.headers(), self.origin_stream),
                          tuple(m.headers() or ())))
        if not by_partition:
            return {}
        done: list[tuple[int, FeatureCache, list[int], list[OutMessage], int]] = []
        now = time.time()
        assert self.registry is not None
        config = with_registry(self.config, self.registry.snapshot())
        for p, msgs in sorted(by_partition.items()):
            msgs.sort(key=lambda x: x.offset)
            cache = self.caches[p]
            origins = cache.origin_offsets()
            outcome = featurize_batch(msgs, cache, config, self.encoder, now=now, origins=origins,
                                      auth=self.auth.authorizer(p),
                                      transit=self.erasure.gate(p) if self.erasure is not None else None)
            if self.erasure is not None:
                outcome = self.erasure.seal(p, outcome, cache)
            messages = outcome.messages(config)
            generation: int | None = None
            durable = messages  # what the outbox keeps: with the changelog, phase 0 (outputs_of_txn)
            if self.changelog_topic is not None:
                # the changelog records ride in the same sqlite transaction, ahead of the outputs
                generation = cache.generation + 1
                pos = Position(p, outcome.last_offset, self.topic, self.topic_id, cache.lineage, generation, 0, "",
                               {**origins, **outcome.origin_offsets}, self.requests_topic_id, self.route_partitions)
                messages = batch_records(p, self.changelog_topic, outcome.mutations, messages, pos,
                                         self.settings.changelog_max_bytes,
                                         self.erasure.sample_sealer(p) if self.erasure is not None else None) + messages
                durable = [m for m in messages if m.phase == PHASE_CHANGELOG]
            if self.erasure is not None:
                self.erasure.flush()  # every new key acknowledged before any ciphertext under it is committed
            self._settle()  # the previous batch's phase 1 acknowledged before this batch's phase 0 exists
            seqs = cache.commit_batch(outcome.mutations, durable, outcome.last_offset, generation,
                                      outcome.origin_offsets)
            done.append((p, cache, seqs, messages, outcome.last_offset))
            count_batch(self.stats, p, msgs, outcome)
        self._hook("after_cache_commit")
        assert self._inflight is None  # settled before this batch's sqlite commit; this one's phase 1 by _settle
        self._inflight = (deliver_overlapped(self._producer, [m for _, _, _, msgs, _ in done for m in msgs],
                                             self._after_phase, self._on_acked),
                          [(p, cache, seqs, cache.generation) for p, cache, seqs, _, _ in done], [])
        return {p: last for p, _, _, _, last in done}

    def _settle(self) -> None:
        """Await the last batch's phase 1 (sent while the next batch is polled and judged), then ack its
        outbox and commit its offsets: before the next sqlite commit, when idle, on stop and rebalance."""
        pending, self._inflight = self._inflight, None
        if pending is None:
            return
        acks, done, offsets = pending
        acks.wait()
        self._hook("after_produce")
        for p, cache, seqs, generation in done:
            cache.ack_outbox(seqs)
            self._mark_delivered(p, generation)
        self._hook("after_outbox_ack")
        self._commit(offsets)

    def _after_phase(self, phase: int) -> None:
        if phase == 0:
            self._hook("after_changelog")

    def _deliver(self, messages: Sequence[OutMessage | OutboxRow],
                 after_phase: Callable[[int], None] | None = None) -> None:
        deliver_phases(self._producer, messages, after_phase, self._on_acked)

    def _on_acked(self, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        if self.erasure is not None:  # a delete's (partition, offset) in deltas: when to shred
            self.erasure.delivered(topic, partition, offset, value)
