"""What the two stages (and the SDK) share, so that neither stage imports the other.

- **The by-head topic and a head's partition in it.** The featurizer's router forwards every
  request to ``<requests>.by-head`` at :func:`head_partition` of its head id; the featurizer that
  owns that partition keeps the head's sample and transit keys, so the ledger (opening sealed
  rows) and the SDK (sealing inputs) find a head's keys by the same function.
- **The ledger's checkpoint record** (:class:`Checkpoint`, in ``ledger-state``): the ledger
  writes it; the featurizer reads its floor before destroying a deleted sample's key
  (docs/erasure.md), since a ledger never re-reads below it.
- **Topic families** (:class:`TopicFamily`) and the **key families' records**, below. Nothing
  here depends on a stage.

**Topic families**: one logical stream stored as generation topics ``<prefix><name>.p<P>.g<G>``.
A broker without compaction, retention or record deletion (the embedded one) keeps every record
ever written, and deleting a whole topic is the only way to free space. A writer that owns
partition P of the stream writes into generation G until it passes its size bound, then writes
the state a reader needs (a full snapshot, or the latest record per key) into G+1 and deletes G.
Deleting G is also how a writer erases what G holds. Readers follow the family: every topic whose
name matches, added as they appear and dropped as they are deleted (``infra.topic_reader``). Each
generation topic has one partition; P names the writer's input partition (a ``deltas``
partition), so ownership follows the consumer group. The ledger's state (``ledger-state``) and
its head updates (``heads``) are families, and so are the featurizer's sample keys
(``subject-keys``) and private transit keys (``transit-private``).

**Key families** (docs/erasure.md): reading ``<prefix>subject-keys.p<P>.g<G>`` and
``<prefix>transit-private.p<P>.g<G>`` (same records and rules). One generation topic per (by-head
partition P, generation G), one partition each. Records:

- ``<len(head)>:<head>/<sample>/<key id>`` -> ``schemas.sealed.encode_key_record`` (the key), or a
  tombstone once the key is destroyed (for a compacting broker; the embedded one needs the
  rotation);
- ``COMPLETE_KEY`` -> ``b"1"``: the writer finished copying the live keys into this generation;
- transit keys (``streams/featurizer/transit_keys.py``), in ``transit-private``, under the head
  :data:`TRANSIT_HEAD`, outside the id grammar:
  ``8:~transit/<created ms>.<use_until ms>/<key id>`` -> the X25519 private key.

A writer rotates a partition by writing every live key into G+1, then the completion record, then
deleting G after a grace period. A reader takes the newest *complete* generation of each partition
(a rotation that crashed half-way leaves an incomplete newest one, which the writer deletes when
it next loads the partition). Every read here uses a consumer it closes before returning, so no
reader holds a generation that its writer later deletes (the librdkafka crash described in
``infra.topic_reader.source_partitions``).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from unlearn.infra.log_position import StaleStateError
from unlearn.infra.retry import RetryPolicy
from unlearn.infra.settings import Settings, consumer_config
from unlearn.infra.topic_reader import TopicReadError, read_range
from unlearn.schemas.sealed import SampleKey, SealError, decode_key_record

__all__ = [
    "ROUTED_SUFFIX",
    "Checkpoint",
    "HeadPointer",
    "checkpoint_key",
    "head_partition",
    "latest_checkpoint",
    "routed_topic_name",
    "COMPLETE_KEY",
    "READ_IDLE_S",
    "TRANSIT_HEAD",
    "KeyGeneration",
    "KeyRing",
    "KeysUnavailable",
    "Locate",
    "fold_keys",
    "key_record_key",
    "parse_key_record_key",
    "read_partition_keys",
    "superseded_left",
]

log = logging.getLogger("unlearn.keys")

ROUTED_SUFFIX = ".by-head"
"""The by-head topic of a requests topic is its name plus this suffix."""


def routed_topic_name(requests_topic: str) -> str:
    """The by-head topic a requests topic is routed into (``unlearn.requests`` ->
    ``unlearn.requests.by-head``)."""
    return requests_topic + ROUTED_SUFFIX


def head_partition(head_id: str, partitions: int) -> int:
    """The by-head partition of a head: the first 8 bytes of SHA-256(UTF-8 head id) as a
    big-endian unsigned integer, modulo the partition count. Part of the contract (any language
    can compute it), and independent of every client library's partitioner."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    digest = hashlib.sha256(head_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % partitions


