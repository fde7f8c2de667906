"""``unlearn featurizer``: requests -> exact deltas (the thin confluent-kafka shell).

All decisions are in :mod:`streams.featurizer.core` (pure) and all durable state in
:mod:`streams.featurizer.cache`; this module moves bytes. Per micro-batch (size- and time-bounded)
and per requests partition (docs/featurizer.md):

1. decide the outcome (``featurize_batch``) against the partition's cache;
2. in ONE sqlite transaction: apply the cache mutations, put the encoded deltas / dead letters /
   rejected receipts and the batch's changelog records (``changelog.batch_records``) into the
   outbox, record the batch's last input offset;
3. produce the outbox rows in two phases, each flushed and fully acknowledged: (0) the batch's
   txn and position records on ``featurizer-cache``, (1) the downstream messages and the
   sample/head records; then delete them;
4. commit the input offsets to Kafka (informational: the cache is authoritative).

On partition assignment (``changelog.resume_plan``): keep the local cache if the changelog's last
batch is its own (re-produce its leftover outbox), else rebuild it from the changelog (and finish
delivering the changelog's last batch), or upload a local cache the changelog lacks; then seek
the partition to (cache's recorded offset + 1). Re-produced deltas carry the same ``source_id``
as the first copy, so the ledger skips a duplicate.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from unlearn.infra.cli_args import add_worker_args, cli_exit_code, log_ready, settings_from_args, setup_logging
from unlearn.infra.log_position import StaleStateError, check_resume, log_bounds, topic_id
from unlearn.infra.profiles import consumer_config, producer_config
from unlearn.infra.settings import Settings
from unlearn.streams.featurizer.cache import FeatureCache, OutboxRow
from unlearn.streams.featurizer.changelog import (
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

__all__ = ["DeliveryError", "FeaturizerError", "FeaturizerService", "LostCacheError", "featurizer_main"]

log = logging.getLogger("unlearn.featurizer")

FaultHook = Callable[[str], None]
"""Test hook, called at "after_cache_commit", "after_changelog" (phase 0 acknowledged, nothing else
sent), "after_produce", "after_outbox_ack" and "after_offset_commit"; raising there simulates a
crash at that point."""

ReadyHook = Callable[[], object]
"""Called once, after the first partition assignment is in place (caches opened, seeks done)."""


class FeaturizerError(RuntimeError):
    """The featurizer cannot go on (the process should exit non-zero and be restarted)."""


class DeliveryError(FeaturizerError):
    """The broker did not acknowledge every outbox message (they stay in the outbox)."""


class LostCacheError(FeaturizerError):
    """A partition's cache (local and changelog) is empty but the group already committed offsets
    for it."""


class FeaturizerService:
    """One featurizer process: a consumer group member on the requests topic.

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
        self.topic = self.config.requests_topic
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
        # stay on its site, and another requests topic need not be co-partitioned with it.
        shared = not federated and self.topic == settings.topic("requests")
        self.changelog_topic: str | None = settings.topic("featurizer-cache") if shared else None
        self._reader = ChangelogReader(settings, self.changelog_topic) if self.changelog_topic else None
        self._pending: list[Any] = []
        self._fatal: BaseException | None = None
        self._consumer: Any = None
        self.topic_id = ""  # the requests topic's id, read at start
        self._producer: Any = None
        self.stats = {"batches": 0, "events": 0, "accepted": 0, "rows": 0, "deadletters": 0, "receipts": 0,
                      "deltas": 0, "replayed": 0}

    # ------------------------------------------------------------------ lifecycle
    def run(self, stop: threading.Event | None = None) -> int:
        """Consume until ``stop`` is set; returns 0 after a clean stop (raises on fatal errors)."""
        from confluent_kafka import Consumer, Producer

        stop = stop or threading.Event()
        self._producer = Producer(producer_config(self.settings, **{"linger.ms": 5}))
        self._consumer = Consumer(consumer_config(self.settings, self.group))
        clean = False
        try:
            self.topic_id = topic_id(self.settings, self.topic)
            self._check_changelog_topic()
            self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                     on_lost=self._on_revoke)
            log.info("featurizer group=%s topic=%s stream=%s federated=%s batch<=%d/%dms",
                     self.group, self.topic, self.config.stream, self.config.federated, self.max_batch, self.max_ms)
            last_report = time.monotonic()
            while not stop.is_set():
                batch = self._poll_batch(stop)
                if batch:
                    self._process(batch)
                if time.monotonic() - last_report > 30:
                    log.info("featurizer stats %s", self.stats)
                    last_report = time.monotonic()
            clean = True
            return 0
        finally:
            try:
                self._consumer.close()  # leaves the group; on_revoke closes the caches
            except Exception as exc:  # closing after a crash: report, do not mask the crash
                log.warning("consumer close: %s", exc)
            if clean:
                self._producer.flush(self.settings.admin_timeout)
            for cache in self.caches.values():
                cache.close()
            self.caches.clear()
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
    def _check_changelog_topic(self) -> None:
        """The changelog must exist (never auto-created) with a partition per requests partition."""
        if self.changelog_topic is None:
            return
        md = self._consumer.list_topics(timeout=self.settings.admin_timeout)  # all topics: never creates one
        cl, req = md.topics.get(self.changelog_topic), md.topics.get(self.topic)
        if cl is None or cl.error is not None:
            raise FeaturizerError(f"changelog topic {self.changelog_topic!r} is missing: run `unlearn topics create`")
        if req is not None and len(cl.partitions) < len(req.partitions):
            raise FeaturizerError(f"changelog topic {self.changelog_topic!r} has {len(cl.partitions)} partitions, "
                                  f"{self.topic!r} has {len(req.partitions)}: they must be co-partitioned")

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        try:
            for tp in partitions:
                p = tp.partition
                cache = self.caches.get(p)
                if cache is None:
                    cache = FeatureCache.open_partition(
                        self.settings.data_dir, self.stream_dir, p,
                        {"topic": self.topic, "client_id": self.config.client_id or ""})
                    self.caches[p] = cache
                if self._reader is None:
                    self._assign_local(consumer, tp, cache)
                else:
                    self._assign_with_changelog(consumer, tp, cache, self._reader)
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

    def _assign_local(self, consumer: Any, tp: Any, cache: FeatureCache) -> None:
        """No changelog (federated site, own requests topic): the local file is the only copy."""
        p = tp.partition
        self._reproduce(p, cache)
        off = cache.applied_offset
        if off < 0:
            self._check_not_lost(consumer, p, f"the feature cache {cache.path} is empty",
                                 "Restore the cache file (or move the partition back to the host that has it)")
        tp.offset = self._resume_offset(consumer, p, cache)
        log.info("partition %d assigned: cache at offset %d, %d samples", p, off, cache.count())

    def _assign_with_changelog(self, consumer: Any, tp: Any, cache: FeatureCache, reader: ChangelogReader) -> None:
        """Local cache vs changelog (``resume_plan``): continue, rebuild, seed or start fresh."""
        p = tp.partition
        latest, delivered = reader.latest_position(p)
        plan = resume_plan(cache.local_position(), latest)
        folded: FoldedChangelog | None = None
        if plan == "rebuild":
            t0 = time.monotonic()
            folded = reader.restore(p)
            pos = folded.position
            if pos is None:
                raise FeaturizerError(f"partition {p}: changelog position vanished while rebuilding")
            if pos.requests_topic != self.topic:
                raise StaleStateError(f"changelog {self.changelog_topic}/{p} belongs to {pos.requests_topic!r}, "
                                      f"not {self.topic!r}")
            cache.replace_all(folded.samples.values(), folded.heads.values(), pos.applied_offset, pos.topic_id,
                              pos.generation)
            log.warning("partition %d: feature cache rebuilt from %s (%d samples, offset %d) in %.2fs", p,
                        self.changelog_topic, len(folded.samples), pos.applied_offset, time.monotonic() - t0)
        off = cache.applied_offset
        if off < 0:
            self._check_not_lost(
                consumer, p, f"both the feature cache {cache.path} and the changelog {self.changelog_topic}/{p} "
                             "are empty", "Restore the cache file or the changelog topic")
        tp.offset = self._resume_offset(consumer, p, cache)
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
        downstream = [OutMessage(r.topic, r.key, r.value) for r in cache.pending_outbox()
                      if r.topic != self.changelog_topic]
        gen = cache.generation + 1
        pos = Position(p, cache.applied_offset, self.topic, cache.topic_id or self.topic_id, cache.lineage, gen, 0, "")
        msgs = batch_records(p, self.changelog_topic, snapshot_mutations(cache.all_samples(), cache.heads()),
                             downstream, pos, self.settings.changelog_max_bytes) + downstream
        seqs = cache.replace_outbox(msgs, gen)
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
            log.warning("partition %d: re-producing %d outbox message(s) left by a crash", p, len(rows))
            self._deliver(rows)
            cache.ack_outbox(r.seq for r in rows)
            self.stats["replayed"] += len(rows)
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

    def _resume_offset(self, consumer: Any, partition: int, cache: FeatureCache) -> int:
        """Where the partition resumes: after the cache's last offset, if the cache belongs to
        this log (same topic incarnation, offset within the log); else StaleStateError."""
        off = cache.applied_offset
        next_offset = off + 1 if off >= 0 else None
        low, end = log_bounds(self.settings, consumer, self.topic, partition, next_offset or 0)
        start = check_resume(
            f"feature cache {cache.path} (partition {partition})", next_offset, cache.topic_id, self.topic_id, low,
            end, "move the data dir away to start over with an empty cache (and a fresh ledger), or point the "
                 "featurizer at the broker and topic its cache came from")
        cache.bind_topic_id(self.topic_id)
        return start

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        gone = {tp.partition for tp in partitions}
        # Not-yet-processed messages of revoked partitions are dropped: the cache offset says they
        # are not applied, so whoever owns the partition next reads them again.
        self._pending = [m for m in self._pending if m.partition() not in gone]
        for p in gone:
            cache = self.caches.pop(p, None)
            if cache is not None:
                cache.close()
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
        from confluent_kafka import TopicPartition

        by_partition: dict[int, list[InMessage]] = {}
        for m in batch:
            p = m.partition()
            cache = self.caches.get(p)
            if cache is None or m.offset() <= cache.applied_offset:
                continue  # revoked meanwhile, or already in the cache (never judged twice)
            by_partition.setdefault(p, []).append(InMessage(p, m.offset(), m.value(), m.key()))
        if not by_partition:
            return
        done: list[tuple[int, FeatureCache, list[int], list[OutMessage], int]] = []
        now = time.time()
        for p, msgs in sorted(by_partition.items()):
            msgs.sort(key=lambda x: x.offset)
            cache = self.caches[p]
            outcome = featurize_batch(msgs, cache, self.config, self.encoder, now=now)
            messages = outcome.messages(self.config)
            generation: int | None = None
            if self.changelog_topic is not None:
                # the changelog records ride in the same sqlite transaction, ahead of the outputs
                generation = cache.generation + 1
                pos = Position(p, outcome.last_offset, self.topic, self.topic_id, cache.lineage, generation, 0, "")
                messages = batch_records(p, self.changelog_topic, outcome.mutations, messages, pos,
                                         self.settings.changelog_max_bytes) + messages
            seqs = cache.commit_batch(outcome.mutations, messages, outcome.last_offset, generation)
            done.append((p, cache, seqs, messages, outcome.last_offset))
            self.stats["events"] += len(msgs)
            self.stats["accepted"] += outcome.accepted
            self.stats["rows"] += outcome.rows
            self.stats["deltas"] += len(outcome.deltas)
            self.stats["deadletters"] += len(outcome.deadletters)
            self.stats["receipts"] += len(outcome.receipts)
            if outcome.deadletters:
                log.info("partition %d offsets %d..%d: dead letters %s", p, msgs[0].offset, outcome.last_offset,
                         outcome.reasons())
        self._hook("after_cache_commit")
        self._deliver([m for _, _, _, msgs, _ in done for m in msgs], after_phase=self._after_phase)
        self._hook("after_produce")
        for p, cache, seqs, _, _ in done:
            cache.ack_outbox(seqs)
            self._mark_delivered(p, cache.generation)
        self._hook("after_outbox_ack")
        offsets = [TopicPartition(self.topic, p, last + 1) for p, _, _, _, last in done]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # e.g. a rebalance in progress; the cache is authoritative
            log.warning("offset commit failed (harmless, the cache has the offsets): %s", exc)
        self.stats["batches"] += 1
        self._hook("after_offset_commit")

    def _after_phase(self, phase: int) -> None:
        if phase == 0:
            self._hook("after_changelog")

    def _deliver(self, messages: Sequence[OutMessage | OutboxRow],
                 after_phase: Callable[[int], None] | None = None) -> None:
        """Produce in order, phase by phase (phase 0, the changelog's txn and position records,
        is flushed and fully acknowledged before phase 1 is sent); raise unless every message
        was acknowledged."""
        for phase in sorted({m.phase for m in messages}):
            self._deliver_phase([m for m in messages if m.phase == phase])
            if after_phase is not None:
                after_phase(phase)

    def _deliver_phase(self, messages: Sequence[OutMessage | OutboxRow]) -> None:
        failures: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(f"{msg.topic()}: {err.str()}")

        for m in messages:
            extra = {} if m.partition is None else {"partition": m.partition}
            while True:
                try:
                    self._producer.produce(m.topic, value=m.value, key=m.key, on_delivery=on_delivery, **extra)
                    break
                except BufferError:
                    self._producer.poll(0.1)
        remaining = self._producer.flush()
        if remaining or failures:
            raise DeliveryError(f"{remaining} message(s) unacknowledged, {len(failures)} failed: {failures[:3]}")


