"""The featurizer's side of erasure (docs/erasure.md): the keys it seals under, sealing, destroying
keys once nothing needs them, transit keys, and deleting raw inputs it has taken over.

**Keys (KeyStore)**: the featurizer's per-sample data keys: the ``subject-keys`` family partitions it owns.

The same class keeps the private transit keys in their own family (``transit-private``,
:class:`TransitKeys` below): one rotation code for both, each family rotated on its own.

Partition P of the key family belongs to whoever owns partition P of the by-head topic (the same
ownership as the feature cache partition). Every accepted add gets a fresh key (a new key id, even
for a sample re-added after its erasure); its delete is sealed under the same key. New keys are
produced and acknowledged (:meth:`KeyStore.flush`) before the batch that uses them is committed,
so no ciphertext can exist under a key that was never durable. Destroying keys
(:meth:`KeyStore.destroy`) drops them from memory and writes tombstones. Where the broker compacts
(``BrokerQuirks.compaction_runs``: Apache Kafka) that is all: the generation topic is compacted
(``infra.settings.topic_config``), and once ``UNLEARN_SEGMENT_MS`` has passed the store appends a
completion record again, which rolls the segment holding the tombstones so the cleaner removes the
destroyed keys' records (docs/erasure.md section 4, deadline). Where it does not (tansu), the
partition is rotated to a new generation without them; the old generation topic is deleted after
the grace period (``UNLEARN_KEYS_RETIRE_SECONDS``), so a reader has time to move off it. Reading:
``infra.between_stages``.

**Sealing**: sealing a featurizer batch's outputs under per-sample keys (docs/erasure.md).

The core decides in plaintext (``core.featurize_batch``); before its outputs are committed to the
outbox the service runs :func:`seal_outcome`: every add row gets a fresh key from the partition's
:class:`KeyStore` and every ROWS entry of a ``deltas`` message becomes a
SEALED entry (``schemas.sealed``). A delete is sealed under the key its add used, so both
carry the same commitment. :func:`sample_sealer` seals the changelog's sample records
(``cache.encode_sample``) under the same key.

**Shredding (Erasure)**: crypto-shredding in the featurizer: when a deleted sample's key may be destroyed, and doing it.

``Erasure`` bundles what the featurizer service needs (docs/erasure.md):

- the partitions' keys (:class:`KeyStore`): loaded on assignment,
  dropped on revocation; sealing a batch (:meth:`Erasure.seal`) and the changelog's sample
  records (:meth:`Erasure.sample_sealer` / :meth:`Erasure.opener`);
- **pending shreds**: a delete's key is destroyed only once the ledger can never need it again,
  i.e. once the ledger's durable checkpoint floor for the ``deltas`` partition q that holds the
  delete is past the delete's offset o (docs/design.md section 4: a ledger recovers from its
  checkpoint and re-reads only offsets at or above the floor). (q, o) come from the delivery
  reports of the sealed deltas messages (:meth:`Erasure.delivered`).
- **crash safety without a separate record**: which keys are waiting for destruction follows
  from durable state alone: every live key whose sample is not in the feature cache (deleted, or
  a key made for a batch that never committed), or is no longer the sample's newest key. After an
  assignment those keys get a conservative target: the current end of every ``deltas``
  partition (the re-sent outbox of a crashed batch is delivered before it is measured), so a
  crash anywhere between a delete and its key's destruction only delays the destruction;
- :meth:`Erasure.tick`, from the poll loop: asks for the ledger's floors (at most once per
  ``UNLEARN_SHRED_EVERY_SECONDS``, read on the probes' thread, ``Probes``, and taken a later
  tick), destroys the due keys per partition (one key-family rotation for all of them, on the
  poll loop) and checkpoints the cache's WAL so deleted rows are overwritten on disk.

**Probes**: the shred tick's broker reads, off the featurizer's poll loop (docs/erasure.md section 4).

Reading the ledger's checkpoint floors, log ends and committed offsets takes broker round trips;
on the poll loop they would stall every request judged meanwhile (bench/results/
pipeline_bench.md section 14). The tick instead *asks* for a read (:meth:`Probes.ask`) and takes
its answer on a later tick (:meth:`Probes.take`); one background thread runs the reads, each with
consumers of its own (never the poll loop's), closed when the read returns.

**Sampled after the condition**: a read starts only after it was asked, and the tick asks only
once the condition it needs holds (an epoch's grace is over, a pending shred exists), so an
answer is always sampled after its condition started: no snapshot taken before is ever used.
:class:`Answer` keeps ``asked`` and ``started`` (``started >= asked``) to make that checkable.
What the answer leads to (destroying keys, rotating key families) stays on the poll loop.

**Trimming raw inputs (Trimmer)**: deleting raw inputs the featurizer has durably taken over
(DeleteRecords), where the broker can.

``requests`` and ``requests.by-head`` hold upstream raw inputs: plaintext from any producer that
does not seal for transit. Once the featurizer group has committed an offset on a partition, every
record below it is durably elsewhere (a ``requests`` offset is committed only after its forward to
by-head is acknowledged; a by-head offset only after the batch's changelog records and outputs
are), so nothing needs it again. Where the broker supports DeleteRecords
(``BrokerQuirks.delete_records``), this moves each partition's log start to the lowest offset
that **every** consumer group of the deployment (groups under the topic prefix, e.g. a federated
featurizer's ``featurizer.<client>``) has committed there, at most once per
``UNLEARN_TRIM_EVERY_SECONDS``. A partition this featurizer's own group never committed on is
left alone.

Off the poll loop: the poll loop offers its assignment when a trim is due (:meth:`Trimmer.offer`);
one background thread lists the groups' offsets and deletes. A failed trim is logged and retried
on the next period (it delays erasure, never correctness). docs/erasure.md section 5.

**Transit keys (TransitKeys)**: raw inputs in ``requests`` / ``requests.by-head`` become
unreadable after the featurizer took them over (docs/erasure.md section 5).

Per by-head partition P, owned by the featurizer that owns P (the same ownership as its key-family
partition and cache), an *epoch* key pair (X25519, ``schemas/sealed.py``) is valid for new
requests until ``use_until``; a new epoch starts every ``UNLEARN_TRANSIT_ROTATE_SECONDS`` (shortly
before the current one's ``use_until``, so a producer always finds a valid key).

- **Private half**: in its own key family ``transit-private.p<P>.g<G>`` (``infra/between_stages``,
  written by a :class:`KeyStore` like the sample keys' ``subject-keys``) under the record key
  ``~transit/<created ms>.<use_until ms>/<key id>``. It moves with the partition's ownership, and
  is destroyed by that family's rotation (``KeyStore.destroy``), which rewrites only the one or two
  live transit keys: the sample key family rotates only when sample keys are due.
- **Public half**: on ``<prefix>transit-keys`` (partition P modulo its partition count, record
  key ``p<P>``), acknowledged *after* the private half is durable (:func:`publish`).
- **Destruction** of a superseded epoch, in stages (:meth:`TransitKeys.due`): (a) wall time is
  past ``use_until + UNLEARN_TRANSIT_GRACE_SECONDS`` (no producer starts sending under it after
  ``use_until``; the SDK's delivery timeout is below the grace); then (b) the true end of every
  ``requests`` partition is sampled, and the router's committed offsets (the featurizer group's)
  must reach it: every record that could carry the key is routed; then (c) the end of by-head P
  is sampled, and this featurizer's durable position on P (its cache's applied offset) must reach
  it: every such record is judged, and its features are in the (sealed) system stores. Then the
  key goes in the partition's next ``transit-private`` rotation.
- **Crash safety**: the stages are kept in memory only. Which epochs exist, and their
  ``use_until``, are in the key family (durable): after a restart or takeover, every superseded
  epoch starts again at stage (a), with targets sampled later than before. A crash only delays a
  destruction, it never loses a key that a record still needs.
- **Probe cost**: once per tick, the committed offsets are read once and the log ends sampled
  once for every epoch that needs them (the ``requests`` ends for those entering stage (b), the
  by-head ends for those entering (c)), all with one consumer (``infra.log_position.log_ends``).
  With ``probes`` (the featurizer's), those reads run on its background thread: the tick asks for
  them once (a)/(b) hold and applies the answer on a later tick (**Probes** above), so a reading is
  always sampled after the condition it serves; rotations and destruction stay on the tick.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from unlearn.infra.between_stages import (
    COMPLETE_KEY,
    READ_IDLE_S,
    TRANSIT_HEAD,
    KeyGeneration,
    SampleRef,
    TopicFamily,
    key_record_key,
    keys_family,
    latest_checkpoint,
    read_partition_keys,
    state_family,
    transit_private_family,
)
from unlearn.infra.log_position import log_ends, watermarks
from unlearn.infra.retry import BrokerUnavailable, RetryPolicy, is_retriable, kafka_error
from unlearn.infra.settings import ErasureSettings, Settings, admin_config, consumer_config, producer_config, quirks
from unlearn.infra.topic_reader import TopicReadError, read_range
from unlearn.infra.topics import TopicError, delete_records, delete_topics, ensure_topic, key_family_config
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.deadletter import DeadLetter
from unlearn.schemas.delta_codec import RowsEntry, SealedRowsEntry, decode_delta
from unlearn.schemas.sealed import (
    PURPOSE_CHANGELOG,
    PURPOSE_DEADLETTER,
    SampleKey,
    SealError,
    encode_key_record,
    new_key,
    seal,
    seal_delta,
    unseal,
)
from unlearn.schemas.transit import TransitKeyPair, TransitPublicKey, encode_public_record, new_transit_key
from unlearn.streams.featurizer.batch_io import BatchOutcome
from unlearn.streams.featurizer.changelog_records import OpenSample
from unlearn.streams.featurizer.delivery import Acks, produce_acked
from unlearn.streams.featurizer.featurizer_errors import KeyStoreError
from unlearn.streams.featurizer.settings import FeaturizerSettings
from unlearn.streams.featurizer.transit_open import DerivedKeys, TransitGate

__all__ = [
    "TRANSIT_HEAD",
    "Epoch",
    "TransitKeys",
    "group_committed",
    "is_transit_ref",
    "router_committed",
    "KeyStore",
    "Answer",
    "Job",
    "Probes",
    "run_with_consumers",
    "SEALED_SAMPLE_MAGIC",
    "open_sample_record",
    "sample_sealer",
    "seal_deadletter",
    "seal_outcome",
    "sealed_sample_record",
    "Erasure",
    "ledger_floors",
    "Trimmer",
    "trim_bounds",
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
    probes: Probes | None = None  # the reads run off the poll loop (streams/featurizer/erasure.py)
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
        md = RetryPolicy.of(self.settings).call("listing topics", lambda: self.keys.admin.list_topics(
            timeout=self.settings.admin_timeout)).topics.get(self.topic)
        n = len(md.partitions) if md is not None and md.error is None and md.partitions else 0
        if n == 0:  # missing (not made by `unlearn topics create`): created like the by-head topic
            try:
                n = self.settings.partitions
                ensure_topic(self.settings, self.topic, partitions=n, compacted=True, admin=self.keys.admin)
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
            self._apply_read(lambda: self._read(consumer, committed, self._plan(ready)))
            return self._due(positions)
        answer = self.probes.take(PROBE)
        if answer is not None:
            self._apply_read(answer.result)
        if ready and not self.probes.busy(PROBE):
            self._advanced_at = now
            plan = self._plan(ready)
            if plan.to_b or plan.at_b:  # asked now, so sampled after (a) / (b) held
                self.probes.ask(PROBE, lambda make: self._read(make, committed, plan))
        return self._due(positions) if ready or answer is not None else {}

    def _plan(self, ready: list[Epoch]) -> _Plan:
        """What one step of the stages must read: ``requests`` ends for the epochs entering (b),
        the committed offsets for those waiting on (b)."""
        to_b = tuple(e for e in ready if e.ref not in self.stages)  # (a) met: every record carrying it is below
        at_b = tuple((e, st) for e in ready if (st := self.stages.get(e.ref)) is not None and st.by_head is None)
        return _Plan(to_b, at_b)

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
    from confluent_kafka import Consumer

    from unlearn.infra.settings import consumer_config

    consumer = Consumer(consumer_config(settings, group, **{"enable.auto.commit": False}))
    try:
        return router_committed(consumer, topic, partitions, settings.admin_timeout)
    finally:
        consumer.close()


class KeyStore:
    """Keys of the by-head partitions this featurizer owns, in one key family (default: the
    sample keys' ``subject-keys``). ``share``: a key store whose producer and admin client this one
    uses (one set of librdkafka threads for both families)."""

    def __init__(self, settings: Settings, family: TopicFamily | None = None, share: KeyStore | None = None) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient

        self.settings = settings
        self.family = family or keys_family(settings.topic_prefix)
        self.gens: dict[int, KeyGeneration] = {}
        self.next_gen: dict[int, int] = {}  # partition -> next generation to write (above every existing one)
        self.current: dict[tuple[str, str], SampleKey] = {}  # (head, sample) -> its newest key
        self._staged: list[tuple[str, bytes, bytes | None]] = []  # (topic, record key, value)
        self._sending: Acks | None = None  # keys produced by send(), awaited by flush()
        self.retiring: list[tuple[float, list[str]]] = []
        # compaction instead of rotation (module docstring): topic -> when to append the record that
        # rolls its tombstones' segment, and when its newest tombstone was written
        self.compacts = quirks(settings).compaction_runs
        self.rolls: dict[str, float] = {}
        self._tombstoned: dict[str, float] = {}
        self.producer: Any = share.producer if share else Producer(producer_config(self.settings, **{"linger.ms": 0}))
        self.admin: Any = share.admin if share else AdminClient(admin_config(self.settings))

    # ------------------------------------------------------------------ ownership
    def load(self, partition: int) -> None:
        """Take partition ``partition`` over: read its newest complete generation (creating
        generation 0 if there is none); newer incomplete ones are deleted after the grace period."""
        def read() -> tuple[list[str], KeyGeneration | None]:  # listing and reading again together, a new reader
            names = list(self.admin.list_topics(timeout=self.settings.admin_timeout).topics)
            return names, read_partition_keys(self.settings, self.family, names, partition, role="featurizer")
        topics, gen = RetryPolicy.of(self.settings).call(f"reading the keys of partition {partition}", read)
        if gen is None:
            topic = self.family.topic(partition, 0)
            self._ensure(topic)
            gen = KeyGeneration(partition, 0, topic, complete=True)
            self._produce_acked([(topic, COMPLETE_KEY, b"1")])
        existing = self.family.generations(topics, partition)
        # never reuse a number: an incomplete newer generation (a crashed rotation) is being retired
        self.next_gen[partition] = max([gen.generation, *existing]) + 1
        stale = [self.family.topic(partition, g) for g in existing if g != gen.generation]
        if stale:
            self.retiring.append((time.monotonic() + ErasureSettings.of(self.settings).keys_retire_seconds, stale))
        self.gens[partition] = gen
        if self.compacts:  # a crashed owner may have left tombstones in the active segment
            self._schedule_roll(gen.topic)
        for (h, s, _), key in gen.keys.items():
            self.current[(h, s)] = key  # log order: the newest key of a sample wins
        log.info("%s partition %d: generation %d, %d live keys", self.family.name, partition, gen.generation,
                 len(gen.keys))

    def drop(self, partition: int) -> None:
        """Partition revoked: forget its keys."""
        gen = self.gens.pop(partition, None)
        if gen is not None:
            for h, s, _ in gen.keys:
                self.current.pop((h, s), None)

    def owns(self, partition: int) -> bool:
        return partition in self.gens

    # ------------------------------------------------------------------ keys
    def key_of(self, head_id: str, sample_id: str) -> SampleKey | None:
        return self.current.get((head_id, sample_id))

    def create(self, partition: int, head_id: str, sample_id: str) -> SampleKey:
        """A fresh key for an add; staged until :meth:`flush`."""
        key = new_key()
        self.put(partition, (head_id, sample_id, key.key_id), key)
        self.current[(head_id, sample_id)] = key
        return key

    def put(self, partition: int, ref: SampleRef, key: SampleKey) -> None:
        """Store ``key`` under ``ref`` in the partition's generation (staged until :meth:`flush`;
        kept by every rotation until :meth:`destroy`): a sample key, or a transit key."""
        gen = self.gens[partition]
        gen.keys[ref] = key
        self._staged.append((gen.topic, key_record_key(*ref), encode_key_record(key)))

    def forget_current(self, head_id: str, sample_id: str, key_id: str) -> None:
        """The sample was deleted: ``key_id`` stays stored (awaiting destruction) but is no longer
        the key of a cached sample."""
        cur = self.current.get((head_id, sample_id))
        if cur is not None and cur.key_id == key_id:
            del self.current[(head_id, sample_id)]

    def send(self) -> None:
        """Produce the staged keys without waiting for them: their round trip overlaps the work
        before the batch's commit, where :meth:`flush` waits (docs/erasure.md: a key is durable
        before any ciphertext under it is committed)."""
        staged, self._staged = self._staged, []
        if staged:
            if self._sending is None:
                self._sending = Acks(self.producer, error=KeyStoreError)
            self._sending.send([{"topic": t, "key": k, "value": v, "partition": 0} for t, k, v in staged])

    def flush(self) -> int:
        """Produce the staged keys and wait until every key produced since the last flush is
        acknowledged (KeyStoreError if not): call before the batch that uses them is committed.
        Returns how many. Waits up to UNLEARN_BROKER_RETRY_SECONDS (infra.retry): while the
        broker restarts the keys wait in the client's queue, which retries them itself."""
        self.send()
        sending, self._sending = self._sending, None
        return 0 if sending is None else sending.wait(RetryPolicy.of(self.settings).deadline_s)

    def live(self, partition: int) -> list[SampleRef]:
        gen = self.gens.get(partition)
        return list(gen.keys) if gen is not None else []

    # ------------------------------------------------------------------ destruction
    def destroy(self, partition: int, refs: Iterable[SampleRef]) -> int:
        """Destroy keys of ``partition``: forget them, write tombstones, rotate the partition into a
        new generation holding only the live keys, and schedule the old generation's deletion
        after the grace period. Returns how many keys were destroyed."""
        gen = self.gens[partition]
        gone = [r for r in refs if r in gen.keys]
        if not gone:
            return 0
        for ref in gone:
            del gen.keys[ref]
            h, s, kid = ref
            cur = self.current.get((h, s))
            if cur is not None and cur.key_id == kid:
                del self.current[(h, s)]
        self._produce_acked([(gen.topic, key_record_key(*ref), None) for ref in gone])
        if self.compacts:  # the broker erases them: compaction after the segment rolls (no rotation)
            self._schedule_roll(gen.topic)
            log.info("%s partition %d: %d key(s) destroyed (tombstones; compacted once the segment rolls, "
                     "%d live keys)", self.family.name, partition, len(gone), len(gen.keys))
            return len(gone)
        number = self.next_gen.get(partition, gen.generation + 1)
        self.next_gen[partition] = number + 1
        new = KeyGeneration(partition, number, self.family.topic(partition, number), dict(gen.keys), complete=True)
        self._ensure(new.topic)
        self._produce_acked([(new.topic, key_record_key(*ref), encode_key_record(k)) for ref, k in new.keys.items()]
                            + [(new.topic, COMPLETE_KEY, b"1")])
        self.gens[partition] = new
        self.retiring.append((time.monotonic() + ErasureSettings.of(self.settings).keys_retire_seconds, [gen.topic]))
        log.info("%s partition %d: %d key(s) destroyed, rotated to generation %d (%d live keys)",
                 self.family.name, partition, len(gone), new.generation, len(new.keys))
        return len(gone)

    def _schedule_roll(self, topic: str) -> None:
        now = time.monotonic()
        self._tombstoned[topic] = now
        self.rolls.setdefault(topic, now + ErasureSettings.of(self.settings).segment_ms / 1000.0 + 1.0)

    def roll_due(self, force: bool = False) -> list[str]:
        """Append a completion record to each generation whose tombstones' segment is old enough
        to roll (``segment.ms``): the append rolls it and the cleaner can then compact it. Another
        roll is scheduled when tombstones came after the first. Returns the topics appended to."""
        now = time.monotonic()
        due = [t for t, at in self.rolls.items() if force or at <= now]
        if not due:
            return []
        self._produce_acked([(t, COMPLETE_KEY, b"1") for t in due])
        for t in due:
            again = self._tombstoned.get(t, 0.0) + ErasureSettings.of(self.settings).segment_ms / 1000.0 + 1.0
            if again > now and not force:
                self.rolls[t] = again
            else:
                self.rolls.pop(t, None)
                self._tombstoned.pop(t, None)
        return due

    def retire_due(self, force: bool = False) -> list[str]:
        """Delete superseded generations whose grace period is over (and roll compacted ones,
        :meth:`roll_due`); returns the topics deleted."""
        if self.rolls:
            self.roll_due(force)
        now = time.monotonic()
        due = [t for at, names in self.retiring if force or at <= now for t in names]
        if not due:
            return []
        self.retiring = [(at, names) for at, names in self.retiring if not (force or at <= now)]
        try:  # infra.retry: deleting a topic again is harmless (a missing one is not an error)
            RetryPolicy.of(self.settings).call("deleting superseded key generations",
                                               lambda: delete_topics(self.settings, due, admin=self.admin))
        except (TopicError, BrokerUnavailable) as exc:
            log.warning("could not delete superseded key generations %s: %s", due, exc)
            return []
        return due

    # ------------------------------------------------------------------ I/O
    def _ensure(self, topic: str) -> None:
        try:  # infra.retry: creating a topic that exists is no error
            RetryPolicy.of(self.settings).call(f"creating {topic}", lambda: ensure_topic(
                self.settings, topic, compacted=True, admin=self.admin, config=key_family_config(self.settings)))
        except TopicError as exc:
            raise KeyStoreError(str(exc)) from None

    def _produce_acked(self, records: Sequence[tuple[str, bytes, bytes | None]]) -> None:
        produce_acked(self.producer, [{"topic": t, "key": key, "value": v, "partition": 0} for t, key, v in records],
                      timeout=RetryPolicy.of(self.settings).deadline_s, error=KeyStoreError)

    def close(self) -> None:
        self.producer.flush(self.settings.admin_timeout)