_FORMAT = "unlearn.ledger-checkpoint/v1"


@dataclass(frozen=True)
class HeadPointer:
    """Where a head's latest durable snapshot is in the changelog partition."""

    generation: int
    applied_offset: int  # last deltas offset the snapshot covers
    sha256: str  # of the whole snapshot blob (snapshot.state_sha)
    piece_offsets: tuple[int, ...]  # changelog offsets of its pieces, in order


@dataclass(frozen=True)
class Checkpoint:
    """The durable position of one ``deltas`` partition."""

    partition: int
    floor: int  # next deltas offset to read: everything below is in the snapshots named here
    topic_id: str  # the deltas topic incarnation this state belongs to ("" if unknown)
    heads: Mapping[str, HeadPointer] = field(default_factory=dict)
    # A delete was applied since the partition's last erasure rotation: the generations this
    # record's state lives in may still hold aggregates taken before it (the worker's erasure
    # rotation). Encoded only when set.
    erasure_pending: bool = False

    def encode(self) -> bytes:
        doc: dict[str, object] = {
            "format": _FORMAT, "partition": self.partition, "floor": self.floor, "topic_id": self.topic_id,
            "heads": {h: {"generation": p.generation, "applied_offset": p.applied_offset, "sha256": p.sha256,
                          "piece_offsets": list(p.piece_offsets)} for h, p in sorted(self.heads.items())},
        }
        if self.erasure_pending:
            doc["erasure_pending"] = True
        return orjson.dumps(doc)

    @classmethod
    def decode(cls, raw: bytes) -> Checkpoint:
        """The record ``raw`` holds; :class:`StaleStateError` if it is not one."""
        try:
            doc = orjson.loads(raw)
            if doc.get("format") != _FORMAT:
                raise ValueError(f"unknown checkpoint format {doc.get('format')!r}")
            heads = {h: HeadPointer(int(p["generation"]), int(p["applied_offset"]), str(p["sha256"]),
                                    tuple(int(o) for o in p["piece_offsets"])) for h, p in doc["heads"].items()}
            pending = doc.get("erasure_pending", False)
            if not isinstance(pending, bool):
                raise ValueError(f"erasure_pending must be a boolean, got {pending!r}")
            return cls(int(doc["partition"]), int(doc["floor"]), str(doc["topic_id"]), heads, pending)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StaleStateError(f"unreadable checkpoint record: {exc}") from None


def checkpoint_key(partition: int) -> bytes:
    """Changelog key of ``partition``'s checkpoint record."""
    return b"checkpoint/" + str(partition).encode()


def latest_checkpoint(records: Iterable[tuple[int, bytes | None, bytes | None]], partition: int) -> Checkpoint | None:
    """The checkpoint of ``partition`` with the highest changelog offset among ``records``
    ((offset, key, value) triples; tombstones and other keys ignored)."""
    want = checkpoint_key(partition)
    best: tuple[int, bytes] | None = None
    for offset, key, value in records:
        if key == want and value is not None and (best is None or offset > best[0]):
            best = (offset, value)
    return None if best is None else Checkpoint.decode(best[1])


