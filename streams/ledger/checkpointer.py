"""Making a partition's processed messages durable (:class:`Checkpointer`): the steps of a
checkpoint, in order (the class docstring numbers them), and when one is due.

The rules the steps keep (a floor never passes durable state, recovery starts at the floor) are
pure functions in ``checkpoint_rules`` (``safe_floor``, ``check_recovery``); the checkpointer does
the I/O, in the order that keeps them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from unlearn.infra.settings import Settings
from unlearn.streams.ledger.changelog_store import ChangelogStore
from unlearn.streams.ledger.checkpoint_rules import safe_floor
from unlearn.streams.ledger.outputs import Outputs
from unlearn.streams.ledger.owned_partitions import OwnedPartitions, PartitionState
from unlearn.streams.ledger.settings import LedgerSettings
from unlearn.streams.shared.checkpoint_record import Checkpoint

__all__ = [
    "Checkpointer",
]

log = logging.getLogger("unlearn.ledger")


class Checkpointer:
    """Checkpoints one worker's partitions. A checkpoint of a partition, in this order:

    1. wait until every output produced so far is durable (so no receipt or head update can be
       lost behind a floor);
    2. on an erasure rotation, or once the heads topic passed its size bound: republish every head
       as an exact update, wait for it, drop the older updates (trimmed at once where the broker
       has DeleteRecords, else a new heads generation and the old one retired: changelog_store.py);
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

    An erasure rotation runs ``UNLEARN_ERASURE_ROTATE_SECONDS`` after a partition's first delete
    since its last one, so no snapshot or head update taken before a delete outlives it by more
    than that (plus the heads' retire grace where generations rotate; docs/ledger-processor.md,
    "Erasure rotation"). Every delete applied so far is covered: no message is processed while a
    checkpoint runs."""

    def __init__(self, settings: Settings, consumer: Any, store: ChangelogStore, outputs: Outputs) -> None:
        self.settings = settings
        self.consumer = consumer  # commits floors
        self.store = store
        self.outputs = outputs
        self.deltas_topic = settings.topic("deltas")
        self.tuning = LedgerSettings.of(settings)

    def due(self, owned: OwnedPartitions) -> list[tuple[int, bool]]:
        """(partition, erasure) of every checkpoint due now: an erasure rotation whose window
        passed, or ``checkpoint_every_messages`` / ``checkpoint_every_seconds`` since the last."""
        s, now = self.tuning, time.monotonic()
        due: list[tuple[int, bool]] = []
        for ps in owned:
            if ps.erasure_since is not None and now - ps.erasure_since >= s.erasure_rotate_seconds:
                due.append((ps.partition, True))
            elif ps.pending and (ps.pending >= s.checkpoint_every_messages
                                 or now - ps.last_checkpoint >= s.checkpoint_every_seconds):
                due.append((ps.partition, False))
        return due

    def checkpoint(self, ps: PartitionState, topic_id: str, erasure: bool = False) -> None:
        """Steps 1-8 (class docstring) for ``ps``, whose state belongs to the deltas topic
        ``topic_id``. ``erasure``: the partition applied deletes since its last erasure rotation."""
        part, started = ps.partition, time.monotonic()
        self.outputs.flush("checkpoint")  # 1
        if erasure:
            log.info("deltas partition %d: erasure rotation starts (%d heads)", part, len(ps.heads))
        dropped = True
        if erasure or self.store.needs_heads_rotation(part):  # 2
            dropped = self._rewrite_heads(ps)
        rewriting = erasure or self.store.needs_rotation(part)
        old_generation = self.store.begin_rewrite(part) if rewriting else None  # 3
        self._write_snapshots(ps, rewriting)  # 4
        floor = safe_floor(ps.next_offset, ps.last_touched,
                           {h: p.applied_offset for h, p in ps.pointers.items()})
        self.store.write_checkpoint(Checkpoint(part, floor, topic_id, dict(ps.pointers),  # 5
                                               erasure_pending=ps.erasure_since is not None and not erasure))
        if rewriting:  # 6
            dropped = self.store.end_rewrite(part, old_generation, ps.pointers) and dropped
            log.info("deltas partition %d: ledger state rewritten (%s)", part, "trimmed" if old_generation is None
                     else f"moved to generation {old_generation + 1}")
        if erasure and not dropped:  # 7: tried again after another window, never in a loop
            ps.erasure_since = time.monotonic()
        elif erasure:
            ps.erasure_since = None
            log.info("deltas partition %d: erasure rotation done: %d heads in %.3fs (%d state bytes, %d head bytes "
                     "written); %s", part, len(ps.heads), time.monotonic() - started, self.store.written.get(part, 0),
                     self.store.heads_written.get(part, 0), "older records trimmed" if self.store.trims else
                     f"the superseded heads generation goes in {self.tuning.heads_retire_seconds:.0f}s")
        self._commit_floor(part, floor)  # 8
        ps.last_touched = {h: o for h, o in ps.last_touched.items() if o >= floor}
        ps.pending = 0
        ps.last_checkpoint = time.monotonic()

    def _write_snapshots(self, ps: PartitionState, every: bool) -> None:
        """Step 4: a snapshot of each head not in a durable one yet (``every``: of each head)."""
        for head_id, head in sorted(ps.heads.items()):
            ptr = ps.pointers.get(head_id)
            last = ps.last_touched.get(head_id)
            stale = ptr is None or head.dirty_since_snapshot > 0 or (last is not None and ptr.applied_offset < last)
            if every or stale:
                ps.pointers[head_id] = self.store.write_snapshot(ps.partition, head.state(), ptr)
                head.dirty_since_snapshot = 0

    def _rewrite_heads(self, ps: PartitionState) -> bool:
        """Step 2: every head's current version as an exact update first (a fast head is reset:
        what is left then holds a digest for every head), then the older updates go. False: the
        trim failed (the erasure stays pending)."""
        rewrite = self.store.begin_heads_rewrite(ps.partition)
        for _, head in sorted(ps.heads.items()):
            if head.mode == "fast":
                head.reset("heads rotation")
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
