"""Crypto-shredding in the featurizer: :class:`Erasure` bundles the partitions' keys
(``key_store``), sealing (``sealing``), transit keys (``transit_keys``) and the destruction of a
deleted sample's key once nothing can need it (docs/erasure.md, section 4).

A delete's key is destroyed once the ledger's durable checkpoint floor for the ``deltas``
partition q holding the delete is past its offset o; (q, o) come from the delivery reports of
the sealed deltas messages (:meth:`Erasure.delivered`). Which keys await destruction follows
from durable state alone (live keys whose sample is not cached, or not its newest key): after an
assignment they get the current end of every ``deltas`` partition as a conservative target (the
re-sent outbox of a crashed batch is delivered before it is measured), so a crash only delays a
destruction. :meth:`Erasure.tick`, from the poll loop, asks for the floors at most once per
``UNLEARN_SHRED_EVERY_SECONDS`` (read on the probes' thread, ``probes.Probes``), destroys the
due keys per partition (one key-family rotation for all of them) and checkpoints the cache's WAL
so deleted rows are overwritten on disk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from unlearn.common.checkpoint_record import latest_checkpoint
from unlearn.common.families import state_family, transit_private_family
from unlearn.common.key_ring import READ_IDLE_S, SampleRef
from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.log_position import log_ends, watermarks
from unlearn.runtime.probes import Probes, run_with_consumers
from unlearn.runtime.retry import RetryPolicy
from unlearn.runtime.topic_reader import TopicReadError, read_range
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.delta_codec import SealedRowsEntry, decode_delta
from unlearn.schemas.sealed import (
    SampleKey,
)
from unlearn.streams.featurizer.batch_io import BatchOutcome
from unlearn.streams.featurizer.changelog_records import OpenSample
from unlearn.streams.featurizer.key_store import KeyStore
from unlearn.streams.featurizer.sealing import open_sample_record, sample_sealer, seal_outcome
from unlearn.streams.featurizer.settings import FeaturizerSettings
from unlearn.streams.featurizer.transit_keys import TransitKeys
from unlearn.streams.featurizer.transit_open import TransitGate

__all__ = ["FLOORS", "Erasure", "ledger_floors"]

log = logging.getLogger("unlearn.featurizer.erasure")

FLOORS = "floors"  # the probes' name of the ledger floors' read
_SCAN = 64  # first backward window (records) when looking for a ledger checkpoint


@dataclass
class _Pending:
    partition: int  # key-family (by-head) partition
    targets: dict[int, int]  # deltas partition -> offset the ledger's floor must pass (floor > offset)
    since: float


def ledger_floors(settings: Settings, consumer: Any) -> dict[int, int]:
    """deltas partition -> the floor of its ledger's latest durable checkpoint (absent: none yet),
    from the newest ``ledger-state.p<q>.g<G>`` generation holding a checkpoint record."""
    from confluent_kafka import KafkaException

    fam = state_family(settings.topic_prefix)
    topics = list(consumer.list_topics(timeout=settings.admin_timeout).topics)
    out: dict[int, int] = {}
    for q in sorted({pg[0] for t in topics if (pg := fam.parse(t)) is not None}):
        for g in reversed(fam.generations(topics, q)):
            topic = fam.topic(q, g)
            try:
                low, high = watermarks(consumer, topic, 0, settings.admin_timeout)
                low, high = max(0, int(low)), max(0, int(high))
                start, stop, window = max(low, high - _SCAN), None, _SCAN
                cp = None
                while True:
                    cp = latest_checkpoint(read_range(consumer, topic, 0, start, stop, READ_IDLE_S), q)
                    if cp is not None or start <= low:
                        break
                    stop, window = start, window * 4
                    start = max(low, start - window)
            except (TopicReadError, KafkaException) as exc:  # deleted by a rotation meanwhile: the next read sees it
                log.debug("ledger floor of %d from %s: %s", q, topic, exc)
                cp = None
            if cp is not None:
                out[q] = cp.floor
                break
    return out


class Erasure:
    """Keys, sealing and shredding for one featurizer (module docstring)."""

    def __init__(self, settings: Settings, deltas_topic: str, requests_topic: str = "", by_head_topic: str = "",
                 committed: Callable[[], Mapping[int, int]] | None = None) -> None:
        self.settings = settings
        self.deltas_topic = deltas_topic
        self.keys = KeyStore(settings)
        # transit keys of raw inputs (streams/featurizer/transit_keys.py); committed: the router's offsets
        # (their private halves in a family of their own, sharing this store's producer)
        private = transit_private_family(settings.topic_prefix)
        self.probes = Probes(self._new_consumer, "featurizer-probes")  # the tick's reads, off the poll loop
        self.transit = TransitKeys(settings, KeyStore(settings, private, self.keys), requests_topic,
                                   by_head_topic, probes=self.probes) if committed else None
        self._committed = committed or dict
        self.pending: dict[SampleRef, _Pending] = {}
        self._unchecked: set[int] = set()  # partitions whose orphan keys are not yet pending
        self._floors: dict[int, int] = {}
        self._floors_at = -float("inf")  # when the floors were last asked for
        self._floors_asked = -float("inf")  # when the floors in _floors were asked for (read after)
        self._rotated: dict[int, float] = {}
        self.destroyed = 0

    # ------------------------------------------------------------------ ownership
    def load(self, partition: int) -> None:
        self.keys.load(partition)
        if self.transit is not None:
            self.transit.load(partition)
        self._unchecked.add(partition)

    def drop(self, partition: int) -> None:
        if self.transit is not None:
            self.transit.drop(partition)
        self.keys.drop(partition)
        self._unchecked.discard(partition)
        self.pending = {r: p for r, p in self.pending.items() if p.partition != partition}

    # ------------------------------------------------------------------ sealing
    def seal(self, partition: int, outcome: BatchOutcome, cache: Any = None) -> BatchOutcome:
        """Seal a batch judged against ``cache`` (a ``CacheView`` as it was before the batch)."""
        cached = None if cache is None else (lambda h, s: cache.get_sample(h, s) is not None)
        sealed = seal_outcome(self.keys, partition, outcome, cached)
        self.keys.send()  # the new keys' round trip overlaps the batch's changelog records; flush() waits
        return sealed

    def gate(self, partition: int) -> TransitGate | None:
        """The partition's transit keys, to open sealed inputs (None: no transit keys here)."""
        return self.transit.gate(partition) if self.transit is not None else None

    def sample_sealer(self, partition: int) -> Callable[[str, str, bytes], bytes]:
        return sample_sealer(self.keys, partition)

    def opener(self, partition: int) -> OpenSample:
        def lookup(h: str, s: str, kid: str) -> SampleKey | None:
            gen = self.keys.gens.get(partition)
            return None if gen is None else gen.keys.get((h, s, kid))
        return lambda h, s, raw: open_sample_record(lookup, h, s, raw)

    def flush(self) -> int:
        return self.keys.flush()

    def delivered(self, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        """A message was acknowledged: a sealed delete in ``deltas`` becomes a pending shred with
        its exact (partition, offset)."""
        if topic != self.deltas_topic or not value:
            return
        try:
            delta = decode_delta(value)
        except CodecError:
            return
        for e in delta.entries:
            if isinstance(e, SealedRowsEntry) and e.sign < 0:
                for s, kid in zip(e.sample_ids, e.key_ids, strict=True):
                    ref = (delta.head_id, s, kid)
                    owner = next((p for p, g in self.keys.gens.items() if ref in g.keys), None)
                    if owner is not None:
                        old = self.pending.get(ref)
                        targets = {partition: offset} if old is None else {**old.targets, partition: offset}
                        self.pending[ref] = _Pending(owner, targets, time.monotonic())

    # ------------------------------------------------------------------ shredding
    def _check_orphans(self, caches: Mapping[int, Any]) -> None:
        """Live keys no cached sample uses any more become pending with a conservative target."""
        todo = [p for p in self._unchecked if p in caches]
        if not todo:
            return
        orphans: list[tuple[int, SampleRef]] = []
        for p in todo:
            cache = caches[p]
            for ref in self.keys.live(p):
                h, s, kid = ref
                cur = self.keys.key_of(h, s)
                if ref not in self.pending and (cache.get_sample(h, s) is None or cur is None or cur.key_id != kid):
                    orphans.append((p, ref))
            self._unchecked.discard(p)
        if orphans:
            ends = self._deltas_ends()
            for p, ref in orphans:
                self.pending[ref] = _Pending(p, {q: end - 1 for q, end in ends.items()}, time.monotonic())
            log.info("%d key(s) of deleted samples await destruction (after a restart or takeover)", len(orphans))

    def _new_consumer(self) -> Any:
        """An assign-only reader; every read closes its own (:func:`run_with_consumers`)."""


        return clients.consumer(self.settings, f"{self.settings.topic_prefix}featurizer-shredder",
                                        **{"enable.partition.eof": True, "enable.auto.commit": False})

    def _deltas_ends(self) -> dict[int, int]:
        """One past the true last offset of every deltas partition (read to EOF, not ListOffsets)."""
        def read(make: Callable[[], Any]) -> dict[int, int]:
            c = make()
            md = c.list_topics(timeout=self.settings.admin_timeout).topics.get(self.deltas_topic)
            parts = [(self.deltas_topic, q) for q in sorted(md.partitions if md is not None else [])]
            return {q: end for (_, q), end in log_ends(self.settings, c, parts).items()}
        result: dict[int, int] = RetryPolicy.of(self.settings).call(  # a read: new consumers per try
            "reading the ends of deltas", lambda: run_with_consumers(self._new_consumer, read))
        return result

    def tick(self, caches: Mapping[int, Any], force: bool = False) -> int:
        """Destroy the keys that are due (superseded transit keys: one ``transit-private`` rotation
        per partition; sample keys: one ``subject-keys`` rotation per partition, only when some are
        due); returns how many. Cheap when nothing is pending."""
        self._check_orphans(caches)
        self.keys.retire_due()
        n = 0
        if self.transit is not None:
            self.transit.keys.retire_due()
            positions = {p: c.applied_offset + 1 for p, c in caches.items()}
            transit_due = self.transit.tick(self._new_consumer, self._committed, positions)
            n += sum(self.transit.destroy(p, refs) for p, refs in transit_due.items())
        if not self.pending:
            self.destroyed += n
            return n
        now = time.monotonic()
        every = FeaturizerSettings.of(self.settings).shred_every_seconds
        self._read_floors(now, force)
        due: dict[int, list[SampleRef]] = {}
        for ref, pend in self.pending.items():
            if pend.since <= self._floors_asked and all(self._floors.get(q, 0) > o for q, o in pend.targets.items()):
                due.setdefault(pend.partition, []).append(ref)
        for p, refs in due.items():
            if not force and now - self._rotated.get(p, 0.0) < every:
                continue
            if p not in self.keys.gens:
                continue
            n += self.keys.destroy(p, refs)
            self._rotated[p] = now
            for ref in refs:
                self.pending.pop(ref, None)
            cache = caches.get(p)
            if cache is not None and hasattr(cache, "purge_deleted"):
                cache.purge_deleted()
        self.destroyed += n
        return n

    def _read_floors(self, now: float, force: bool) -> None:
        """Ask for the ledger's floors at most once per ``UNLEARN_SHRED_EVERY_SECONDS`` while
        shreds are pending, and take them a later tick (``force``: read now, on this thread).
        A pending shred counts floors only if they were asked for after it started (``since``):
        a floor cannot pass an offset not yet written, but the rule costs one read at most and
        holds whatever the broker does to the topic."""
        if force:
            self.probes.wait(FLOORS, self.settings.admin_timeout * 4)  # one in flight: not mixed up with this read
            asked = time.monotonic()
            self._floors = run_with_consumers(self._new_consumer, self._floors_read)
            self._floors_at, self._floors_asked = now, asked
            return
        answer = self.probes.take(FLOORS)
        if answer is not None:
            self._floors, self._floors_asked = answer.result(), answer.asked
        if now - self._floors_at >= FeaturizerSettings.of(self.settings).shred_every_seconds and self.probes.ask(
                FLOORS, self._floors_read):
            self._floors_at = now

    def _floors_read(self, make: Callable[[], Any]) -> dict[int, int]:
        """``ledger_floors`` under the worker's retry policy, a new consumer per try, as every other
        broker read here: a metadata request that timed out while a node restarted stopped the
        featurizer (chaos, bench/results/chaos_kafka.md); past the deadline it stops, as they do."""
        floors: dict[int, int] = RetryPolicy.of(self.settings).call(
            "reading the ledger's checkpoint floors", lambda: ledger_floors(self.settings, make()))
        return floors

    def close(self) -> None:
        self.probes.close()
        self.keys.close()  # flushes the producer the transit key store shares