@dataclass(frozen=True)
class TopicFamily:
    """The generation topics of one logical stream under one prefix."""

    prefix: str
    name: str

    @property
    def stem(self) -> str:
        return f"{self.prefix}{self.name}.p"

    def topic(self, partition: int, generation: int) -> str:
        """The topic of ``partition`` (the writer's input partition) at ``generation``."""
        if partition < 0 or generation < 0:
            raise ValueError(f"partition and generation must be >= 0, got {partition}, {generation}")
        return f"{self.stem}{partition}.g{generation}"

    def parse(self, topic: str) -> tuple[int, int] | None:
        """(partition, generation) of a topic of this family, else None."""
        if not topic.startswith(self.stem):
            return None
        part, sep, gen = topic[len(self.stem):].partition(".g")
        if not (sep and part.isdigit() and gen.isdigit() and part.isascii() and gen.isascii()):
            return None
        return int(part), int(gen)

    def matches(self, topic: str) -> bool:
        return self.parse(topic) is not None

    def select(self, topics: Iterable[str]) -> list[str]:
        """The family's topics among ``topics``, sorted by (partition, generation)."""
        found = [(pg, t) for t in topics if (pg := self.parse(t)) is not None]
        return [t for _, t in sorted(found)]

    def generations(self, topics: Iterable[str], partition: int) -> list[int]:
        """Generations of ``partition`` among ``topics``, ascending."""
        return sorted(pg[1] for t in topics if (pg := self.parse(t)) is not None and pg[0] == partition)

    @property
    def pattern(self) -> str:
        """A regular expression for Kafka pattern subscriptions (librdkafka: a leading ``^``;
        Java: ``Pattern.compile``)."""
        return f"^{re.escape(self.stem)}[0-9]+\\.g[0-9]+$"

    def __str__(self) -> str:
        return f"{self.stem}<P>.g<G>"


def heads_family(prefix: str) -> TopicFamily:
    """Head updates, per ``deltas`` partition: every version the ledger publishes."""
    return TopicFamily(prefix, "heads")


def state_family(prefix: str) -> TopicFamily:
    """The ledger's durable state, per ``deltas`` partition: snapshot pieces and checkpoints."""
    return TopicFamily(prefix, "ledger-state")


def keys_family(prefix: str) -> TopicFamily:
    """Per-sample data keys, per by-head partition (the featurizer that owns partition P of
    ``requests.by-head`` writes ``subject-keys.p<P>``): docs/erasure.md."""
    return TopicFamily(prefix, "subject-keys")


def transit_private_family(prefix: str) -> TopicFamily:
    """Private halves of the transit keys, per by-head partition (same owner as ``subject-keys``):
    a family of their own so that destroying one rewrites only the one or two live transit keys,
    never every sample key (docs/erasure.md section 5)."""
    return TopicFamily(prefix, "transit-private")


COMPLETE_KEY = b"\x00complete"
TRANSIT_HEAD = "~transit"
"""The head part of a transit key's record key: outside the id grammar, so never a real head."""
SampleRef = tuple[str, str, str]  # (head id, sample id, key id)
Locate = Callable[[Mapping[str, Any]], int | None]
"""Picks the one partition a refresh reads from the broker's topic metadata (name -> metadata),
or None when it cannot tell (then nothing is read)."""


def key_record_key(head_id: str, sample_id: str, key_id: str) -> bytes:
    return f"{len(head_id)}:{head_id}/{sample_id}/{key_id}".encode()


def parse_key_record_key(key: bytes) -> SampleRef:
    text = key.decode()
    n, _, rest = text.partition(":")
    head = rest[: int(n)]
    sample, _, kid = rest[int(n) + 1:].rpartition("/")
    return head, sample, kid


@dataclass
class KeyGeneration:
    """What one generation topic of a partition holds: live keys in log order, completeness and
    the offset to continue reading from."""

    partition: int
    generation: int
    topic: str
    keys: dict[SampleRef, SampleKey] = field(default_factory=dict)
    complete: bool = False
    next_offset: int = 0


def fold_keys(gen: KeyGeneration, records: Iterable[tuple[int, bytes | None, bytes | None]]) -> KeyGeneration:
    """Apply records in log order: last value per key wins, tombstones destroy."""
    for offset, k, v in records:
        gen.next_offset = offset + 1
        if k is None:
            continue
        if k == COMPLETE_KEY:
            gen.complete = True
            continue
        try:
            ref = parse_key_record_key(k)
            if v is None:
                gen.keys.pop(ref, None)
            else:
                key = decode_key_record(v)
                if key.key_id != ref[2]:
                    raise SealError("key id of the record key and the value differ")
                gen.keys.pop(ref, None)  # keep log order of the latest value
                gen.keys[ref] = key
        except (ValueError, SealError, UnicodeDecodeError) as exc:
            log.warning("%s offset %d: unreadable key record skipped: %s", gen.topic, offset, exc)
    return gen