Job = Callable[[Callable[[], Any]], Any]  # gets a consumer factory; returns the answer's value


@dataclass(frozen=True)
class Answer:
    """A finished read: its value (or the exception it raised), when it was asked and when it
    started (both ``time.monotonic()``)."""

    value: Any
    error: BaseException | None
    asked: float
    started: float

    def result(self) -> Any:
        """The value; the read's exception re-raised on the caller's thread (as a read on the poll
        loop raised before)."""
        if self.error is not None:
            raise self.error
        return self.value


def run_with_consumers(make: Callable[[], Any], job: Job) -> Any:
    """Run ``job`` with a factory of fresh consumers, all closed when it returns: a reader must not
    hold a ``ledger-state`` generation its writer deletes."""
    made: list[Any] = []

    def new() -> Any:
        made.append(make())
        return made[-1]

    try:
        return job(new)
    finally:
        for c in made:
            try:
                c.close()
            except Exception as exc:  # a close failing must not hide the answer
                log.debug("probe consumer close: %s", exc)


class Probes:
    """One background thread running named reads, at most one in flight per name."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._cv = threading.Condition()
        self._queue: list[tuple[str, Job, float]] = []
        self._busy: set[str] = set()
        self._done: dict[str, Answer] = {}
        self._closed = False
        self._thread: threading.Thread | None = None

    def ask(self, name: str, job: Job) -> bool:
        """Queue ``job`` under ``name``; False (nothing queued) while one of that name is in
        flight or its answer not yet taken."""
        with self._cv:
            if self._closed or name in self._busy or name in self._done:
                return False
            self._busy.add(name)
            self._queue.append((name, job, time.monotonic()))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="featurizer-probes", daemon=True)
                self._thread.start()
            self._cv.notify()
            return True

    def busy(self, name: str) -> bool:
        """Whether a read of ``name`` is queued, running, or answered and not yet taken."""
        with self._cv:
            return name in self._busy or name in self._done

    def take(self, name: str) -> Answer | None:
        """The finished answer of ``name`` (removed), or None if there is none (yet)."""
        with self._cv:
            return self._done.pop(name, None)

    def wait(self, name: str, timeout: float) -> Answer | None:
        """Block until ``name`` is answered (tests and a forced tick); the answer, removed."""
        with self._cv:
            self._cv.wait_for(lambda: name in self._done or name not in self._busy, timeout)
            return self._done.pop(name, None)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                name, job, asked = self._queue.pop(0)
            started = time.monotonic()
            try:
                answer = Answer(run_with_consumers(self._make, job), None, asked, started)
            except BaseException as exc:  # handed to the tick, which raises it on the poll loop
                answer = Answer(None, exc, asked, started)
            with self._cv:
                self._busy.discard(name)
                self._done[name] = answer
                self._cv.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread after the read in progress (its answer is dropped)."""
        with self._cv:
            self._closed = True
            self._queue.clear()
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)


