"""Reading the key families (docs/erasure.md): ``<prefix>subject-keys.p<P>.g<G>`` and
``<prefix>transit-private.p<P>.g<G>`` (same records and rules), one generation topic per (by-head
partition P, generation G), one partition each. Records:

- ``<len(head)>:<head>/<sample>/<key id>`` -> ``schemas.sealed.encode_key_record`` (the key), or a
  tombstone once the key is destroyed (for a compacting broker; the embedded one needs the
  rotation);
- ``COMPLETE_KEY`` -> ``b"1"``: the writer finished copying the live keys into this generation;
- transit keys (the featurizer's transit keys), in ``transit-private``, under the head
  :data:`TRANSIT_HEAD`, outside the id grammar: ``8:~transit/<created ms>.<use_until ms>/<key id>``
  -> the X25519 private key.

A writer rotates a partition by writing every live key into G+1, then the completion record, then
deleting G after a grace period. A reader takes the newest *complete* generation of each partition
(a rotation that crashed half-way leaves an incomplete newest one, which the writer deletes when
it next loads the partition). Every read here uses a consumer it closes before returning, so no
reader holds a generation that its writer later deletes (the librdkafka crash described in
``runtime.topic_reader.source_partitions``)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from unlearn.common.families import keys_family
from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.retry import RetryPolicy
from unlearn.runtime.topic_family import TopicFamily
from unlearn.runtime.topic_reader import TopicReadError, read_range
from unlearn.schemas.sealed import SampleKey, SealError, decode_key_record

log = logging.getLogger("unlearn.keys")


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

    # the group id starts with the reader's role (never joined): what the ACL matrix grants it
    return clients.consumer(settings, f"{settings.topic_prefix}{role}-keys-{uuid.uuid4().hex}",
                                    **{"enable.partition.eof": True, "enable.auto.commit": False})


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


    admin = clients.admin(settings)
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
        """Under runtime.retry: a broker restart (metadata or reads failing) is waited for, up to
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
                                      ) from TimeoutError("not read to its end")  # transient for runtime.retry
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
