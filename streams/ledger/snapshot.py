"""Crash-consistent snapshots of a head's state, split into table values under a size limit.

Why this shape: the exact ledger of a d=768 head is ~7 MB, over the changelog message limit, and
writing it per delta would swamp the broker. So a head's state is snapshotted every N messages /
T seconds as *pieces* (each under ``max_piece_bytes``) plus a small *manifest* written last.
Pieces alternate between two slots (double buffering): a crash while writing slot B leaves the
manifest pointing at the intact slot A. Every piece carries the snapshot generation, the applied
input offset and the SHA-256 of the whole snapshot, so a mixed or partial set can never be
mistaken for a snapshot. The ledger processor acks input offsets only after the manifest is
written, so after a crash the input is replayed from at most the snapshot's offset + 1 and the
offsets at or below the snapshot's are skipped (docs/design.md section 4).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import orjson

from unlearn.ledger import ExactLedger

_PIECE = struct.Struct("<4sHQqII32s")  # magic, version, generation, offset, index, count, sha256(state)
_PIECE_MAGIC = b"ULSP"
_STATE_MAGIC = b"ULST"
_VERSION = 1


class SnapshotError(ValueError):
    """A snapshot that cannot be trusted (missing piece, checksum mismatch, unknown version)."""


@dataclass(frozen=True)
class HeadMeta:
    """Everything besides the ledger that a head carries across restarts."""

    head_id: str
    gamma: float
    version: int  # number of delta messages applied (deterministic from the deltas log)
    events_covered: int  # request events applied (adds + deletes, rows)
    applied_offset: int  # last input offset applied (the head's deltas are in one partition)
    input_partition: int
    last_reset_drift: float
    source_offsets: dict[str, int]  # requests partition -> last request offset covered

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def from_json(cls, raw: bytes) -> "HeadMeta":
        return cls(**orjson.loads(raw))


def encode_state(meta: HeadMeta, ledger: ExactLedger) -> bytes:
    """One blob: magic, version, meta length + JSON meta, ledger blob (itself checksummed)."""
    m = meta.to_json()
    return _STATE_MAGIC + struct.pack("<HI", _VERSION, len(m)) + m + ledger.to_bytes()


def decode_state(blob: bytes) -> tuple[HeadMeta, ExactLedger]:
    if blob[:4] != _STATE_MAGIC:
        raise SnapshotError("not a head state blob")
    version, mlen = struct.unpack_from("<HI", blob, 4)
    if version != _VERSION:
        raise SnapshotError(f"unknown head state version {version}")
    meta = HeadMeta.from_json(blob[10:10 + mlen])
    return meta, ExactLedger.from_bytes(blob[10 + mlen:])


def piece_key(head_id: str, slot: int, index: int) -> str:
    return f"{head_id}\x1fslot{slot}\x1f{index}"


def manifest_key(head_id: str) -> str:
    return f"{head_id}\x1fmanifest"


def split_pieces(state: bytes, generation: int, offset: int, max_piece_bytes: int) -> list[bytes]:
    """Cut a state blob into self-describing pieces of at most ``max_piece_bytes`` each."""
    payload = max_piece_bytes - _PIECE.size
    if payload < 1024:
        raise ValueError("max_piece_bytes too small")
    sha = hashlib.sha256(state).digest()
    count = max(1, -(-len(state) // payload))
    return [_PIECE.pack(_PIECE_MAGIC, _VERSION, generation, offset, i, count, sha) + state[i * payload:(i + 1) * payload]
            for i in range(count)]


def manifest(generation: int, slot: int, offset: int, count: int, sha: bytes) -> bytes:
    return orjson.dumps({"generation": generation, "slot": slot, "offset": offset, "count": count, "sha256": sha.hex()})


def join_pieces(manifest_raw: bytes, pieces: list[bytes | None]) -> bytes:
    """Reassemble and verify the state the manifest names; raises SnapshotError if anything is off."""
    man = orjson.loads(manifest_raw)
    if len(pieces) != man["count"]:
        raise SnapshotError(f"manifest names {man['count']} pieces, got {len(pieces)}")
    parts = []
    for i, p in enumerate(pieces):
        if p is None or len(p) < _PIECE.size:
            raise SnapshotError(f"piece {i} missing")
        magic, version, gen, off, idx, count, sha = _PIECE.unpack_from(p, 0)
        if magic != _PIECE_MAGIC or version != _VERSION:
            raise SnapshotError(f"piece {i}: bad magic/version")
        if (gen, off, idx, count) != (man["generation"], man["offset"], i, man["count"]) or sha.hex() != man["sha256"]:
            raise SnapshotError(f"piece {i} belongs to another snapshot (generation {gen})")
        parts.append(p[_PIECE.size:])
    state = b"".join(parts)
    if hashlib.sha256(state).hexdigest() != man["sha256"]:
        raise SnapshotError("snapshot checksum mismatch")
    return state


def state_sha(state: bytes) -> bytes:
    return hashlib.sha256(state).digest()
