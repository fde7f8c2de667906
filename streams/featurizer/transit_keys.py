"""Transit keys (:class:`TransitKeys`): raw inputs in ``requests`` / ``requests.by-head`` become
unreadable after the featurizer took them over (docs/erasure.md, section 5: epochs, rotation,
and the stages (a), (b), (c) of a superseded epoch's destruction).

Per by-head partition P, owned by the featurizer that owns P, an *epoch* key pair (X25519,
``schemas/sealed.py``) is valid for new requests until ``use_until``.

- **Private half**: in the key family ``transit-private.p<P>.g<G>`` (a :class:`KeyStore`) under
  the record key ``~transit/<created ms>.<use_until ms>/<key id>``; destroyed by that family's
  rotation, which rewrites only the one or two live transit keys.
- **Public half**: on ``<prefix>transit-keys`` (partition P modulo its partition count, record
  key ``p<P>``), acknowledged *after* the private half is durable.
- **Crash safety**: the destruction stages are kept in memory only; the epochs and their
  ``use_until`` are durable in the key family, so after a restart or takeover every superseded
  epoch starts again at stage (a) with targets sampled later: a crash only delays a destruction.
- **Probe cost**: once per tick, the committed offsets are read once and the log ends sampled
  once for every epoch that needs them (the ``requests`` ends for those entering stage (b), the
  by-head ends for those entering (c)), all with one consumer (``runtime.log_position.log_ends``).
  With ``probes`` (``probes.Probes``) those reads run on its background thread: the tick asks for
  them once (a)/(b) hold and applies the answer on a later tick, so a reading is always sampled
  after the condition it serves; rotations and destruction stay on the tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from unlearn.common.key_ring import TRANSIT_HEAD, SampleRef
from unlearn.infra.settings import ErasureSettings, Settings
from unlearn.runtime import clients
from unlearn.runtime.log_position import log_ends
from unlearn.runtime.probes import Probes
from unlearn.runtime.retry import RetryPolicy
from unlearn.runtime.topic_reader import TopicReadError
from unlearn.runtime.topics import TopicError, ensure_topic
from unlearn.schemas.sealed import SampleKey
from unlearn.schemas.transit import TransitKeyPair, TransitPublicKey, encode_public_record, new_transit_key
from unlearn.streams.featurizer.delivery import produce_acked
from unlearn.streams.featurizer.featurizer_errors import KeyStoreError
from unlearn.streams.featurizer.key_store import KeyStore
from unlearn.streams.featurizer.settings import FeaturizerSettings
from unlearn.streams.featurizer.transit_open import DerivedKeys, TransitGate

__all__ = [
    "PROBE",
    "TRANSIT_HEAD",
    "Epoch",
    "TransitKeys",
    "group_committed",
    "is_transit_ref",
    "router_committed",
]

log = logging.getLogger("unlearn.featurizer.erasure")

def is_transit_ref(ref: SampleRef) -> bool:
    """Whether a key-family reference is a transit key (not a sample key)."""
    return ref[0] == TRANSIT_HEAD


@dataclass(frozen=True)
class Epoch:
    """One transit key of one partition."""

    partition: int
    pair: TransitKeyPair
    created: float
    use_until: float

    @property
    def ref(self) -> SampleRef:
        return TRANSIT_HEAD, f"{round(self.created * 1000)}.{round(self.use_until * 1000)}", self.pair.key_id

    @property
    def public(self) -> TransitPublicKey:
        return TransitPublicKey(self.partition, self.pair.key_id, self.pair.public_key, self.created, self.use_until)

    @classmethod
    def from_ref(cls, partition: int, ref: SampleRef, key: SampleKey) -> Epoch | None:
        """The epoch a key-family record stores (None: not a transit key, or unreadable)."""
        if not is_transit_ref(ref):
            return None
        try:
            created, until = (int(x) / 1000 for x in ref[1].split("."))
        except ValueError:
            log.warning("unreadable transit key record %r skipped", ref)
            return None
        return cls(partition, TransitKeyPair(key.key_id, key.key), created, until)


@dataclass
class _Stage:
    """Where a superseded epoch's destruction stands: waiting for the router to reach ``targets``
    (requests partition -> end sampled after the grace), then for this featurizer to reach
    ``by_head`` on the epoch's partition."""

    targets: dict[int, int]
    by_head: int | None = None


@dataclass(frozen=True)
class _Plan:
    to_b: tuple[Epoch, ...]  # entering (b): the requests ends to sample
    at_b: tuple[tuple[Epoch, _Stage], ...]  # waiting on (b): the committed offsets to read