SEALED_SAMPLE_MAGIC = b"ULFZ\x01"


def seal_outcome(keys: KeyStore, partition: int, outcome: BatchOutcome,
                 cached: Callable[[str, str], bool] | None = None) -> BatchOutcome:
    """``outcome`` with its deltas' rows sealed; creates (stages) a key per added row. A delete
    uses the key of the sample cached before the batch (``cached(head, sample)``: the cache as
    it was before the batch) or else the key its add got in this batch: a sample deleted earlier
    whose key awaits destruction is not the one a re-add-then-delete in this batch removes."""
    if not outcome.deltas:
        return replace(outcome, deadletters=[seal_deadletter(keys, dl) for dl in outcome.deadletters])
    before: dict[tuple[str, str], SampleKey] = {}
    for d in outcome.deltas:  # deletes first: they use the keys of samples cached before this batch
        for e in d.entries:
            if isinstance(e, RowsEntry) and e.sign < 0:
                for s in e.sample_ids:
                    k = keys.key_of(d.head_id, s)
                    if k is not None and (cached is None or cached(d.head_id, s)):
                        before[(d.head_id, s)] = k
    created: dict[tuple[str, str], list[SampleKey]] = {}
    for d in outcome.deltas:
        for e in d.entries:
            if isinstance(e, RowsEntry) and e.sign > 0:
                for s in e.sample_ids:
                    created.setdefault((d.head_id, s), []).append(keys.create(partition, d.head_id, s))
    adds_used: dict[tuple[str, str], int] = {}

    def key_for(sign: int) -> Callable[[str, str], SampleKey]:
        def pick(head_id: str, sample_id: str) -> SampleKey:
            ref = (head_id, sample_id)
            if sign > 0:
                i = adds_used.get(ref, 0)
                adds_used[ref] = i + 1
                return created[ref][i]
            k = before.get(ref) or next(iter(created.get(ref, [])), None)
            if k is None:  # added before sealing existed: give it a key now (its add was plaintext)
                k = keys.create(partition, head_id, sample_id)
                created.setdefault(ref, []).append(k)
            return k
        return pick

    sealed = []
    deadletters = [seal_deadletter(keys, dl) for dl in outcome.deadletters]
    for d in outcome.deltas:
        if not any(isinstance(e, RowsEntry) for e in d.entries):
            sealed.append(d)
            continue
        # seal entry by entry so adds and deletes pick their keys by sign
        parts = [seal_delta(replace(d, entries=(e,)), key_for(e.sign)).entries[0] if isinstance(e, RowsEntry) else e
                 for e in d.entries]
        sealed.append(replace(d, entries=tuple(parts)))
    for head_id, sample_id in before:  # deleted and not re-added: its key now only awaits destruction
        if (head_id, sample_id) not in created:
            keys.forget_current(head_id, sample_id, before[(head_id, sample_id)].key_id)
    return replace(outcome, deltas=sealed, deadletters=deadletters)


