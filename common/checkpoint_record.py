"""The ledger's checkpoint record (in ``ledger-state``): the ledger writes it; the featurizer
reads its floor before destroying a deleted sample's key (docs/erasure.md), since a ledger never
re-reads below it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import orjson

from unlearn.runtime.log_position import StaleStateError

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
