"""The ledger's durable state in Kafka: ledger-state topics, one per deltas partition and generation.

``<prefix>ledger-state.p<P>.g<G>`` holds the state of the heads whose deltas are on ``deltas``
partition P: snapshot pieces (``head_runtime``) and checkpoint records (**The rules** below). Any worker
on any host rebuilds a partition from here, so a worker has no local state to lose or to get
wrong. Recovery reads only what the latest checkpoint names: it scans the topic backwards from
its end for the last checkpoint record, then seeks to each head's pieces, so it costs the size of
the state, not the age of the log.

What the store keeps is rewritten, once a partition's ledger-state (or heads) topic passed
``UNLEARN_STATE_ROTATE_BYTES`` and ``UNLEARN_ERASURE_ROTATE_SECONDS`` after a partition applied a
delete (the worker's erasure rotation: records taken before the delete must not outlive it,
docs/ledger-processor.md). A rewrite writes a full snapshot and a checkpoint (heads: republishes
every head as an exact update, same versions, same digests), then drops what came before:

- where the broker has DeleteRecords (``BrokerQuirks.delete_records``), into the same topic, then
  DeleteRecords below the first record the new checkpoint needs (heads: below the first
  republished update), at once: readers behind the trim point are moved to the new log start by
  ``auto.offset.reset`` and find an exact update of every head there;
- elsewhere (a broker that never compacts nor deletes records), into a new generation
  (``infra.between_stages``) ``<prefix>ledger-state.p<P>.g<G+1>`` / ``heads.p<P>.g<H+1>``, and G / H
  are deleted after ``UNLEARN_HEADS_RETIRE_SECONDS``.

Recovery does the same for heads (it republishes every restored head anyway) and, where it trims,
trims ledger-state below what its checkpoint needs, so a crash between a rewrite's checkpoint and
its trim leaves nothing behind. Stored state and head history stay within about twice the bound
per partition, plus one snapshot.

**StateTopics**: the ledger's own topics on the broker (``ledger-state`` and ``heads`` per deltas partition):
created on first use, trimmed, and deleted after a grace, through one admin client.

Created compacted, and where the broker has DeleteRecords also ``cleanup.policy=compact,delete``
with ``retention.ms=-1`` (``infra.topics.trimmed_changelog_config``): Kafka refuses DeleteRecords
on a compact-only topic. Why the store trims or rotates: the top of this docstring.

**The rules**: the ledger worker's crash-consistency rules, without I/O (docs/design.md section 4).

A ledger worker owns ``deltas`` partitions. For each one it keeps the heads whose deltas are on
that partition and, in the ``ledger-state`` changelog partition of the same number, their
snapshots plus one *checkpoint record*: the partition's **floor** (every deltas message below it
is covered by the durable snapshots the record names) and the identity of the ``deltas`` topic
the state belongs to (the record, ``infra.between_stages.Checkpoint``, is shared with the
featurizer, which reads its floor before destroying a key). Three invariants make the ledger
exact under kill -9, rebalances and broker restarts; each has a function here and a test without
a broker:

1. **A floor never passes durable state** (:func:`safe_floor`): the floor of a partition is at
   most the first offset of any head in it whose events are not all in a durable snapshot.
2. **Recovery starts at the floor, and never skips** (:func:`check_recovery`): a worker resumes
   a partition at its checkpoint's floor (not at a consumer-group offset, which a framework or an
   operator may move), and refuses state that does not belong to the log it reads: another topic
   incarnation (topic id), a floor beyond the log's end (truncated or recreated log), or a log
   that starts after the floor (events lost to retention). It raises ``infra.log_position.StaleStateError``
   naming the mismatch instead of guessing.
3. **A (head, version) pair has one digest**: versions count applied deltas messages and replay
   starts from a snapshot taken at a message boundary, so a replay recomputes the same versions
   from the same ledger states (``HeadRuntime``; tested there and by the chaos benchmark).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from unlearn.infra.between_stages import (
    Checkpoint,
    HeadPointer,
    checkpoint_key,
    heads_family,
    latest_checkpoint,
    state_family,
)
from unlearn.infra.log_position import StaleStateError, check_resume, watermarks
from unlearn.infra.retry import BrokerUnavailable, RetryPolicy, flush_within
from unlearn.infra.settings import Settings, admin_config, consumer_config, producer_config, quirks
from unlearn.infra.topic_reader import TopicReadError, read_range
from unlearn.infra.topics import TopicError, delete_records, delete_topics, ensure_topic, trimmed_changelog_config
from unlearn.streams.ledger.head_runtime import (
    HeadState,
    SnapshotError,
    decode_state,
    encode_state,
    join_pieces,
    split_pieces,
    state_sha,
)
from unlearn.streams.ledger.settings import LedgerSettings

__all__ = [
    "StateTopics",
    "check_recovery",
    "first_needed",
    "piece_key",
    "plan_generations",
    "safe_floor",
]

log = logging.getLogger("unlearn.ledger")

T = TypeVar("T")

class StateTopics:
    """Creates, lists, trims and retires the ledger's topics (module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.retiring: list[tuple[float, list[str]]] = []  # (due, superseded topics)
        self.created: set[str] = set()
        self._admin_client: Any = None
        self.retry = RetryPolicy.of(settings)  # every admin call rides through a broker restart

    def admin(self) -> Any:
        """One admin client for the store's life (creating one per call reconnects every time)."""
        if self._admin_client is None:
            from confluent_kafka.admin import AdminClient

            self._admin_client = AdminClient(admin_config(self.settings))
        return self._admin_client

    def fresh_admin(self) -> None:
        """Drop the admin client before a retry (infra.retry: its metadata may be stale)."""
        self._admin_client = None

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` under the retry policy, with a new admin client for each retry."""
        return self.retry.call(what, fn, on_retry=self.fresh_admin)

    def ensure(self, name: str) -> None:
        """Create ``name`` if this store has not yet (TopicError if it cannot)."""
        if name in self.created:
            return
        self.call(f"creating {name}", lambda: ensure_topic(
            self.settings, name, compacted=True, admin=self.admin(), config=trimmed_changelog_config(self.settings)))
        self.created.add(name)

    def delete(self, names: list[str]) -> None:
        try:
            self.call(f"deleting {names}", lambda: delete_topics(self.settings, names, admin=self.admin()))
        except (TopicError, BrokerUnavailable) as exc:  # only space: say so, go on (the next rotation retries nothing)
            log.warning("could not delete superseded topics %s: %s", names, exc)
        self.created.difference_update(names)

    def listed(self) -> list[str]:
        """Every topic on the broker (whole-cluster metadata: naming a topic would auto-create
        it on the embedded broker)."""
        return list(self.call("listing topics", lambda: self.admin().list_topics(
            timeout=self.settings.admin_timeout).topics))

    def retire(self, names: list[str]) -> None:
        """Delete ``names`` once readers have had ``UNLEARN_HEADS_RETIRE_SECONDS`` to move off
        them (infra.topic_reader.source_partitions says why a reader must not be on a topic when it
        is deleted)."""
        if names:
            self.retiring.append((time.monotonic() + LedgerSettings.of(self.settings).heads_retire_seconds, names))

    def retire_due(self) -> None:
        """Delete the retired topics whose grace period is over (cheap when none is)."""
        if not self.retiring or self.retiring[0][0] > time.monotonic():
            return
        now = time.monotonic()
        due = [t for at, names in self.retiring if at <= now for t in names]
        self.retiring = [(at, names) for at, names in self.retiring if at > now]
        self.delete(due)

    def trim(self, topic: str, below: int) -> bool:
        """DeleteRecords below ``below`` on ``topic`` partition 0; False if the broker refused
        (logged: retried by the next rewrite or recovery, the erasure stays pending). DeleteRecords
        is idempotent: a transient error is asked again within the retry deadline."""
        try:
            self.call(f"trimming {topic}", lambda: delete_records(self.settings, {(topic, 0): below},
                                                                         admin=self.admin()))
        except (TopicError, BrokerUnavailable) as exc:
            log.warning("could not trim %s below offset %d: %s", topic, below, exc)
            return False
        log.debug("trimmed %s below offset %d", topic, below)
        return True

    def end_offset(self, topic: str) -> int:
        """One past the last record of ``topic`` partition 0 (ListOffsets latest: exact on every
        broker that trims, and never too high elsewhere, so trimming below it keeps all newer).
        A leader or epoch change (FENCED_LEADER_EPOCH after a restart) is asked again within the
        retry deadline; TopicError if the broker refuses, BrokerUnavailable if it stays away."""
        from confluent_kafka import KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        timeout = self.settings.admin_timeout
        tp = TopicPartition(topic, 0)

        def ask() -> int:
            try:
                fut = self.admin().list_offsets({tp: OffsetSpec.latest()}, request_timeout=timeout)[tp]
                return int(fut.result(timeout=timeout).offset)
            except (KafkaException, TimeoutError) as exc:
                raise TopicError(f"cannot read the end of {topic}: {exc}") from exc
        return self.call(f"reading the end of {topic}", ask)


_FIX = ("delete the ledger-state topic to rebuild every head from the deltas log, or point the worker at the "
        "broker and topics its state came from")


def plan_generations(found: Mapping[int, bool]) -> tuple[int | None, list[int], int]:
    """Which generation to recover from, which to delete, and the next one to write.

    ``found``: generation -> whether it holds a checkpoint record. The newest generation with a
    checkpoint wins (a newer one without is a rotation that crashed before its checkpoint, and an
    older one is superseded): both kinds are deleted. With no checkpoint anywhere, nothing is
    recovered and every generation is deleted."""
    with_cp = sorted(g for g, has in found.items() if has)
    use = with_cp[-1] if with_cp else None
    delete = sorted(g for g in found if g != use)
    next_gen = use if use is not None else (max(found) + 1 if found else 0)
    return use, delete, next_gen


def first_needed(pointers: Mapping[str, HeadPointer]) -> int | None:
    """The lowest ledger-state offset a checkpoint naming ``pointers`` needs: its first snapshot
    piece (the checkpoint record itself is written after every piece it names). Everything below
    may be trimmed; None (no head) trims nothing."""
    return min((o for p in pointers.values() for o in p.piece_offsets), default=None)


def piece_key(head_id: str, slot: int, index: int) -> bytes:
    """Changelog key of a snapshot piece. Two slots (double buffering), so that on a compacting
    broker the pieces a checkpoint names are still the latest values of their keys until a newer
    checkpoint names the other slot."""
    return f"piece/{head_id}/{slot}/{index}".encode()


def safe_floor(next_offset: int, last_touched: Mapping[str, int], durable: Mapping[str, int]) -> int:
    """The highest floor that does not pass durable state (invariant 1).

    ``next_offset``: one past the last deltas message processed in the partition;
    ``last_touched``: head -> offset of its last message processed; ``durable``: head -> applied
    offset of its latest durable snapshot (absent: none). A head with events beyond its durable
    snapshot holds the floor at its durable offset + 1 (the first of its events that could be
    lost), whatever other heads did.
    """
    floor = next_offset
    for head, last in last_touched.items():
        done = durable.get(head, -1)
        if done < last:
            floor = min(floor, done + 1)
    return floor


def check_recovery(cp: Checkpoint | None, topic_id: str, log_start: int, log_end: int) -> int:
    """Where to resume a partition, or ``StaleStateError`` (invariant 2).

    ``log_start``/``log_end``: the first offset and one past the last offset the deltas partition
    holds now; ``topic_id``: the deltas topic's id now ("" where the broker has none)."""
    what = "ledger state" if cp is None else f"ledger state of deltas partition {cp.partition}"
    return check_resume(what, None if cp is None else cp.floor, "" if cp is None else cp.topic_id, topic_id,
                        log_start, log_end, _FIX)


#: First backward-scan window when looking for the last checkpoint record (records).
_SCAN_WINDOW = 256


class StateStoreError(RuntimeError):
    """The changelog could not be written or read (broker down past the timeout, ...).
    ``kafka_error``: the client's error behind it, if any (``infra.retry`` classifies it)."""

    kafka_error: Any = None


Record = tuple[int, bytes | None, bytes | None]  # (offset, key, value)


@dataclass(frozen=True)
class HeadsRewrite:
    """What ``end_heads_rewrite`` drops once every head is republished: older generation topics
    (after the retire grace) and, where the store trims, the records of ``topic`` below ``below``."""

    superseded: list[str] = field(default_factory=list)
    topic: str = ""
    below: int | None = None


class ChangelogStore:
    """Writes snapshots and checkpoints of ``deltas`` partitions; reads them back."""

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import Producer

        self.settings = settings
        self.trims = quirks(settings).delete_records  # rewrite in place and trim, or rotate (module docstring)
        self.state = state_family(settings.topic_prefix)
        self.heads = heads_family(settings.topic_prefix)
        self.generation: dict[int, int] = {}  # deltas partition -> generation being written
        self.written: dict[int, int] = {}  # deltas partition -> state bytes written to that generation
        self.heads_generation: dict[int, int] = {}  # deltas partition -> heads generation being written
        self.heads_written: dict[int, int] = {}  # deltas partition -> bytes written to that heads generation
        self.topics = StateTopics(settings)
        self._pieces_read = 0
        self._piece_bytes_read = 0
        # One record per batch: the embedded broker's ListOffsets(latest) is only right then, and
        # the backward scan starts from it (infra.settings.BrokerQuirks.list_offsets_latest_exact).
        self.producer = Producer(producer_config(settings, **{"batch.num.messages": 1, "linger.ms": 0}))

    def close(self) -> None:
        self.producer.flush(self.settings.admin_timeout)

    def topic(self, partition: int) -> str:
        return self.state.topic(partition, self.generation.get(partition, 0))

    def heads_topic(self, partition: int) -> str:
        """Where the partition's head updates go now (created on first use)."""
        topic = self.heads.topic(partition, self.heads_generation.get(partition, 0))
        self._ensure_topic(topic)
        return topic

    def count_head_bytes(self, partition: int, size: int) -> None:
        self.heads_written[partition] = self.heads_written.get(partition, 0) + size

    # ---------------------------------------------------------------- generations
    def _ensure_topic(self, name: str) -> None:
        try:
            self.topics.ensure(name)
        except TopicError as exc:
            raise StateStoreError(str(exc)) from exc

    def generations(self, partition: int) -> list[int]:
        """Generations of ``partition``'s ledger-state that exist on the broker."""
        return self.state.generations(self.topics.listed(), partition)

    def needs_rotation(self, partition: int) -> bool:
        return self.written.get(partition, 0) >= LedgerSettings.of(self.settings).state_rotate_bytes

    def needs_heads_rotation(self, partition: int) -> bool:
        return self.heads_written.get(partition, 0) >= LedgerSettings.of(self.settings).state_rotate_bytes

    def begin_rewrite(self, partition: int) -> int | None:
        """Start rewriting ``partition``'s state (module docstring); the caller then writes a full
        snapshot and a checkpoint, then calls ``end_rewrite``. Returns the generation superseded
        (None where the store trims: writes stay in the same topic)."""
        self.written[partition] = 0
        if self.trims:
            return None
        old = self.generation.get(partition, 0)
        self.generation[partition] = old + 1
        return old

    def end_rewrite(self, partition: int, old: int | None, pointers: Mapping[str, HeadPointer]) -> bool:
        """The new checkpoint (naming ``pointers``) is durable: drop what it superseded. Trimmed at
        once; a superseded generation is deleted after the heads' retire grace, because other
        processes read it too (the featurizer's shredder reads checkpoint floors; a read of a topic
        being deleted crashes librdkafka, infra.topic_reader.source_partitions), and recovery ignores
        it meanwhile (it takes the newest generation holding a checkpoint). False: the trim failed
        (logged; the caller keeps the erasure pending)."""
        if old is None:
            return self.trim_state(partition, pointers)
        self.topics.retire([self.state.topic(partition, old)])
        return True

    def trim_state(self, partition: int, pointers: Mapping[str, HeadPointer]) -> bool:
        """DeleteRecords below the first record a checkpoint naming ``pointers`` needs (its pieces;
        the checkpoint record comes after them). False if the broker refused (logged)."""
        below = first_needed(pointers)
        return below is None or self.topics.trim(self.topic(partition), below)

    def begin_heads_rewrite(self, partition: int, fresh: bool = False) -> HeadsRewrite:
        """Start republishing every head of ``partition`` (module docstring); pass the answer to
        ``end_heads_rewrite`` once every head is republished and durable. ``fresh`` (recovery):
        supersede every generation but the one written to (the newest, where the store trims)."""
        current = self.heads_generation.get(partition, 0)
        existing = self.heads.generations(self.topics.listed(), partition) if fresh else [current]
        self.heads_written[partition] = 0
        if self.trims:
            keep = max([current, *existing]) if fresh else current
            self.heads_generation[partition] = keep
            topic = self.heads_topic(partition)
            try:
                end = self.topics.end_offset(topic)
            except TopicError as exc:  # the broker refused: the rewrite cannot start safely
                raise StateStoreError(str(exc)) from exc
            return HeadsRewrite([self.heads.topic(partition, g) for g in existing if g != keep], topic, end)
        self.heads_generation[partition] = max([current, *existing]) + 1
        return HeadsRewrite([self.heads.topic(partition, g) for g in existing])

    def end_heads_rewrite(self, rewrite: HeadsRewrite) -> bool:
        """Every head is republished: trim below the first republished update at once, and delete
        superseded topics once readers have had ``UNLEARN_HEADS_RETIRE_SECONDS`` to move off them
        (infra.topic_reader.source_partitions says why a reader must not be on a topic when it is
        deleted). False: the trim failed (logged)."""
        self.topics.retire(rewrite.superseded)
        return rewrite.below is None or self.topics.trim(rewrite.topic, rewrite.below)

    def retire_due(self) -> None:
        """Delete the superseded generations whose grace period is over (cheap when none is)."""
        self.topics.retire_due()

    # ---------------------------------------------------------------- writing
    def _produce_all(self, partition: int, records: list[tuple[bytes, bytes]]) -> list[int]:
        """Produce ``records`` to ``partition`` and wait until each is durable; their offsets.
        Written again whole after a transient delivery error: a duplicate is harmless (pieces are
        addressed by the offsets returned, the latest checkpoint record wins)."""
        topic = self.topic(partition)
        self._ensure_topic(topic)
        return self.topics.retry.call(f"writing {topic}", lambda: self._produce_once(partition, topic, records))

    def _produce_once(self, partition: int, topic: str, records: list[tuple[bytes, bytes]]) -> list[int]:
        offsets: list[int | None] = [None] * len(records)
        errors: list[Any] = []  # KafkaErrors of failed deliveries

        def on_delivery(i: int) -> Callable[[Any, Any], None]:
            return lambda err, msg: errors.append(err) if err is not None else offsets.__setitem__(i, msg.offset())

        for i, (key, value) in enumerate(records):
            self._produce(topic, key, value, on_delivery(i))
            self.written[partition] = self.written.get(partition, 0) + len(key) + len(value)
        flush_within(self.producer, self.topics.retry, f"writing {topic}")
        if errors or any(o is None for o in offsets):
            failed = StateStoreError(f"writing {topic} failed: {[str(e) for e in errors[:3]]}")
            failed.kafka_error = errors[0] if errors else None
            raise failed
        return [int(o) for o in offsets if o is not None]

    def _produce(self, topic: str, key: bytes, value: bytes, cb: Callable[[Any, Any], None]) -> None:
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, partition=0, on_delivery=cb)
                return
            except BufferError:  # local queue full: let deliveries drain
                self.producer.poll(0.1)

    def write_snapshot(self, partition: int, head: HeadState, previous: HeadPointer | None) -> HeadPointer:
        """Write a head's snapshot into the slot the previous checkpoint does not name."""
        generation = (previous.generation if previous is not None else 0) + 1
        meta = head.meta
        state = encode_state(head)
        pieces = split_pieces(state, generation, meta.applied_offset, self.settings.changelog_max_bytes)
        slot = generation % 2
        offsets = self._produce_all(partition, [(piece_key(meta.head_id, slot, i), p) for i, p in enumerate(pieces)])
        return HeadPointer(generation, meta.applied_offset, state_sha(state).hex(), tuple(offsets))

    def write_checkpoint(self, cp: Checkpoint) -> None:
        self._produce_all(cp.partition, [(checkpoint_key(cp.partition), cp.encode())])

    # ---------------------------------------------------------------- reading
    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        group = f"{self.settings.topic_prefix}ledger-recovery-{uuid.uuid4().hex}"  # never joined
        return Consumer(consumer_config(self.settings, group, **{"enable.partition.eof": True}))

    def recover(self, partition: int) -> tuple[Checkpoint | None, dict[str, HeadState]]:
        """The latest checkpoint of ``partition`` and the heads it names (verified snapshots).
        Superseded generations, and a newer one a crashed rotation left without a checkpoint,
        are deleted; writes continue in the generation recovered from. Read again from the start
        on a transient broker error (reads, deletes and trims: all safe to repeat)."""
        return self.topics.call(f"recovering ledger-state of deltas partition {partition}",
                                      lambda: self._recover(partition))

    def _recover(self, partition: int) -> tuple[Checkpoint | None, dict[str, HeadState]]:
        c = self._consumer()
        try:
            found: dict[int, Checkpoint | None] = {}
            existing = self.generations(partition)
            for gen in reversed(existing):
                found[gen] = self._find_checkpoint(c, self.state.topic(partition, gen), partition)
                if found[gen] is not None:
                    break  # older generations are superseded; no need to read them
            older = [g for g in existing if g not in found]
            use, delete, next_gen = plan_generations({**{g: cp is not None for g, cp in found.items()},
                                                      **dict.fromkeys(older, False)})
            self.topics.delete([self.state.topic(partition, g) for g in delete])
            self.generation[partition] = next_gen
            self.written[partition] = 0
            cp = found.get(use) if use is not None else None
            heads: dict[str, HeadState] = {}
            if cp is not None and use is not None:
                topic = self.state.topic(partition, use)
                self.topics.created.add(topic)
                for head_id, ptr in cp.heads.items():
                    heads[head_id] = self._read_head(c, topic, head_id, ptr)
                if self.trims:  # a rewrite that crashed before its trim: done now
                    self.trim_state(partition, cp.heads)
                self.written[partition] = self._estimate_size(c, topic, cp)
            return cp, heads
        finally:
            c.close()

    def _find_checkpoint(self, c: Any, topic: str, partition: int) -> Checkpoint | None:
        low, high = watermarks(c, topic, 0, self.settings.admin_timeout)
        low, high = max(0, int(low)), max(0, int(high))
        stop: int | None = None  # None: to the topic's end
        window = _SCAN_WINDOW
        start = max(low, high - window)
        while True:
            cp = latest_checkpoint(self._read_range(c, topic, start, stop), partition)
            if cp is not None or start <= low:
                return cp
            stop, window = start, window * 4
            start = max(low, start - window)

    def _read_range(self, c: Any, topic: str, start: int, stop: int | None) -> list[Record]:
        """Records at offsets [start, stop) of a ledger-state topic (``stop`` None: to its end)."""
        try:
            return read_range(c, topic, 0, start, stop, self.settings.admin_timeout)
        except TopicReadError as exc:
            raise StateStoreError(str(exc)) from exc

    def _estimate_size(self, c: Any, topic: str, cp: Checkpoint) -> int:
        """Bytes a recovered generation holds, from its record count and the size of the pieces
        the checkpoint names, so a worker that restarts often still rotates."""
        low, high = watermarks(c, topic, 0, self.settings.admin_timeout)
        pieces = sum(len(p.piece_offsets) for p in cp.heads.values())
        per_record = self._piece_bytes_read / max(1, self._pieces_read) if pieces else 0
        return int(max(0, int(high) - max(0, int(low))) * per_record)

    def _read_head(self, c: Any, topic: str, head_id: str, ptr: HeadPointer) -> HeadState:
        want = set(ptr.piece_offsets)
        found: dict[int, bytes | None] = {}
        for lo, hi in _runs(sorted(want)):
            for offset, _key, value in self._read_range(c, topic, lo, hi + 1):
                if offset in want:
                    found[offset] = value
                    self._pieces_read += 1
                    self._piece_bytes_read += len(value or b"")
        try:
            state = decode_state(join_pieces(ptr.generation, ptr.applied_offset, ptr.sha256,
                                             [found.get(o) for o in ptr.piece_offsets]))
        except (SnapshotError, ValueError) as exc:
            raise StaleStateError(f"snapshot of head {head_id!r} in {topic} does not verify: {exc}") from None
        if state.meta.head_id != head_id:
            raise StaleStateError(f"snapshot named for head {head_id!r} holds head {state.meta.head_id!r}")
        return state


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted offsets -> inclusive (first, last) runs, so contiguous pieces are read in one pass."""
    runs: list[tuple[int, int]] = []
    for o in offsets:
        if runs and o <= runs[-1][1] + 64:  # small gaps (other heads' pieces) are cheaper to read through
            runs[-1] = (runs[-1][0], o)
        else:
            runs.append((o, o))
    return runs