def seal_deadletter(keys: KeyStore, dl: DeadLetter) -> DeadLetter:
    """A refused request about a sample that has a key (e.g. a duplicate add of a cached sample)
    keeps its original bytes sealed under that key (purpose ``deadletter-original``), so the
    sample's erasure covers it; other dead letters are unchanged (docs/erasure.md)."""
    try:
        req = orjson.loads(dl.original)
        head_id, sample_id = req["head_id"], req["sample_id"]
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return dl
    if not (isinstance(head_id, str) and isinstance(sample_id, str)):
        return dl
    key = keys.key_of(head_id, sample_id)
    if key is None:
        return dl
    sealed = seal(key, PURPOSE_DEADLETTER, head_id, sample_id, dl.original)
    return replace(dl, original=SEALED_SAMPLE_MAGIC + bytes.fromhex(key.key_id) + sealed)


def sealed_sample_record(key: SampleKey, head_id: str, sample_id: str, plain: bytes) -> bytes:
    """``ULFZ\\x01`` + key id (16 bytes) + ``seal(cache-sample)`` of the plaintext sample record."""
    return SEALED_SAMPLE_MAGIC + bytes.fromhex(key.key_id) + seal(key, PURPOSE_CHANGELOG, head_id, sample_id, plain)


def open_sample_record(lookup: Callable[[str, str, str], SampleKey | None], head_id: str, sample_id: str,
                       raw: bytes) -> bytes:
    """The plaintext sample record of a sealed one (a plaintext record passes through); SealError
    when its key is gone or it does not open."""
    if not raw.startswith(SEALED_SAMPLE_MAGIC):
        return raw
    at = len(SEALED_SAMPLE_MAGIC)
    if len(raw) < at + 16:
        raise SealError("truncated sealed sample record")
    kid = raw[at: at + 16].hex()
    key = lookup(head_id, sample_id, kid)
    if key is None:
        raise SealError(f"the key {kid} of sample {sample_id!r} (head {head_id!r}) is destroyed or unknown")
    return unseal(key, PURPOSE_CHANGELOG, head_id, sample_id, raw[at + 16:])


