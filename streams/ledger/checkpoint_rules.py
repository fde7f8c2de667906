"""The ledger worker's crash-consistency rules, without I/O (docs/design.md section 4).

A ledger worker owns ``deltas`` partitions. For each one it keeps the heads whose deltas are on
that partition and, in the ``ledger-state`` changelog partition of the same number, their
snapshots plus one *checkpoint record*: the partition's **floor** (every deltas message below it
is covered by the durable snapshots the record names) and the identity of the ``deltas`` topic
the state belongs to (the record, ``common.checkpoint_record.Checkpoint``, is shared with the
featurizer, which reads its floor before destroying a key). Three invariants make the ledger
exact under kill -9, rebalances and broker restarts; each has a function here and a test without
a broker:

1. **A floor never passes durable state** (:func:`safe_floor`): the floor of a partition is at
   most the first offset of any head in it whose events are not all in a durable snapshot.
2. **Recovery starts at the floor, and never skips** (:func:`check_recovery`): a worker resumes
   a partition at its checkpoint's floor (not at a consumer-group offset, which a framework or an
   operator may move), and refuses state that does not belong to the log it reads: another topic
   incarnation (topic id), a floor beyond the log's end (truncated or recreated log), or a log
   that starts after the floor (events lost to retention). It raises ``runtime.log_position.StaleStateError``
   naming the mismatch instead of guessing.
3. **A (head, version) pair has one digest**: versions count applied deltas messages and replay
   starts from a snapshot taken at a message boundary, so a replay recomputes the same versions
   from the same ledger states (``HeadRuntime``; tested there and by the chaos benchmark).

The other functions decide what a rewrite keeps: which generation recovery uses
(:func:`plan_generations`), below which offset ledger-state may be trimmed (:func:`first_needed`),
and where a snapshot piece is keyed (:func:`piece_key`).
"""

from __future__ import annotations

from collections.abc import Mapping

from unlearn.common.checkpoint_record import Checkpoint, HeadPointer
from unlearn.runtime.log_position import check_resume

__all__ = [
    "check_recovery",
    "first_needed",
    "piece_key",
    "plan_generations",
    "safe_floor",
]


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
