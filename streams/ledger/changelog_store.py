"""The ledger's durable state in Kafka (:class:`ChangelogStore`): ledger-state topics, one per
deltas partition and generation, holding snapshot pieces (``snapshots``) and checkpoint records
(``checkpoint_rules``).

``<prefix>ledger-state.p<P>.g<G>`` holds the state of the heads whose deltas are on ``deltas``
partition P. Any worker on any host rebuilds a partition from here, so a worker has no local
state to lose or to get wrong. Recovery reads only what the latest checkpoint names: it scans the
topic backwards from its end for the last checkpoint record, then seeks to each head's pieces, so
it costs the size of the state, not the age of the log.

What the store keeps is rewritten, once a partition's ledger-state (or heads) topic passed
``UNLEARN_STATE_ROTATE_BYTES`` and ``UNLEARN_ERASURE_ROTATE_SECONDS`` after a partition applied a
delete: into the same topic and trimmed by DeleteRecords where the broker has it
(``BrokerQuirks.delete_records``), else into a new generation, the old one deleted after
``UNLEARN_HEADS_RETIRE_SECONDS`` (docs/ledger-processor.md, "Checkpoints", "Rewrites"). Recovery
does the same for heads and, where it trims, trims ledger-state below what its checkpoint needs,
so a crash between a rewrite's checkpoint and its trim leaves nothing behind.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from unlearn.common.checkpoint_record import Checkpoint, HeadPointer, checkpoint_key, latest_checkpoint
from unlearn.common.families import heads_family, state_family
from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.clients import quirks
from unlearn.runtime.delivery import produce
from unlearn.runtime.log_position import StaleStateError, watermarks
from unlearn.runtime.retry import flush_within
from unlearn.runtime.topic_reader import TopicReadError, read_range
from unlearn.runtime.topics import TopicError
from unlearn.streams.ledger.checkpoint_rules import first_needed, piece_key, plan_generations
from unlearn.streams.ledger.settings import LedgerSettings
from unlearn.streams.ledger.snapshots import (
    HeadState,
    SnapshotError,
    decode_state,
    join_pieces,
    split_pieces,
    state_buffers,
    state_sha,
)
from unlearn.streams.ledger.state_topics import StateTopics

__all__ = [
    "ChangelogStore",
    "HeadsRewrite",
    "StateStoreError",
]

#: First backward-scan window when looking for the last checkpoint record (records).
_SCAN_WINDOW = 256


class StateStoreError(RuntimeError):
    """The changelog could not be written or read (broker down past the timeout, ...).
    ``kafka_error``: the client's error behind it, if any (``runtime.retry`` classifies it)."""

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

        self.settings = settings
        self.trims = quirks(settings).delete_records  # rewrite in place and trim, or rotate (module docstring)
        self.state = state_family(settings.topic_prefix)
        self.heads = heads_family(settings.topic_prefix)
        self.generation: dict[int, int] = {}  # deltas partition -> generation being written
        self.written: dict[int, int] = {}  # deltas partition -> state bytes written to that generation
        self.heads_generation: dict[int, int] = {}  # deltas partition -> heads generation being written
        self.heads_written: dict[int, int] = {}  # deltas partition -> bytes written to that heads generation
        self.heads_rewrites: dict[int, int] = {}  # deltas partition -> heads rewrites begun (readers: TimedResets)
        self.topics = StateTopics(settings)
        self._pieces_read = 0
        self._piece_bytes_read = 0
        # One record per batch: the embedded broker's ListOffsets(latest) is only right then, and
        # the backward scan starts from it (infra.settings.BrokerQuirks.list_offsets_latest_exact).
        self.producer = clients.producer(settings, **{"batch.num.messages": 1, "linger.ms": 0})

    def close(self) -> None:
        clients.close_producer(self.producer, self.settings.admin_timeout)

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
        return self.topics.generations(self.state, partition)

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
        self._ensure_topic(self.topic(partition))  # here, so that a writer thread only produces
        return old

    def end_rewrite(self, partition: int, old: int | None, pointers: Mapping[str, HeadPointer]) -> bool:
        """The new checkpoint (naming ``pointers``) is durable: drop what it superseded. Trimmed at
        once; a superseded generation is deleted after the heads' retire grace, because other
        processes read it too (the featurizer's shredder reads checkpoint floors; a read of a topic
        being deleted crashes librdkafka, runtime.topic_reader.source_partitions), and recovery ignores
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
        existing = self.topics.generations(self.heads, partition) if fresh else [current]
        self.heads_written[partition] = 0
        self.heads_rewrites[partition] = self.heads_rewrites.get(partition, 0) + 1
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
        (runtime.topic_reader.source_partitions says why a reader must not be on a topic when it is
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
        produce(self.producer, topic=topic, key=key, value=value, partition=0, on_delivery=cb)

    def write_snapshot(self, partition: int, head: HeadState, previous: HeadPointer | None) -> HeadPointer:
        """Write a head's snapshot into the slot the previous checkpoint does not name."""
        generation = (previous.generation if previous is not None else 0) + 1
        meta = head.meta
        state = state_buffers(head)  # never joined whole: each piece is copied from the buffers
        sha = state_sha(state)
        pieces = split_pieces(state, generation, meta.applied_offset, self.settings.changelog_max_bytes, sha)
        slot = generation % 2
        offsets = self._produce_all(partition, [(piece_key(meta.head_id, slot, i), p) for i, p in enumerate(pieces)])
        return HeadPointer(generation, meta.applied_offset, sha.hex(), tuple(offsets))

    def write_checkpoint(self, cp: Checkpoint) -> None:
        self._produce_all(cp.partition, [(checkpoint_key(cp.partition), cp.encode())])

    # ---------------------------------------------------------------- reading
    def _consumer(self) -> Any:

        group = f"{self.settings.topic_prefix}ledger-recovery-{uuid.uuid4().hex}"  # never joined
        return clients.consumer(self.settings, group, **{"enable.partition.eof": True})

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
                self.topics.adopt(topic)
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