@dataclass(frozen=True)
class _Reading:
    to_b: tuple[tuple[Epoch, dict[int, int]], ...]  # epoch, requests ends sampled after (a)
    to_c: tuple[tuple[Epoch, _Stage, int], ...]  # (b) met: epoch, its stage, by-head end sampled after


PROBE = "transit"  # the probes' name of the stages' reads


@dataclass
class TransitKeys:
    """The transit keys of the partitions this featurizer owns (module docstring). ``keys``: the
    store of the ``transit-private`` family."""

    settings: Settings
    keys: KeyStore
    requests_topic: str
    by_head_topic: str
    epochs: dict[int, dict[str, Epoch]] = field(default_factory=dict)
    destroyed: dict[int, set[str]] = field(default_factory=dict)
    stages: dict[SampleRef, _Stage] = field(default_factory=dict)
    clock: Callable[[], float] = time.time
    derived: DerivedKeys = field(default_factory=DerivedKeys)  # AES keys per (key id, producer epk)
    probes: Probes | None = None  # the reads run off the poll loop (runtime/probes.py)
    _advanced_at: float = 0.0

    @property
    def topic(self) -> str:
        return self.settings.topic("transit-keys")

    # ------------------------------------------------------------------ ownership
    def load(self, partition: int) -> None:
        """Partition taken over: its epochs from the ``transit-private`` family; the current one's
        public half published again (a crash may have cut the first publication) or a new epoch
        started."""
        self.keys.load(partition)
        gen = self.keys.gens[partition]
        eps = [e for ref, k in gen.keys.items() if (e := Epoch.from_ref(partition, ref, k)) is not None]
        self.epochs[partition] = {e.pair.key_id: e for e in eps}
        self.destroyed.setdefault(partition, set())
        current = max(eps, key=lambda e: e.use_until, default=None)
        if current is None or current.use_until - self._lead() <= self.clock():
            self.rotate(partition)
        else:
            self._publish(current)
        log.info("transit keys of partition %d: %d epoch(s)", partition, len(self.epochs[partition]))

    def drop(self, partition: int) -> None:
        """Partition revoked: forget its epochs and the AES keys derived from them (the next owner
        loads them from the key family)."""
        eps = self.epochs.pop(partition, {})
        for e in eps.values():
            self.stages.pop(e.ref, None)
        self.derived.drop(eps)
        self.keys.drop(partition)

    # ------------------------------------------------------------------ keys
    def lookup(self, partition: int, key_id: str) -> TransitKeyPair | None:
        """The key pair of ``key_id`` if this partition holds it."""
        e = self.epochs.get(partition, {}).get(key_id)
        return None if e is None else e.pair

    def gate(self, partition: int) -> TransitGate:
        """What featurizing a batch of ``partition`` needs to open its sealed inputs."""
        return TransitGate(lambda kid: self.lookup(partition, kid), lambda kid: self.was_destroyed(partition, kid),
                           self.derived)

    def was_destroyed(self, partition: int, key_id: str) -> bool:
        """Whether this featurizer destroyed ``key_id`` of ``partition`` (since it took it over)."""
        return key_id in self.destroyed.get(partition, set())

    def _lead(self) -> float:
        # the next epoch is published this long before the current one's use_until: at least 2 s
        # (rotate >= 4 s), more than the SDK's 1 s margin, so a producer always finds a valid key
        return min(5.0, FeaturizerSettings.of(self.settings).transit_rotate_seconds / 2)

    def rotate(self, partition: int) -> Epoch:
        """Start a new epoch: the private half made durable in the key family first, then the
        public half published (both acknowledged; KeyStoreError if not)."""
        now = self.clock()
        until = now + FeaturizerSettings.of(self.settings).transit_rotate_seconds
        epoch = Epoch(partition, new_transit_key(), round(now * 1000) / 1000, round(until * 1000) / 1000)
        self.keys.put(partition, epoch.ref, SampleKey(epoch.pair.key_id, epoch.pair.private_key))
        self.keys.flush()
        self.epochs.setdefault(partition, {})[epoch.pair.key_id] = epoch
        self._publish(epoch)
        log.info("transit key %s of partition %d: use until %.3f", epoch.pair.key_id, partition, epoch.use_until)
        return epoch

    def _publish(self, epoch: Epoch) -> None:
        # every topic listed, none named: naming one may auto-create it on some brokers
        md = self.keys.topics.call("listing topics", lambda: self.keys.topics.admin().list_topics(
            timeout=self.settings.admin_timeout)).topics.get(self.topic)
        n = len(md.partitions) if md is not None and md.error is None and md.partitions else 0
        if n == 0:  # missing (not made by `unlearn topics create`): created like the by-head topic
            try:
                n = self.settings.partitions
                ensure_topic(self.settings, self.topic, partitions=n, compacted=True, admin=self.keys.topics.admin())
            except TopicError as exc:
                raise KeyStoreError(str(exc)) from None
        produce_acked(self.keys.producer, [{"topic": self.topic, "key": f"p{epoch.partition}".encode(),
                                            "value": encode_public_record(epoch.public),
                                            "partition": epoch.partition % n}],
                      timeout=RetryPolicy.of(self.settings).deadline_s, error=KeyStoreError)

    # ------------------------------------------------------------------ rotation and destruction
    def tick(self, consumer: Callable[[], Any], committed: Callable[[], Mapping[int, int]],
             positions: Mapping[int, int]) -> dict[int, list[SampleRef]]:
        """Start new epochs that are due; return, per partition, the superseded epochs whose key
        may be destroyed now (stages advanced at most once per ``UNLEARN_SHRED_EVERY_SECONDS``).
        ``consumer``: makes the assign-only reader (``enable.partition.eof``) that samples log ends
        (with ``probes`` set, the reads run on its thread with its consumers instead, and their
        answer is applied on a later tick); ``committed``: the router's committed offset per
        requests partition; ``positions``: per owned by-head partition, one past the last offset
        durably judged."""
        now = self.clock()
        advance = now - self._advanced_at >= max(0.2, FeaturizerSettings.of(self.settings).shred_every_seconds)
        ready: list[Epoch] = []
        for p, eps in list(self.epochs.items()):
            newest = max(eps.values(), key=lambda e: e.use_until, default=None)
            if newest is None or newest.use_until - self._lead() <= now:
                newest = self.rotate(p)
            ready += [e for e in eps.values() if advance and e is not newest
                      and e.use_until + ErasureSettings.of(self.settings).transit_grace_seconds <= now]
        if self.probes is None:
            if not ready:
                return {}
            self._advanced_at = now
            plan = self._plan(ready)
            self._apply_read(lambda: self._read_retried(consumer, committed, plan))
            return self._due(positions)
        answer = self.probes.take(PROBE)
        if answer is not None:
            self._apply_read(answer.result)
        if ready and not self.probes.busy(PROBE):
            self._advanced_at = now
            plan = self._plan(ready)
            if plan.to_b or plan.at_b:  # asked now, so sampled after (a) / (b) held
                self.probes.ask(PROBE, lambda make: self._read_retried(make, committed, plan))
        return self._due(positions) if ready or answer is not None else {}

    def _plan(self, ready: list[Epoch]) -> _Plan:
        """What one step of the stages must read: ``requests`` ends for the epochs entering (b),
        the committed offsets for those waiting on (b)."""
        to_b = tuple(e for e in ready if e.ref not in self.stages)  # (a) met: every record carrying it is below
        at_b = tuple((e, st) for e in ready if (st := self.stages.get(e.ref)) is not None and st.by_head is None)
        return _Plan(to_b, at_b)

    def _read_retried(self, consumer: Callable[[], Any], committed: Callable[[], Mapping[int, int]],
                      plan: _Plan) -> _Reading:
        """``_read`` under the worker's retry policy (a new consumer per try): a request that times
        out while a node restarts is asked again, not fatal (chaos: the ledger floors' read,
        streams/featurizer/erasure.py)."""
        reading: _Reading = RetryPolicy.of(self.settings).call(
            "reading the log ends for transit keys", lambda: self._read(consumer, committed, plan))
        return reading

    def _read(self, consumer: Callable[[], Any], committed: Callable[[], Mapping[int, int]], plan: _Plan) -> _Reading:
        """The reads of one step (no state changed: it may run on the probes' thread). The
        committed offsets are read once, and the log ends sampled once for all epochs that need
        them: ``requests`` for those entering (b), by-head for those entering (c) (sampled after
        (b) is met: the committed offsets are read first)."""
        done = committed() if plan.at_b else {}
        to_c = [(e, st) for e, st in plan.at_b if all(done.get(q, 0) >= end for q, end in st.targets.items())]
        ends = self._ends(consumer, bool(plan.to_b), {e.partition for e, _ in to_c})
        requests = {q: end for (t, q), end in ends.items() if t == self.requests_topic}
        return _Reading(tuple((e, requests) for e in plan.to_b),
                        tuple((e, st, ends[(self.by_head_topic, e.partition)]) for e, st in to_c))

    def _apply_read(self, read: Callable[[], _Reading]) -> None:
        """Apply a reading. One that failed (a broker hiccup: a Kafka node lost, its partitions'
        leaders moving) leaves the stages as they were, to be asked again at a later tick: a key's
        destruction waits, it is never early."""
        from confluent_kafka import KafkaException

        try:
            reading = read()
        except (KafkaException, TopicReadError) as exc:
            log.warning("transit key stages: reading log ends failed (%s); asking again later", exc)
            return
        self._apply(reading)

    def _apply(self, reading: _Reading) -> None:
        """Advance the stages by a reading, skipping epochs destroyed or dropped since it was asked
        (a re-loaded partition's stages start again: their ``_Stage`` objects are new)."""
        for e, targets in reading.to_b:
            if e.pair.key_id in self.epochs.get(e.partition, {}) and e.ref not in self.stages:
                self.stages[e.ref] = _Stage(targets)
        for e, st, end in reading.to_c:
            if self.stages.get(e.ref) is st and st.by_head is None:
                st.by_head = end

    def _due(self, positions: Mapping[int, int]) -> dict[int, list[SampleRef]]:
        """Per partition, the epochs past (c): this featurizer's position reached the by-head end."""
        due: dict[int, list[SampleRef]] = {}
        for p, eps in self.epochs.items():
            for e in eps.values():
                st = self.stages.get(e.ref)
                if st is not None and st.by_head is not None and positions.get(p, 0) >= st.by_head:  # (c)
                    due.setdefault(p, []).append(e.ref)
        return due

    def _ends(self, make: Callable[[], Any], requests: bool, by_head: set[int]) -> dict[tuple[str, int], int]:
        """One past the true last offset of every ``requests`` partition (if ``requests``) and of
        the ``by_head`` partitions, read to EOF with one consumer (``log_position.log_ends``)."""
        if not requests and not by_head:
            return {}
        consumer = make()
        parts = [(self.by_head_topic, q) for q in sorted(by_head)]
        if requests:
            md = consumer.list_topics(timeout=self.settings.admin_timeout).topics.get(self.requests_topic)
            parts += [(self.requests_topic, q) for q in sorted(md.partitions if md is not None and md.error is None
                                                                else [])]
        return log_ends(self.settings, consumer, parts)

    def destroy(self, partition: int, refs: list[SampleRef]) -> int:
        """Destroy superseded epochs ``refs`` (from :meth:`tick`): one ``transit-private``
        rotation of the partition, then forget them. Returns how many keys were destroyed."""
        if partition not in self.keys.gens:
            return 0
        n = self.keys.destroy(partition, refs)
        self.forget(partition, refs)
        return n

    def forget(self, partition: int, refs: list[SampleRef]) -> None:
        """The key family destroyed ``refs``: forget the epochs and every AES key derived from them
        (no derived key outlives its private key), remember their ids."""
        self.derived.drop(ref[2] for ref in refs)
        for ref in refs:
            e = self.epochs.get(partition, {}).pop(ref[2], None)
            self.stages.pop(ref, None)
            if e is not None:
                self.destroyed.setdefault(partition, set()).add(ref[2])
                log.info("transit key %s of partition %d destroyed", ref[2], partition)


def router_committed(consumer: Any, topic: str, partitions: int, timeout: float) -> dict[int, int]:
    """The featurizer group's committed offset (the router's resume point) per ``requests``
    partition; 0 where none is committed; empty when the broker does not answer (the caller waits)."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        tps = consumer.committed([TopicPartition(topic, q) for q in range(partitions)], timeout=timeout)
    except KafkaException as exc:
        log.debug("committed offsets of %s: %s", topic, exc)
        return {}
    return {tp.partition: max(0, int(tp.offset)) for tp in tps if tp.error is None}


def group_committed(settings: Settings, group: str, topic: str, partitions: int) -> dict[int, int]:
    """:func:`router_committed` of ``group`` read with a consumer of its own, closed after: the
    shred tick's reads run on the probes' thread, never with the poll loop's consumer (it only
    fetches offsets; it never subscribes, so it never joins the group)."""


    consumer = clients.consumer(settings, group, **{"enable.auto.commit": False})
    try:
        return router_committed(consumer, topic, partitions, settings.admin_timeout)
    finally:
        consumer.close()