def sample_sealer(keys: KeyStore, partition: int) -> Callable[[str, str, bytes], bytes]:
    """``seal(head, sample, plain_record)`` with the sample's current key (the one its add used);
    a sample cached before sealing existed gets a key now (staged: flush before producing)."""
    def do(head_id: str, sample_id: str, plain: bytes) -> bytes:
        k = keys.key_of(head_id, sample_id) or keys.create(partition, head_id, sample_id)
        return sealed_sample_record(k, head_id, sample_id, plain)
    return do


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
        # transit keys of raw inputs (streams/featurizer/erasure.py); committed: the router's offsets
        # (their private halves in a family of their own, sharing this store's producer)
        private = transit_private_family(settings.topic_prefix)
        self.probes = Probes(self._new_consumer)  # the tick's reads, off the poll loop
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
        from confluent_kafka import Consumer

        from unlearn.infra.settings import consumer_config

        return Consumer(consumer_config(self.settings, f"{self.settings.topic_prefix}featurizer-shredder",
                                        **{"enable.partition.eof": True, "enable.auto.commit": False}))

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
            self._floors = run_with_consumers(self._new_consumer, lambda make: ledger_floors(self.settings, make()))
            self._floors_at, self._floors_asked = now, asked
            return
        answer = self.probes.take(FLOORS)
        if answer is not None:
            self._floors, self._floors_asked = answer.result(), answer.asked
        if now - self._floors_at >= FeaturizerSettings.of(self.settings).shred_every_seconds and self.probes.ask(
                FLOORS, lambda make: ledger_floors(self.settings, make())):
            self._floors_at = now

    def close(self) -> None:
        self.probes.close()
        self.keys.close()  # flushes the producer the transit key store shares