def _consumer(settings: Settings, role: str = "keys") -> Any:
    from confluent_kafka import Consumer

    # the group id starts with the reader's role (never joined): what the ACL matrix grants it
    return Consumer(consumer_config(settings, f"{settings.topic_prefix}{role}-keys-{uuid.uuid4().hex}",
                                    **{"enable.partition.eof": True, "enable.auto.commit": False}))


#: Seconds without progress before a key read gives up: a generation deleted under a reader stalls
#: its fetches instead of failing them, and the caller then re-lists and reads the newer one.
READ_IDLE_S = 5.0


class KeysUnavailable(RuntimeError):
    """The key family could not be read to its end (broker away, generations moving): a reader
    must not conclude that a key it did not find is destroyed."""


def _read(c: Any, settings: Settings, gen: KeyGeneration) -> KeyGeneration:
    """Read ``gen`` on from its ``next_offset`` to its end. A stall is either a generation deleted
    under the reader (raised: the caller re-lists) or, on a multi-node Kafka, a partition whose
    leader is moving after a node's loss (fenced after the broker session timeout, 6 s on the
    project's Kafka): while the topic is still listed, read on, up to ``admin_timeout``."""
    deadline = time.monotonic() + settings.admin_timeout
    while True:
        try:
            return fold_keys(gen, read_range(c, gen.topic, 0, gen.next_offset, None, READ_IDLE_S))
        except TopicReadError:
            if time.monotonic() >= deadline or not _listed(c, gen.topic, settings.admin_timeout):
                raise
            log.info("reading %s stalled (its leader moving?): reading on from offset %d", gen.topic, gen.next_offset)


def _listed(c: Any, topic: str, timeout: float) -> bool:
    """Whether the cluster lists ``topic`` (False when the broker cannot say)."""
    try:
        return topic in c.list_topics(timeout=timeout).topics
    except Exception:  # KafkaException: the broker is away; the stall stands
        return False


def read_partition_keys(settings: Settings, family: TopicFamily, topics: Iterable[str], partition: int,
                        consumer: Any = None, role: str = "keys") -> KeyGeneration | None:
    """The newest complete generation of ``partition`` (generation 0 counts as complete: it is
    created empty), read to its end; None when the partition has no generation yet."""
    names = list(topics)
    gens = family.generations(names, partition)
    c = consumer or _consumer(settings, role)
    try:
        for g in reversed(gens):
            gen = _read(c, settings, KeyGeneration(partition, g, family.topic(partition, g)))
            if gen.complete or g == gens[0]:
                return gen
        return None
    finally:
        if consumer is None:
            c.close()


def superseded_left(settings: Settings, family: TopicFamily, below: Mapping[int, int], timeout: float) -> list[str]:
    """The generation topics g < ``below[p]`` of each partition p still listed after waiting up to
    ``timeout`` seconds (empty: all deleted). A generation is superseded for good once a newer one
    is complete, and its writer deletes it ``UNLEARN_KEYS_RETIRE_SECONDS`` later; generations
    created meanwhile are newer and copy only the live keys, so once these are gone, a key absent
    from generation ``below[p]`` is in no topic. Deletes of other samples (and, in
    ``transit-private``, every transit key's destruction) keep rotating a family, so "a single
    generation" is no stable state to wait for."""
    from confluent_kafka.admin import AdminClient

    from unlearn.infra.settings import admin_config

    admin = AdminClient(admin_config(settings))
    deadline = time.monotonic() + timeout
    while True:
        topics = list(admin.list_topics(timeout=settings.admin_timeout).topics)
        left = [family.topic(p, g) for p, n in sorted(below.items()) for g in family.generations(topics, p) if g < n]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)