# --------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    """The ``unlearn featurizer`` options: the shared worker options (``add_worker_args``) plus the
    featurizer's own."""
    parser = argparse.ArgumentParser(prog="unlearn featurizer", description=(__doc__ or "").splitlines()[0])
    add_worker_args(parser)
    parser.add_argument("--group", help="consumer group (default: <prefix>featurizer[.<client-id>])")
    parser.add_argument("--federated", action="store_true",
                        help="data-owner site: send only packed exact statistics per micro-batch")
    parser.add_argument("--client-id", help="federated: the one client id this site serves")
    parser.add_argument("--requests-topic", help="full topic name to read (default: <prefix>requests)")
    parser.add_argument("--max-batch", type=int, help="events per micro-batch (default: UNLEARN_BATCH_MAX_EVENTS)")
    parser.add_argument("--max-ms", type=int, help="micro-batch time bound (default: UNLEARN_BATCH_MAX_MS)")
    parser.add_argument("--device", help="auto | cpu | cuda[:N] (default: UNLEARN_DEVICE)")
    return parser


def featurizer_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn featurizer``: run until SIGINT/SIGTERM, then finish the current batch and exit 0.
    Exit 2 for bad arguments, missing topics or an unavailable device (restarting will not help);
    exit 1 for a fatal error at run time (restarting resumes from the cache)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return cli_exit_code(exc)
    setup_logging(args.loglevel)
    stop = threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        # Installed before the startup checks, so a stop request at any point ends cleanly.
        def _on_signal(signum: int, _frame: object) -> None:
            log.info("signal %d: finishing the current batch", signum)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, _on_signal)
    try:
        return _run_cli(args, stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run_cli(args: argparse.Namespace, stop: threading.Event) -> int:
    try:
        settings = settings_from_args(args, device=args.device)
    except ValueError as exc:
        return cli_exit_code(exc)
    try:
        service = FeaturizerService(settings, group=args.group, federated=args.federated, client_id=args.client_id,
                                    requests_topic=args.requests_topic, max_batch=args.max_batch,
                                    max_ms=args.max_ms, device=args.device)
        if service.device not in ("auto", "cpu"):
            from unlearn.features.backbones import resolve_device

            resolve_device(service.device)  # fail now, not on the first text/image request
        from unlearn.infra.topics import wait_for_topics

        # Never subscribe to a missing topic: tansu would auto-create it with 4 partitions.
        c = service.config
        wait_for_topics(settings, [c.requests_topic, c.deltas_topic, c.deadletter_topic, c.receipts_topic,
                                   *([service.changelog_topic] if service.changelog_topic else [])])
    except Exception as exc:  # bad arguments, missing topics, no CUDA: exit 2, a restart will not help
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if stop.is_set():
        return 0
    service.on_ready = lambda: log_ready("featurizer", group=service.group, requests_topic=service.topic,
                                         data_dir=str(settings.data_dir))
    try:
        return service.run(stop)
    except StaleStateError as exc:  # a restart would not help: the operator must decide
        log.error("featurizer stopped: %s", exc)
        return 2
    except Exception as exc:  # fatal: report and exit non-zero (a restart resumes from the cache)
        log.error("featurizer failed: %s", exc, exc_info=True)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(featurizer_main())