TP = tuple[str, int]


def trim_bounds(own: str, committed: Mapping[str, Mapping[TP, int]], partitions: Iterable[TP]) -> dict[TP, int]:
    """Where each partition may be trimmed to: the lowest offset any group committed on it, for
    the partitions that ``own`` (the featurizer's group) committed on; the others are left out.
    Pure: ``committed`` maps group -> (topic, partition) -> committed offset (absent: none)."""
    out: dict[TP, int] = {}
    for tp in partitions:
        if committed.get(own, {}).get(tp, -1) < 0:
            continue
        out[tp] = min(offs[tp] for offs in committed.values() if offs.get(tp, -1) >= 0)
    return out


class Trimmer:
    """DeleteRecords below every group's committed offsets on the featurizer's raw-input topics,
    for the partitions its member is assigned (module docstring)."""

    def __init__(self, settings: Settings, group: str, topics: Iterable[str]) -> None:
        from confluent_kafka.admin import AdminClient

        self.settings = settings
        self.group = group
        self.topics = frozenset(topics)
        self.every = ErasureSettings.of(settings).trim_every_seconds
        self.admin: Any = AdminClient(admin_config(settings))
        self.trimmed: dict[TP, int] = {}  # the log start this trimmer last set, per partition
        self._readers: dict[str, Any] = {}  # group -> consumer reading its committed offsets
        self.stats = {"trims": 0, "records": 0, "failures": 0}
        self._next = time.monotonic() + self.every
        self._offered: list[TP] | None = None
        self.fatal: BaseException | None = None  # a non-transient broker error: raised by the poll loop (check)
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="featurizer-trim", daemon=True)
        self._thread.start()

    def due(self) -> bool:
        """Whether the poll loop should offer its assignment now (cheap: a clock read)."""
        return time.monotonic() >= self._next

    def offer(self, assignment: Iterable[Any]) -> None:
        """Hand the member's assigned partitions (``TopicPartition``s) to the background thread."""
        self._next = time.monotonic() + self.every
        tps = [(tp.topic, tp.partition) for tp in assignment if tp.topic in self.topics]
        with self._cv:
            self._offered = tps
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._offered is None and not self._closed:
                    self._cv.wait()
                tps, self._offered = self._offered, None
                if self._closed or tps is None:
                    return
            try:  # infra.retry: DeleteRecords is idempotent, a new admin client and readers per try
                RetryPolicy.of(self.settings).call("raw-input trim", functools.partial(self.trim, tps),
                                                   on_retry=self._renew)
            except Exception as exc:  # transient past the deadline: retried next period (delays erasure only)
                self.stats["failures"] += 1
                if not isinstance(exc, BrokerUnavailable) and kafka_error(exc) is not None and not is_retriable(exc):
                    self.fatal = exc  # authorization, configuration: the featurizer stops (check)
                    log.error("raw-input trim failed: %s", exc)
                    return
                log.warning("raw-input trim failed (retried in %.1fs): %s", self.every, exc)

    def check(self) -> None:
        """Raise the trim's fatal error on the caller's thread (the poll loop), if there was one."""
        if self.fatal is not None:
            raise self.fatal

    def _renew(self) -> None:
        """Before a new try: a new admin client and new offset readers (ones that met a restart
        may keep stale metadata, infra.retry)."""
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient(admin_config(self.settings))
        readers, self._readers = self._readers, {}
        for c in readers.values():
            c.close()

    def committed(self, partitions: Iterable[TP]) -> dict[str, dict[TP, int]]:
        """group -> (topic, partition) -> committed offset on ``partitions``, for every consumer
        group under the topic prefix that this principal can see.

        Read with a consumer of each group (OffsetFetch through its coordinator, never joining the
        group), not the admin client's ListConsumerGroupOffsets: librdkafka 2.16 dereferences a
        consumer group the admin client does not have when that response carries a coordinator
        error, which killed the featurizer with SIGSEGV while a node was down."""
        from confluent_kafka import TopicPartition

        timeout = self.settings.admin_timeout
        listing = self.admin.list_consumer_groups(request_timeout=timeout).result(timeout=timeout)
        groups = {g.group_id for g in listing.valid if g.group_id.startswith(self.settings.topic_prefix)}
        groups.add(self.group)
        asked = [TopicPartition(t, p) for t, p in sorted(set(partitions))]
        out: dict[str, dict[TP, int]] = {}
        for g in sorted(groups):
            res = self._reader(g).committed(asked, timeout=timeout)
            out[g] = {(tp.topic, tp.partition): tp.offset for tp in res
                      if tp.topic in self.topics and tp.error is None and tp.offset >= 0}
        return out

    def _reader(self, group: str) -> Any:
        """A consumer of ``group`` that only reads its committed offsets (kept per group)."""
        from confluent_kafka import Consumer

        if group not in self._readers:
            self._readers[group] = Consumer(consumer_config(self.settings, group, **{"enable.auto.commit": False}))
        return self._readers[group]

    def trim(self, partitions: Iterable[TP]) -> int:
        """Trim ``partitions`` now (the background thread's step; tests call it directly). Returns
        how many partitions got a new log start."""
        wanted = sorted(set(partitions))
        if not wanted:
            return 0
        bounds = trim_bounds(self.group, self.committed(wanted), wanted)
        todo = {tp: off for tp, off in bounds.items() if off > self.trimmed.get(tp, 0)}
        if not todo:
            return 0
        lows = delete_records(self.settings, todo, admin=self.admin)
        for tp, low in lows.items():
            self.stats["records"] += max(0, low - self.trimmed.get(tp, 0))
            self.trimmed[tp] = low
        done = len(lows)
        self.stats["trims"] += 1
        log.debug("trimmed %s", {f"{t}[{p}]": o for (t, p), o in self.trimmed.items()})
        return done

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=self.settings.admin_timeout)
        if not self._thread.is_alive():  # the thread's consumers are closed by the thread's owner only
            for c in self._readers.values():
                c.close()
            self._readers.clear()
