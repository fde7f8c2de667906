"""Making a partition's processed messages durable (:class:`Checkpointer`): the steps of a
checkpoint, in order (the class docstring numbers them), and when one is due.

The rules the steps keep (a floor never passes durable state, recovery starts at the floor) are
pure functions in ``checkpoint_rules`` (``safe_floor``, ``check_recovery``); the checkpointer does
the I/O, in the order that keeps them.

Why a writer thread: a checkpoint snapshots ~9 MB per d = 768 head (encoding and two SHA-256
passes, then the broker's acknowledgement: 70-230 ms measured under a flow of adds; a rewrite
snapshots every head), and on the poll thread every delete of the worker's partitions waited for
it. The thread gets copies taken at the message boundary the floor names, so what it writes is
exactly what a checkpoint on the poll thread would have written.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from unlearn.common.checkpoint_record import Checkpoint, HeadPointer
from unlearn.infra.settings import Settings
from unlearn.streams.ledger.changelog_store import ChangelogStore
from unlearn.streams.ledger.checkpoint_rules import safe_floor
from unlearn.streams.ledger.outputs import Outputs
from unlearn.streams.ledger.owned_partitions import OwnedPartitions, PartitionState
from unlearn.streams.ledger.settings import LedgerSettings
from unlearn.streams.ledger.snapshots import HeadState

__all__ = [
    "Checkpointer",
]

log = logging.getLogger("unlearn.ledger")

#: At most this many bytes of head copies per background checkpoint (37 heads at d = 768, 5 at
#: d = 2048); a checkpoint that would copy more runs on the poll thread (a pause costs less than
#: running out of memory).
COPY_BUDGET_BYTES = 512 << 20


@dataclass(frozen=True)
class _Rewrite:
    """What a checkpoint rewrites, for the steps after the writer thread's: step 6 drops
    ``old_generation`` (None where the store trims) when ``rewriting``; step 7 marks an
    ``erasure`` rotation done when its trims (step 2's: ``heads_dropped``, and step 6's) succeeded."""

    rewriting: bool = False
    old_generation: int | None = None
    erasure: bool = False
    heads_dropped: bool = True


@dataclass(frozen=True)
class _Writing:
    """A checkpoint whose steps 4 and 5 the writer thread is doing: its floor, taken on the poll
    thread, when it started and how long the poll thread spent on it, the snapshot pointers it
    will have written (with when its record was durable), and for a rewrite what ``_finish``
    drops (step 6) and marks (step 7)."""

    floor: int
    started: float
    paused: float  # seconds the poll thread spent on it
    written: Future[tuple[dict[str, HeadPointer], float]]
    rewrite: _Rewrite = _Rewrite()


class CheckpointTimes(Protocol):
    """Where a checkpoint's times go (the worker's histograms): ``pause`` the seconds its
    partition processed nothing, ``duration`` from its start to its record being durable."""

    def observe(self, pause: float, duration: float) -> None: ...


class Checkpointer:
    """Checkpoints one worker's partitions. A checkpoint of a partition, in this order:

    1. wait until every output produced so far is durable (so no receipt or head update can be
       lost behind a floor);
    2. on an erasure rotation, or once the heads topic passed its size bound: republish every head
       at its current version, wait for it, drop the older updates (trimmed at once where the
       broker has DeleteRecords, else a new heads generation and the old one retired:
       changelog_store.py);
    3. on an erasure rotation, or once the ledger-state topic passed its size bound: start a
       rewrite (a new ledger-state generation where the store does not trim);
    4. write a snapshot of every head touched since the last checkpoint (of every head on a
       rewrite);
    5. write the partition's checkpoint record (floor = next offset to read, by ``safe_floor``);
    6. drop what step 3 superseded: DeleteRecords below the new checkpoint's first piece, or
       retire the old generation;
    7. on an erasure rotation, mark its deletes rotated away (only now, and only if the trims of
       steps 2 and 6 succeeded: a rotation cut short leaves them pending, and the checkpoint of
       step 5 says so; recovery trims below its checkpoint's pieces too);
    8. commit the floor to the consumer group (for lag monitoring only: recovery never reads it).

    A checkpoint the worker starts on its own (periodic, a rewrite, an erasure rotation) does
    steps 1 to 3 on the poll thread, then steps 4 and 5 in the writer thread (module docstring)
    from copies of the heads, while the poll thread goes on; ``advance`` does steps 6 to 8 once
    both are durable (on the poll thread: one thread asks the broker to trim and delete). A
    revoke and a clean stop checkpoint on the poll thread. A partition has at most one checkpoint
    at a time: any other checkpoint of it, a revoke and a clean stop first wait for the one being
    written (``settle``). A crash meanwhile leaves the previous checkpoint in force, as a crash
    before step 5 does.

    An erasure rotation runs ``UNLEARN_ERASURE_ROTATE_SECONDS`` after a partition's first delete
    since its last one, so no snapshot or head update taken before a delete outlives it by more
    than that (plus the heads' retire grace where generations rotate; docs/ledger-processor.md,
    "Erasure rotation"). Every delete applied before it started is covered: the head updates of
    step 2 and the copies of step 4 are taken after it; a delete applied while the thread writes
    opens the next window."""

    def __init__(self, settings: Settings, consumer: Any, store: ChangelogStore, outputs: Outputs,
                 times: CheckpointTimes | None = None) -> None:
        self.settings = settings
        self.consumer = consumer  # commits floors
        self.store = store
        self.outputs = outputs
        self.deltas_topic = settings.topic("deltas")
        self.tuning = LedgerSettings.of(settings)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-checkpoint")
        self._writing: dict[int, _Writing] = {}  # deltas partition -> its checkpoint being written
        self.times = times

    def due(self, owned: OwnedPartitions) -> list[tuple[int, bool]]:
        """(partition, erasure) of every checkpoint due now: an erasure rotation whose window
        passed, or ``checkpoint_every_messages`` / ``checkpoint_every_seconds`` since the last."""
        s, now = self.tuning, time.monotonic()
        due: list[tuple[int, bool]] = []
        for ps in owned:
            if ps.partition in self._writing:
                continue  # one at a time: due again once ``advance`` took it
            if ps.erasure_since is not None and now - ps.erasure_since >= s.erasure_rotate_seconds:
                due.append((ps.partition, True))
            elif ps.pending and (ps.pending >= s.checkpoint_every_messages
                                 or now - ps.last_checkpoint >= s.checkpoint_every_seconds):
                due.append((ps.partition, False))
        return due

    def checkpoint(self, ps: PartitionState, topic_id: str, erasure: bool = False, background: bool = False) -> None:
        """Steps 1-8 (class docstring) for ``ps``, whose state belongs to the deltas topic
        ``topic_id``. ``erasure``: the partition applied deletes since its last erasure rotation.
        ``background``: the checkpoint returns after step 2 (and step 3 of a rewrite), its steps
        4 and 5 written by the writer thread from copies (``advance`` finishes it)."""
        self.settle(ps)
        part, started = ps.partition, time.monotonic()
        self.outputs.flush("checkpoint")  # 1
        rotate_heads = erasure or self.store.needs_heads_rotation(part)
        rewriting = erasure or self.store.needs_rotation(part)
        if erasure:
            log.info("deltas partition %d: erasure rotation starts (%d heads)", part, len(ps.heads))
        dropped = True
        if rotate_heads:  # 2
            dropped = self._rewrite_heads(ps)
        old_generation = self.store.begin_rewrite(part) if rewriting else None  # 3
        if background:
            heads = self._to_snapshot(ps, every=rewriting)
            if sum(_copy_bytes(ps.heads[h].ledger.dim) for h in heads) <= COPY_BUDGET_BYTES:
                self._begin(ps, topic_id, heads, started, _Rewrite(rewriting, old_generation, erasure, dropped))
                return
        self._write_snapshots(ps, rewriting)  # 4
        floor = safe_floor(ps.next_offset, ps.last_touched,
                           {h: p.applied_offset for h, p in ps.pointers.items()})
        self.store.write_checkpoint(Checkpoint(part, floor, topic_id, dict(ps.pointers),  # 5
                                               erasure_pending=ps.erasure_since is not None and not erasure))
        if rewriting:  # 6
            dropped = self._end_rewrite(part, old_generation, ps.pointers) and dropped
        if erasure:  # 7
            self._erasure_done(ps, dropped, started, cleared=False)
        ps.pending = 0
        ps.last_checkpoint = time.monotonic()
        self._durable(ps, floor)  # 8
        if self.times is not None:
            took = time.monotonic() - started
            self.times.observe(took, took)

    def _end_rewrite(self, part: int, old_generation: int | None, pointers: dict[str, HeadPointer]) -> bool:
        """Step 6; False: the trim failed."""
        dropped = self.store.end_rewrite(part, old_generation, pointers)
        log.info("deltas partition %d: ledger state rewritten (%s)", part, "trimmed" if old_generation is None
                 else f"moved to generation {old_generation + 1}")
        return dropped

    def _erasure_done(self, ps: PartitionState, dropped: bool, started: float, cleared: bool) -> None:
        """Step 7. A rotation cut short (a trim failed) is tried again after another window, never
        in a loop; ``cleared``: the window was closed when the copies were taken (a rotation in
        the writer thread), and a delete since may have opened the next one."""
        part = ps.partition
        if not dropped:
            ps.erasure_since = ps.erasure_since if cleared and ps.erasure_since is not None else time.monotonic()
            return
        if not cleared:
            ps.erasure_since = None
        log.info("deltas partition %d: erasure rotation done: %d heads in %.3fs (%d state bytes, %d head bytes "
                 "written); %s", part, len(ps.heads), time.monotonic() - started, self.store.written.get(part, 0),
                 self.store.heads_written.get(part, 0), "older records trimmed" if self.store.trims else
                 f"the superseded heads generation goes in {self.tuning.heads_retire_seconds:.0f}s")

    def _durable(self, ps: PartitionState, floor: int) -> None:
        """Step 8, and what the partition no longer needs to remember below its new floor."""
        self._commit_floor(ps.partition, floor)
        ps.last_touched = {h: o for h, o in ps.last_touched.items() if o >= floor}

    # ---------------------------------------------------------------- in the writer thread
    def _begin(self, ps: PartitionState, topic_id: str, heads: list[str], started: float,
               rewrite: _Rewrite = _Rewrite()) -> None:
        """Steps 4 and 5 handed to the writer thread: copies of ``heads`` (those step 4 would
        snapshot), and the floor their applied offsets give (what a checkpoint on the poll thread
        would write). An erasure rotation closes the partition's window now: the copies hold every
        delete applied so far, and a delete applied while they are written opens the next one."""
        frozen: list[tuple[HeadState, HeadPointer | None]] = []
        applied = {h: p.applied_offset for h, p in ps.pointers.items()}
        for head_id in heads:
            head = ps.heads[head_id]
            frozen.append((head.frozen_state(), ps.pointers.get(head_id)))
            applied[head_id] = head.applied_offset
            head.dirty_since_snapshot = 0
        floor = safe_floor(ps.next_offset, ps.last_touched, applied)
        record = (ps.partition, floor, topic_id, dict(ps.pointers),
                  ps.erasure_since is not None and not rewrite.erasure)
        if rewrite.erasure:
            ps.erasure_since = None
        written = self._writer.submit(self._write, frozen, *record)
        ps.pending = 0
        ps.last_checkpoint = time.monotonic()
        self._writing[ps.partition] = _Writing(floor, started, ps.last_checkpoint - started, written, rewrite)

    def _write(self, frozen: list[tuple[HeadState, HeadPointer | None]], part: int, floor: int, topic_id: str,
               pointers: dict[str, HeadPointer], erasure_pending: bool) -> tuple[dict[str, HeadPointer], float]:
        """Steps 4 and 5, in the writer thread (only it writes this partition's state meanwhile);
        the pointers written, and when the record was durable."""
        written = {state.meta.head_id: self.store.write_snapshot(part, state, previous) for state, previous in frozen}
        self.store.write_checkpoint(Checkpoint(part, floor, topic_id, {**pointers, **written},
                                               erasure_pending=erasure_pending))
        return written, time.monotonic()

    def advance(self, owned: OwnedPartitions) -> None:
        """Finish the checkpoints the writer thread made durable (step 8); a failed one raises
        what it failed with (the worker stops; the restart recovers from the previous one)."""
        for part in [p for p, w in self._writing.items() if w.written.done()]:
            ps = owned.get(part)
            if ps is not None:
                self._finish(ps)
            else:
                self.forget(part)

    def settle(self, ps: PartitionState) -> None:
        """Wait for ``ps``'s checkpoint being written, if any, and finish it."""
        if ps.partition in self._writing:
            self._finish(ps)

    def _finish(self, ps: PartitionState) -> None:
        """Steps 6 to 8 of a checkpoint the writer thread made durable (on the poll thread: the
        admin client's trims and retirements stay on one thread)."""
        writing = self._writing.pop(ps.partition)
        written, durable_at = writing.written.result()
        ps.pointers.update(written)
        rewrite = writing.rewrite
        dropped = rewrite.heads_dropped
        if rewrite.rewriting:  # 6
            dropped = self._end_rewrite(ps.partition, rewrite.old_generation, ps.pointers) and dropped
        if rewrite.erasure:  # 7
            self._erasure_done(ps, dropped, writing.started, cleared=True)
        self._durable(ps, writing.floor)
        if self.times is not None:
            self.times.observe(writing.paused, durable_at - writing.started)

    def forget(self, part: int) -> None:
        """Wait for ``part``'s checkpoint being written (nothing may write a partition once it is
        given up), without finishing it: after a failure, or when the partition was lost."""
        writing = self._writing.pop(part, None)
        if writing is not None and (exc := writing.written.exception()) is not None:
            log.warning("deltas partition %d: checkpoint given up: %s", part, exc)

    def close(self) -> None:
        """Wait for the checkpoint being written, if any (none starts after this)."""
        self._writer.shutdown(wait=True, cancel_futures=True)

    # ---------------------------------------------------------------- helpers
    def _to_snapshot(self, ps: PartitionState, every: bool) -> list[str]:
        """The heads step 4 snapshots: those not in a durable snapshot yet (``every``: all)."""
        out = []
        for head_id, head in sorted(ps.heads.items()):
            ptr = ps.pointers.get(head_id)
            last = ps.last_touched.get(head_id)
            stale = ptr is None or head.dirty_since_snapshot > 0 or (last is not None and ptr.applied_offset < last)
            if every or stale:
                out.append(head_id)
        return out

    def _write_snapshots(self, ps: PartitionState, every: bool) -> None:
        """Step 4 on the poll thread."""
        for head_id in self._to_snapshot(ps, every):
            head = ps.heads[head_id]
            ps.pointers[head_id] = self.store.write_snapshot(ps.partition, head.state(), ps.pointers.get(head_id))
            head.dirty_since_snapshot = 0

    def _rewrite_heads(self, ps: PartitionState) -> bool:
        """Step 2: every head's current version republished as it stands (fast or exact), then the
        older updates go. A fast head is not reset here (55 ms per head at d = 768, on the poll
        thread): the timer's next reset publishes its exact update within
        ``reset_every_seconds``. False: the trim failed (the erasure stays pending)."""
        rewrite = self.store.begin_heads_rewrite(ps.partition)
        for _, head in sorted(ps.heads.items()):
            self.outputs.publish_head(ps.partition, head)
        self.outputs.flush("heads rotation")
        dropped = self.store.end_heads_rewrite(rewrite)
        log.info("deltas partition %d: head updates rewritten into %s", ps.partition,
                 self.store.heads_topic(ps.partition))
        return dropped

    def _commit_floor(self, part: int, floor: int) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            self.consumer.commit(offsets=[TopicPartition(self.deltas_topic, part, floor)], asynchronous=True)
        except KafkaException as exc:  # informative only (lag monitoring); the checkpoint is what counts
            log.debug("commit of partition %d floor %d: %s", part, floor, exc)


def _copy_bytes(dim: int) -> int:
    """What a head's copy holds: three d x d int64 limb matrices (the moments are d x c)."""
    return 3 * 8 * dim * dim
