"""The ledger worker's crash-consistency rules, without I/O (docs/design.md section 4).

A ledger worker owns ``deltas`` partitions. For each one it keeps the heads whose deltas are on
that partition and, in the ``ledger-state`` changelog partition of the same number, their
snapshots plus one *checkpoint record*: the partition's **floor** (every deltas message below it
is covered by the durable snapshots the record names) and the identity of the ``deltas`` topic
the state belongs to. Three invariants make the ledger exact under kill -9, rebalances and broker
restarts; each has a function here and a test without a broker:

1. **A floor never passes durable state** (:func:`safe_floor`): the floor of a partition is at
   most the first offset of any head in it whose events are not all in a durable snapshot.
2. **Recovery starts at the floor, and never skips** (:func:`check_recovery`): a worker resumes
   a partition at its checkpoint's floor (not at a consumer-group offset, which a framework or an
   operator may move), and refuses state that does not belong to the log it reads: another topic
   incarnation (topic id), a floor beyond the log's end (truncated or recreated log), or a log
   that starts after the floor (events lost to retention). It raises :class:`StaleStateError`
   naming the mismatch instead of guessing.
3. **A (head, version) pair has one digest**: versions count applied deltas messages and replay
   starts from a snapshot taken at a message boundary, so a replay recomputes the same versions
   from the same ledger states (``HeadRuntime``; tested there and by the chaos benchmark).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import orjson

from unlearn.infra.log_position import StaleStateError, check_resume

__all__ = [
    "CHECKPOINT_KEY_PREFIX",
    "Checkpoint",
    "HeadPointer",
    "StaleStateError",
    "check_recovery",
    "latest_checkpoint",
    "piece_key",
    "plan_generations",
    "safe_floor",
]

CHECKPOINT_KEY_PREFIX = b"checkpoint/"
_FORMAT = "unlearn.ledger-checkpoint/v1"


_FIX = ("delete the ledger-state topic to rebuild every head from the deltas log, or point the worker at the "
        "broker and topics its state came from")


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
    # rotation). Encoded only when set, so records without it read as before.
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


def piece_key(head_id: str, slot: int, index: int) -> bytes:
    """Changelog key of a snapshot piece. Two slots (double buffering), so that on a compacting
    broker the pieces a checkpoint names are still the latest values of their keys until a newer
    checkpoint names the other slot."""
    return f"piece/{head_id}/{slot}/{index}".encode()


def checkpoint_key(partition: int) -> bytes:
    return CHECKPOINT_KEY_PREFIX + str(partition).encode()


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
    """Where to resume a partition, or :class:`StaleStateError` (invariant 2).

    ``log_start``/``log_end``: the first offset and one past the last offset the deltas partition
    holds now; ``topic_id``: the deltas topic's id now ("" where the broker has none)."""
    what = "ledger state" if cp is None else f"ledger state of deltas partition {cp.partition}"
    return check_resume(what, None if cp is None else cp.floor, "" if cp is None else cp.topic_id, topic_id,
                        log_start, log_end, _FIX)


def latest_checkpoint(records: Iterable[tuple[int, bytes | None, bytes | None]], partition: int) -> Checkpoint | None:
    """The checkpoint of ``partition`` with the highest changelog offset among ``records``
    ((offset, key, value) triples; tombstones and other keys ignored)."""
    want = checkpoint_key(partition)
    best: tuple[int, bytes] | None = None
    for offset, key, value in records:
        if key == want and value is not None and (best is None or offset > best[0]):
            best = (offset, value)
    return None if best is None else Checkpoint.decode(best[1])
