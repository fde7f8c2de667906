"""The featurizer's per-sample data keys: :class:`KeyStore`, one key family's partitions this
featurizer owns (``subject-keys``, or the private transit keys' ``transit-private``).

Partition P of a key family belongs to whoever owns by-head partition P (like its feature cache).
New keys are acknowledged (:meth:`KeyStore.flush`) before the batch that uses them commits.
Destroying keys writes tombstones; where the broker compacts (``BrokerQuirks.compaction_runs``) a
completion record appended ``UNLEARN_SEGMENT_MS`` later rolls their segment for the cleaner,
elsewhere the partition rotates to a new generation without them and the old one is deleted
after ``UNLEARN_KEYS_RETIRE_SECONDS``. Why: docs/erasure.md, section 2. The generation topics
themselves (creation, listing, deletion after the grace, the admin client) are held by
``runtime.family_topics``; reading: ``common``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from unlearn.common.families import keys_family
from unlearn.common.key_ring import COMPLETE_KEY, KeyGeneration, SampleRef, key_record_key, read_partition_keys
from unlearn.infra.settings import ErasureSettings, Settings
from unlearn.runtime import clients
from unlearn.runtime.clients import quirks
from unlearn.runtime.delivery import Acks, produce_acked
from unlearn.runtime.family_topics import FamilyTopics
from unlearn.runtime.retry import RetryPolicy
from unlearn.runtime.topic_family import TopicFamily
from unlearn.runtime.topics import TopicError, key_family_config
from unlearn.schemas.sealed import SampleKey, encode_key_record, new_key
from unlearn.streams.featurizer.featurizer_errors import KeyStoreError

__all__ = ["KeyStore"]

log = logging.getLogger("unlearn.featurizer.erasure")


class KeyStore:
    """Keys of the by-head partitions this featurizer owns, in one key family (default: the
    sample keys' ``subject-keys``). ``share``: a key store whose producer and admin client this one
    uses (one set of librdkafka threads for both families). ``topics``: the family's generation
    topics (``FamilyTopics``: grace ``UNLEARN_KEYS_RETIRE_SECONDS``, ``key_family_config``)."""

    def __init__(self, settings: Settings, family: TopicFamily | None = None, share: KeyStore | None = None) -> None:

        self.settings = settings
        self.family = family or keys_family(settings.topic_prefix)
        self.gens: dict[int, KeyGeneration] = {}
        self.next_gen: dict[int, int] = {}  # partition -> next generation to write (above every existing one)
        self.current: dict[tuple[str, str], SampleKey] = {}  # (head, sample) -> its newest key
        self._staged: list[tuple[str, bytes, bytes | None]] = []  # (topic, record key, value)
        self._sending: Acks | None = None  # keys produced by send(), awaited by flush()
        # compaction instead of rotation (module docstring): topic -> when to append the record that
        # rolls its tombstones' segment, and when its newest tombstone was written
        self.compacts = quirks(settings).compaction_runs
        self.rolls: dict[str, float] = {}
        self._tombstoned: dict[str, float] = {}
        self.producer: Any = share.producer if share else clients.producer(self.settings, **{"linger.ms": 0})
        self._owns_producer = share is None
        self.topics: FamilyTopics = FamilyTopics(
            settings, grace_s=ErasureSettings.of(settings).keys_retire_seconds, config=key_family_config(settings),
            share=share.topics if share else None)

    # ------------------------------------------------------------------ ownership
    def load(self, partition: int) -> None:
        """Take partition ``partition`` over: read its newest complete generation (creating
        generation 0 if there is none); newer incomplete ones are deleted after the grace period."""
        def read() -> tuple[list[str], KeyGeneration | None]:  # listing and reading again together, a new reader
            names = self.topics.topic_names()
            return names, read_partition_keys(self.settings, self.family, names, partition, role="featurizer")
        topics, gen = self.topics.call(f"reading the keys of partition {partition}", read)
        if gen is None:
            topic = self.family.topic(partition, 0)
            self._ensure(topic)
            gen = KeyGeneration(partition, 0, topic, complete=True)
            self._produce_acked([(topic, COMPLETE_KEY, b"1")])
        existing = self.family.generations(topics, partition)
        # never reuse a number: an incomplete newer generation (a crashed rotation) is being retired
        self.next_gen[partition] = max([gen.generation, *existing]) + 1
        self.topics.retire([self.family.topic(partition, g) for g in existing if g != gen.generation])
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
        Returns how many. Waits up to UNLEARN_BROKER_RETRY_SECONDS (runtime.retry): while the
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
        self.topics.retire([gen.topic])
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
        return self.topics.retire_due(force)

    # ------------------------------------------------------------------ I/O
    def _ensure(self, topic: str) -> None:
        try:  # runtime.retry: creating a topic that exists is no error
            self.topics.ensure(topic)
        except TopicError as exc:
            raise KeyStoreError(str(exc)) from None

    def _produce_acked(self, records: Sequence[tuple[str, bytes, bytes | None]]) -> None:
        produce_acked(self.producer, [{"topic": t, "key": key, "value": v, "partition": 0} for t, key, v in records],
                      timeout=RetryPolicy.of(self.settings).deadline_s, error=KeyStoreError)

    def close(self) -> None:
        """Flush the producer; close it too unless another store lent it (that one closes it)."""
        if self._owns_producer:
            clients.close_producer(self.producer, self.settings.admin_timeout)
        else:
            self.producer.flush(self.settings.admin_timeout)
