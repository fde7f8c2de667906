"""The ledger's durable state in Kafka: ledger-state topics, one per deltas partition and generation.

``<prefix>ledger-state.p<P>.g<G>`` holds the state of the heads whose deltas are on ``deltas``
partition P: snapshot pieces (see snapshot.py) and checkpoint records (checkpoint.py). Any worker
on any host rebuilds a partition from here, so a worker has no local state to lose or to get
wrong. Recovery reads only what the latest checkpoint names: it scans the topic backwards from
its end for the last checkpoint record, then seeks to each head's pieces, so it costs the size of
the state, not the age of the log.

Generations (``infra.between_stages``) bound what is stored on a broker that never compacts: once
a partition's ledger-state topic passes ``UNLEARN_STATE_ROTATE_BYTES``, the worker writes a full
snapshot and a checkpoint into generation G+1, then deletes G. Its head updates
(``<prefix>heads.p<P>.g<H>``) rotate the same way on their own counter: every head of the
partition is republished into H+1 (same versions, same digests), then H is deleted; recovery,
which republishes every restored head anyway, always starts a new heads generation. Stored state
and head history therefore stay within about twice the bound per partition, plus one snapshot.
Both also rotate, whatever their size, ``UNLEARN_ERASURE_ROTATE_SECONDS`` after a partition
applied a delete (the worker's erasure rotation): the generations they leave hold aggregates
taken before the delete, which must not outlive it (docs/ledger-processor.md).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from unlearn.infra.between_stages import (
    Checkpoint,
    HeadPointer,
    checkpoint_key,
    heads_family,
    latest_checkpoint,
    state_family,
)
from unlearn.infra.log_position import StaleStateError, watermarks
from unlearn.infra.settings import Settings, consumer_config, producer_config
from unlearn.infra.topic_reader import TopicReadError, read_range
from unlearn.infra.topics import TopicError, delete_topics, ensure_topic
from unlearn.streams.ledger.settings import LedgerSettings

from .checkpoint import piece_key, plan_generations
from .snapshot import HeadState, SnapshotError, decode_state, encode_state, join_pieces, split_pieces, state_sha

log = logging.getLogger("unlearn.ledger")

#: First backward-scan window when looking for the last checkpoint record (records).
_SCAN_WINDOW = 256


class StateStoreError(RuntimeError):
    """The changelog could not be written or read (broker down past the timeout, ...)."""


Record = tuple[int, bytes | None, bytes | None]  # (offset, key, value)


class ChangelogStore:
    """Writes snapshots and checkpoints of ``deltas`` partitions; reads them back."""

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import Producer

        self.settings = settings
        self.state = state_family(settings.topic_prefix)
        self.heads = heads_family(settings.topic_prefix)
        self.generation: dict[int, int] = {}  # deltas partition -> generation being written
        self.written: dict[int, int] = {}  # deltas partition -> state bytes written to that generation
        self.heads_generation: dict[int, int] = {}  # deltas partition -> heads generation being written
        self.heads_written: dict[int, int] = {}  # deltas partition -> bytes written to that heads generation
        self.retiring: list[tuple[float, list[str]]] = []  # (due, superseded topics)
        self._created: set[str] = set()
        self._admin_client: Any = None
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
    def _admin(self) -> Any:
        """One admin client for the store's life (creating one per call reconnects every time)."""
        if self._admin_client is None:
            from confluent_kafka.admin import AdminClient

            from unlearn.infra.settings import admin_config

            self._admin_client = AdminClient(admin_config(self.settings))
        return self._admin_client

    def _ensure_topic(self, name: str) -> None:
        if name in self._created:
            return
        try:
            ensure_topic(self.settings, name, compacted=True, admin=self._admin())
        except TopicError as exc:
            raise StateStoreError(str(exc)) from None
        self._created.add(name)

    def _delete_topics(self, names: list[str]) -> None:
        try:
            delete_topics(self.settings, names, admin=self._admin())
        except TopicError as exc:  # only space: say so, go on (the next rotation retries nothing)
            log.warning("could not delete superseded topics %s: %s", names, exc)
        self._created.difference_update(names)

    def _topics(self) -> list[str]:
        """Every topic on the broker (whole-cluster metadata: naming a topic would auto-create
        it on the embedded broker)."""
        return list(self._admin().list_topics(timeout=self.settings.admin_timeout).topics)

    def generations(self, partition: int) -> list[int]:
        """Generations of ``partition``'s ledger-state that exist on the broker."""
        return self.state.generations(self._topics(), partition)

    def needs_rotation(self, partition: int) -> bool:
        return self.written.get(partition, 0) >= LedgerSettings.of(self.settings).state_rotate_bytes

    def needs_heads_rotation(self, partition: int) -> bool:
        return self.heads_written.get(partition, 0) >= LedgerSettings.of(self.settings).state_rotate_bytes

    def begin_generation(self, partition: int) -> int:
        """Switch writes of ``partition`` to a new, empty generation; returns the old one. The
        caller then writes a full snapshot and a checkpoint, then calls ``end_generation``."""
        old = self.generation.get(partition, 0)
        self.generation[partition] = old + 1
        self.written[partition] = 0
        return old

    def end_generation(self, partition: int, old: int) -> None:
        """The new generation holds a checkpoint: the old one is superseded. It is deleted after
        the same grace period as superseded heads topics, because other processes read it too
        (the featurizer's shredder reads checkpoint floors; a read of a topic being deleted
        crashes librdkafka, infra.topic_reader.source_partitions); recovery ignores it meanwhile,
        since it takes the newest generation holding a checkpoint."""
        self.retiring.append((time.monotonic() + LedgerSettings.of(self.settings).heads_retire_seconds,
                              [self.state.topic(partition, old)]))

    def begin_heads_generation(self, partition: int, fresh: bool = False) -> list[str]:
        """Switch the partition's head updates to a new heads topic; returns the topics it
        supersedes, to delete (``end_heads_generation``) once every head has been republished
        into the new one. ``fresh`` (recovery): supersede whatever generations exist."""
        current = self.heads_generation.get(partition, 0)
        old = self.heads.generations(self._topics(), partition) if fresh else [current]
        self.heads_generation[partition] = max([current, *old]) + 1
        self.heads_written[partition] = 0
        return [self.heads.topic(partition, g) for g in old]

    def end_heads_generation(self, superseded: list[str]) -> None:
        """Every head is in the new generation: delete the superseded topics once readers have had
        ``UNLEARN_HEADS_RETIRE_SECONDS`` to move off them (infra.topic_reader.source_partitions
        says why a reader must not be on a topic when it is deleted)."""
        if superseded:
            self.retiring.append((time.monotonic() + LedgerSettings.of(self.settings).heads_retire_seconds, superseded))

    def retire_due(self) -> None:
        """Delete the superseded heads and ledger-state topics whose grace period is over (cheap when
        none is)."""
        if not self.retiring or self.retiring[0][0] > time.monotonic():
            return
        now = time.monotonic()
        due = [t for at, names in self.retiring if at <= now for t in names]
        self.retiring = [(at, names) for at, names in self.retiring if at > now]
        self._delete_topics(due)

    # ---------------------------------------------------------------- writing
    def _produce_all(self, partition: int, records: list[tuple[bytes, bytes]]) -> list[int]:
        """Produce ``records`` to ``partition`` and wait until each is durable; their offsets."""
        offsets: list[int | None] = [None] * len(records)
        errors: list[str] = []

        def on_delivery(i: int) -> Callable[[Any, Any], None]:
            def cb(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    offsets[i] = msg.offset()
            return cb

        topic = self.topic(partition)
        self._ensure_topic(topic)
        for i, (key, value) in enumerate(records):
            self._produce(topic, key, value, on_delivery(i))
            self.written[partition] = self.written.get(partition, 0) + len(key) + len(value)
        remaining = self.producer.flush(self.settings.admin_timeout)
        if remaining or errors or any(o is None for o in offsets):
            raise StateStoreError(f"writing {topic} failed: {errors[:3] or f'{remaining} records not delivered'}")
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
        are deleted; writes continue in the generation recovered from."""
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
            self._delete_topics([self.state.topic(partition, g) for g in delete])
            self.generation[partition] = next_gen
            self.written[partition] = 0
            cp = found.get(use) if use is not None else None
            heads: dict[str, HeadState] = {}
            if cp is not None and use is not None:
                topic = self.state.topic(partition, use)
                self._created.add(topic)
                for head_id, ptr in cp.heads.items():
                    heads[head_id] = self._read_head(c, topic, head_id, ptr)
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
            raise StateStoreError(str(exc)) from None

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
