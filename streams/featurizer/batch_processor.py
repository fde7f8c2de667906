"""The featurizer's micro-batch pipeline: route, judge, seal, commit, deliver, settle.

A base of :class:`streams.featurizer.service.FeaturizerService` (which owns the state declared
here and the poll loop), kept apart so the batch's phases read in one place. Per micro-batch
(size- and time-bounded):

- **routing**: each ``requests`` record is forwarded unchanged to ``<requests>.by-head`` at its
  head's partition (``router.RouterSession``), with headers naming its origin; the requests
  offsets are committed after every forward is acknowledged (at-least-once: the featurizer drops
  re-forwarded copies exactly, ``core.admit_routed``);
- **featurizing** the by-head records, per by-head partition:

1. decide the outcome (``featurize_batch``) against the partition's cache (and seal it, with
   per-sample keys, ``shredder.Erasure``);
2. in ONE sqlite transaction: apply the cache mutations, put the encoded deltas / dead letters /
   rejected receipts into the outbox (with the changelog: only the batch's txn and position,
   ``changelog.batch_records``, which hold them), record the batch's last input offset;
3. produce the outbox rows in two phases, each fully acknowledged: (0) the batch's txn and
   position records on ``featurizer-cache``, (1) the downstream messages and the sample/head
   records, awaited while the next batch is polled and judged (``_settle``); then delete them;
4. commit the input offsets to Kafka (informational for by-head partitions: the cache is
   authoritative; the router's resume point for requests partitions).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from unlearn.infra.head_registry import RegistryView
from unlearn.infra.settings import Settings
from unlearn.streams.featurizer.auth_gate import AuthGate
from unlearn.streams.featurizer.cache import FeatureCache, OutboxRow
from unlearn.streams.featurizer.changelog import PHASE_CHANGELOG, Position, batch_records, delivered_record
from unlearn.streams.featurizer.changelog_store import ChangelogReader
from unlearn.streams.featurizer.core import CoreConfig, Encoder, InMessage, OutMessage, featurize_batch
from unlearn.streams.featurizer.delivery import Acks, deliver_overlapped, deliver_phases
from unlearn.streams.featurizer.heads import with_registry
from unlearn.streams.featurizer.model import FaultHook, ReadyHook, count_batch
from unlearn.streams.featurizer.router import RouterSession, read_origin
from unlearn.streams.featurizer.shredder import Erasure

log = logging.getLogger("unlearn.featurizer")


def record_timestamp_ms(m: Any) -> int | None:
    """A consumed record's timestamp in ms (the producer's CreateTime, which the router forwards
    unchanged; the broker's under LogAppendTime), None when it has none: an add's or delete's
    event time when its request carries no ``ts`` (``tombstones.event_time_us``)."""
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

    kind, ts = m.timestamp()
    return int(ts) if kind != TIMESTAMP_NOT_AVAILABLE and ts >= 0 else None


# the batch whose phase 1 is in flight: its acks, (partition, cache, outbox seqs, generation) per
# partition, and the input offsets to commit once it is acknowledged
Inflight = tuple[Acks, list[tuple[int, FeatureCache, list[int], int]], list[Any]]


class BatchPipeline:
    """The per-batch steps of a featurizer (module docstring); the state they share is set up by
    ``FeaturizerService.__init__`` and ``run``."""

    settings: Settings
    config: CoreConfig
    requests_topic: str
    topic: str
    origin_stream: str
    group: str
    encoder: Encoder
    fault: FaultHook | None
    on_ready: ReadyHook | None
    ready: threading.Event
    stream_dir: str
    caches: dict[int, FeatureCache]
    changelog_topic: str | None
    _reader: ChangelogReader | None
    _pending: list[Any]
    _inflight: Inflight | None
    _fatal: BaseException | None
    _consumer: Any
    _producer: Any
    _router: RouterSession | None
    topic_id: str
    requests_topic_id: str
    route_partitions: int
    registry: RegistryView | None
    auth: AuthGate
    erasure: Erasure | None
    stats: dict[str, int]

    def _hook(self, point: str) -> None:
        if self.fault is not None:
            self.fault(point)

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
                          tuple(m.headers() or ()), record_timestamp_ms(m)))
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
    def _mark_delivered(self, p: int, generation: int) -> None:
        """Tell a future owner generation ``generation`` needs no re-send (best effort, not awaited:
        it rides with the next flush; losing it only costs a duplicate re-send)."""
        if self.changelog_topic is None or generation <= 0:
            return
        m = delivered_record(self.changelog_topic, p, generation)
        with contextlib.suppress(BufferError):
            self._producer.produce(m.topic, value=m.value, key=m.key, partition=m.partition)
