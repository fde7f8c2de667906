"""The featurizer's partition assignment and revocation (the consumer group's rebalance callbacks).

A base of :class:`streams.featurizer.service.FeaturizerService`, on top of the batch pipeline
(it settles the in-flight batch and re-delivers through it). Requests partitions start a router
session; by-head partitions bring their cache up (``changelog.resume_plan``): keep the local
cache if the changelog's last batch is its own (re-produce its leftover outbox), else rebuild it
from the changelog (and finish delivering the changelog's last batch), or upload a local cache
the changelog lacks; then seek the partition to (cache's recorded offset + 1), after checking the
cache belongs to these topics. Re-produced deltas carry the same ``source_id`` as the first copy,
so the ledger skips a duplicate.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from unlearn.infra.log_position import StaleStateError, check_resume, log_bounds
from unlearn.streams.featurizer.batch_pipeline import BatchPipeline
from unlearn.streams.featurizer.cache import FeatureCache
from unlearn.streams.featurizer.changelog import (
    PHASE_CHANGELOG,
    PHASE_OUTPUT,
    FoldedChangelog,
    Position,
    batch_records,
    resume_plan,
    snapshot_mutations,
)
from unlearn.streams.featurizer.changelog_store import ChangelogReader
from unlearn.streams.featurizer.core import OutMessage
from unlearn.streams.featurizer.delivery import outbox_messages
from unlearn.streams.featurizer.model import FeaturizerError, LostCacheError

log = logging.getLogger("unlearn.featurizer")

_STALE_FIX = ("move the data dir away to start over with an empty cache (and a fresh ledger), or point the featurizer "
              "at the broker and topics its cache came from")


class PartitionAssignment(BatchPipeline):
    """``_on_assign`` / ``_on_revoke`` (and ``on_lost``): what a featurizer does when the group
    hands it partitions or takes them away."""

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
                    f"changelog {self.changelog_topic}/{p} belongs to {pos.topic!r}, not {self.topic!r}: "
                    "start over with a fresh ledger, featurizer-cache topic and consumer group")
            cache.replace_all(folded.samples.values(), folded.heads.values(), pos, folded.tombstones.values())
            log.warning("partition %d: feature cache rebuilt from %s (%d samples, %d tombstones, offset %d) in %.2fs",
                        p, self.changelog_topic, len(folded.samples), len(folded.tombstones), pos.applied_offset,
                        time.monotonic() - t0)
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
        msgs = batch_records(p, self.changelog_topic, snapshot_mutations(cache.all_samples(), cache.heads(),
                                                                          cache.all_tombstones()),
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