class KeyRing:
    """The keys of every partition, for the ledger worker and the verifier (``streams.ledger.row_opener``).
    :meth:`refresh` reads the family to its current end (the featurizer acknowledged a key before
    any ciphertext under it was produced) or raises :class:`KeysUnavailable`;
    :meth:`refresh_partition` reads one partition to its end."""

    def __init__(self, settings: Settings, attempts: int = 5, role: str = "keys") -> None:
        self.settings = settings
        self.family = keys_family(settings.topic_prefix)
        self.gens: dict[int, KeyGeneration] = {}
        self.refreshes = 0
        self.reads: Counter[int] = Counter()  # partition -> reads of it (refreshes and their retries)
        self.attempts = attempts
        self.role = role
        self._lock = threading.Lock()

    @property
    def keys(self) -> dict[SampleRef, SampleKey]:
        """Every known key, merged over the partitions (a new dict: O(keys); :meth:`get` for one)."""
        with self._lock:
            return {ref: k for g in self.gens.values() for ref, k in g.keys.items()}

    def get(self, ref: SampleRef) -> SampleKey | None:
        """The key of ``ref`` if read so far, without reading: a few dict lookups, where merging
        every partition's keys after each refresh cost O(all live keys) per refresh. A miss is
        confirmed under the lock, so a refresh folding records meanwhile cannot hide a key."""
        for g in reversed(tuple(self.gens.values())):  # a later partition wins, as in the merge
            key = g.keys.get(ref)
            if key is not None:
                return key
        with self._lock:
            for g in reversed(tuple(self.gens.values())):
                key = g.keys.get(ref)
                if key is not None:
                    return key
        return None

    def lookup(self, head_id: str, sample_id: str, key_id: str) -> SampleKey | None:
        ref = (head_id, sample_id, key_id)
        key = self.get(ref)
        if key is None:
            self.refresh()
            key = self.get(ref)
        return key

    def refresh(self) -> None:
        """Read every partition's newest complete generation to its end (incrementally). A read
        that stalls (a generation deleted under it) is retried on a fresh listing; KeysUnavailable
        when a partition cannot be read after ``attempts`` tries."""
        self._refresh(None)

    def refresh_partition(self, locate: Locate) -> int | None:
        """Read only the partition ``locate`` picks from the topic metadata, to its end (as
        :meth:`refresh`, KeysUnavailable if it cannot): a deltas message's keys are all in its
        head's partition, and reading one costs a fraction of reading every one. Returns the
        partition read, or None (nothing read) when ``locate`` picks none the family lists."""
        return self._refresh(locate)

    def _refresh(self, locate: Locate | None) -> int | None:
        """Under infra.retry: a broker restart (metadata or reads failing) is waited for, up to
        UNLEARN_BROKER_RETRY_SECONDS, before KeysUnavailable reaches the worker."""
        return RetryPolicy.of(self.settings).call("reading the key family", lambda: self._refresh_tries(locate))

    def _refresh_tries(self, locate: Locate | None) -> int | None:
        with self._lock:
            self.refreshes += 1
            failed: dict[int, str] = {}
            picked: set[int] | None = None
            for _ in range(self.attempts):
                # with locate, each try picks again on its fresh listing rather than retrying
                # the failed partitions of the previous one
                picked, failed = self._refresh_once(None if locate is not None else failed or None, locate)
                if not failed:
                    break
            if failed:
                raise KeysUnavailable(f"key family partitions {sorted(failed)} unreadable: {list(failed.values())[:2]}"
                                      ) from TimeoutError("not read to its end")  # transient for infra.retry
            return None if locate is None or not picked else min(picked)

    def _refresh_once(self, only: dict[int, str] | None, locate: Locate | None) -> tuple[set[int], dict[int, str]]:
        c = _consumer(self.settings, self.role)
        failed: dict[int, str] = {}
        try:
            listed = c.list_topics(timeout=self.settings.admin_timeout).topics
            topics = list(listed)
            parts = {pg[0] for t in topics if (pg := self.family.parse(t)) is not None}
            if locate is not None:
                p = locate(listed)
                parts = {p} if p in parts else set()
            for p in sorted(parts if only is None else set(only) & parts):
                self.reads[p] += 1
                have = self.gens.get(p)
                newest = self.family.generations(topics, p)[-1]
                try:
                    if have is not None and have.generation == newest:
                        _read(c, self.settings, have)
                        continue
                    gen = read_partition_keys(self.settings, self.family, topics, p, consumer=c)
                except TopicReadError as exc:  # deleted under us: a fresh listing names the newer one
                    log.info("key family partition %d: %s", p, exc)
                    failed[p] = str(exc)
                    continue
                if gen is not None:
                    self.gens[p] = gen
        finally:
            c.close()
        return parts, failed
