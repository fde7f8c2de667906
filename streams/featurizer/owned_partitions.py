"""The by-head partitions one featurizer owns: their feature caches and key stores, brought up on
assignment and dropped on revocation (the consumer group's rebalances).

A by-head partition's cache comes up by ``changelog_restore.resume_plan``: keep the local cache if
the changelog's last batch is its own (re-produce its leftover outbox), else rebuild it from the
changelog (and finish delivering the changelog's last batch), or upload a local cache the
changelog lacks; then the partition is sought to (cache's recorded offset + 1), after checking
the cache belongs to these topics. Re-produced deltas carry the same ``source_id`` as the first
copy, so the ledger skips a duplicate.

**Broker faults** (``runtime.retry``, docs/featurizer.md): every read of assignment (the changelog's
position and restore, committed offsets, log bounds) and the deliveries run under the one retry
policy; each is a read, or a re-send the outbox and the ledger's source ids make harmless, so
asking again is safe. Offset commits stay as they are (recovery never reads them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from unlearn.infra.settings import Settings
from unlearn.runtime.log_position import StaleStateError, check_resume, log_bounds
from unlearn.runtime.retry import RetryPolicy
from unlearn.streams.featurizer.batch_io import OutMessage
from unlearn.streams.featurizer.changelog_batches import batch_records, snapshot_mutations
from unlearn.streams.featurizer.changelog_reader import ChangelogReader
from unlearn.streams.featurizer.changelog_records import PHASE_CHANGELOG, PHASE_OUTPUT, Position
from unlearn.streams.featurizer.changelog_restore import FoldedChangelog, resume_plan
from unlearn.streams.featurizer.delivery import Delivery, outbox_messages
from unlearn.streams.featurizer.erasure import Erasure
from unlearn.streams.featurizer.feature_cache import FeatureCache
from unlearn.streams.featurizer.featurizer_errors import FeaturizerError, LostCacheError
from unlearn.streams.featurizer.service_types import Topics

__all__ = ["Partitions"]

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
                    synchronous="FULL" if self._reader is None else "NORMAL", background_checkpoints=True)
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
                       cache.route_partitions, tuple(cache.ahead_offsets()))
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
