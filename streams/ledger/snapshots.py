"""A head's state as self-verifying snapshot pieces, each under a size limit (:class:`HeadState`).

Why this shape: the exact ledger of a d=768 head is ~7 MB, over a comfortable message size, and
writing it per delta would swamp the broker. So a head's state is snapshotted at checkpoints
(``checkpointer``) as *pieces*, each under ``max_piece_bytes``, written to the ``ledger-state``
changelog; the partition's checkpoint record names them (``changelog_store``). Every piece
carries the snapshot generation, the applied input offset, its index, the piece count and the
SHA-256 of the whole state, so a mixed or partial set can never be mistaken for a snapshot
(docs/ledger-processor.md has the byte layout).

The state blob is versioned (version 2); it holds the head's meta, the multiset hash of its
retained rows (docs/design.md section 6; empty when unknown, as after a packed entry without
one) and its exact ledger.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from unlearn.ledger import ExactLedger, MultisetHash
from unlearn.ledger.ledger_encoding import ledger_buffers
from unlearn.ledger.multiset_hash import STATE_BYTES

_PIECE = struct.Struct("<4sHQqII32s")  # magic, version, generation, offset, index, count, sha256(state)
_PIECE_MAGIC = b"ULSP"
_STATE_MAGIC = b"ULST"
_VERSION = 1  # of the pieces
_STATE_VERSION = 2  # of the state blob: meta + multiset hash + ledger
_STATE_HEADER = struct.Struct("<HI")  # version, meta length
_U32 = struct.Struct("<I")

Buffer = bytes | memoryview


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
    contract_version: int | None = None  # named by the latest delta that names one (None: none did)

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def from_json(cls, raw: bytes) -> HeadMeta:
        return cls(**orjson.loads(raw))


@dataclass(frozen=True)
class HeadState:
    """What a snapshot holds: the meta, the exact ledger, and the multiset hash of the retained
    rows (None: unknown)."""

    meta: HeadMeta
    ledger: ExactLedger
    multiset: MultisetHash | None


def encode_state(state: HeadState) -> bytes:
    """One blob (version 2): magic, version, meta length + JSON meta, multiset hash length (0 =
    unknown, or 4096) + state, ledger blob (itself checksummed)."""
    return b"".join(state_buffers(state))


def state_buffers(state: HeadState) -> list[Buffer]:
    """``encode_state``'s bytes as the buffers it joins, some of them the ledger's own arrays (use
    them before the ledger changes). Why: a checkpoint need never hold the whole blob; joining it
    (7 MB per head at d = 768, 51 MB at 2048) held the GIL the poll thread waits for (23 ms at
    d = 2048), while ``split_pieces`` copies it a piece at a time."""
    m = state.meta.to_json()
    mset = b"" if state.multiset is None else state.multiset.to_bytes()
    return [_STATE_MAGIC, _STATE_HEADER.pack(_STATE_VERSION, len(m)), m, _U32.pack(len(mset)), mset,
            *ledger_buffers(state.ledger.parts())]


def decode_state(blob: bytes) -> HeadState:
    """The head state ``blob`` holds (version 2); SnapshotError if it is not one."""
    if blob[:4] != _STATE_MAGIC:
        raise SnapshotError("not a head state blob")
    version, mlen = _STATE_HEADER.unpack_from(blob, 4)
    if version != _STATE_VERSION:
        raise SnapshotError(f"unknown head state version {version}")
    pos = 4 + _STATE_HEADER.size
    meta = HeadMeta.from_json(blob[pos:pos + mlen])
    pos += mlen
    (size,) = _U32.unpack_from(blob, pos)
    if size not in (0, STATE_BYTES):
        raise SnapshotError(f"multiset hash of {size} bytes (0 or {STATE_BYTES})")
    raw_mset = blob[pos + _U32.size:pos + _U32.size + size]
    pos += _U32.size + size
    ledger = ExactLedger.from_bytes(blob[pos:])
    mset = (MultisetHash.from_bytes(raw_mset, ledger.dim, ledger.frac_bits, ledger.label_frac_bits)
            if raw_mset else None)
    return HeadState(meta, ledger, mset)


def split_pieces(state: bytes | Sequence[Buffer], generation: int, offset: int, max_piece_bytes: int,
                 sha: bytes | None = None) -> list[bytes]:
    """Cut a state blob (or the buffers it is joined from, ``state_buffers``) into self-describing
    pieces of at most ``max_piece_bytes`` each (``sha``: its ``state_sha`` when the caller has it
    already). Each byte of the state is copied once, into its piece."""
    payload = max_piece_bytes - _PIECE.size
    if payload < 1024:
        raise ValueError("max_piece_bytes too small")
    views = [memoryview(b) for b in ([state] if isinstance(state, bytes) else state)]
    if any(v.itemsize != 1 or v.ndim != 1 for v in views):
        raise ValueError("state buffers must be flat bytes (state_buffers gives them so)")
    sha = state_sha(views) if sha is None else sha
    count = max(1, -(-sum(len(v) for v in views) // payload))
    pieces: list[list[Buffer]] = [[_PIECE.pack(_PIECE_MAGIC, _VERSION, generation, offset, i, count, sha)]
                                  for i in range(count)]
    i, room = 0, payload
    for v in views:
        while len(v):
            pieces[i].append(v[:room])
            room -= len(pieces[i][-1])
            v = v[len(pieces[i][-1]):]
            if room == 0 and i + 1 < count:
                i, room = i + 1, payload
    return [b"".join(p) for p in pieces]


def join_pieces(generation: int, offset: int, sha256_hex: str, pieces: list[bytes | None]) -> bytes:
    """Reassemble and verify the state of snapshot ``generation`` at ``offset`` whose SHA-256 is
    ``sha256_hex``; raises SnapshotError if a piece is missing, foreign or the checksum is off."""
    parts = []
    for i, p in enumerate(pieces):
        if p is None or len(p) < _PIECE.size:
            raise SnapshotError(f"piece {i} missing")
        magic, version, gen, off, idx, count, sha = _PIECE.unpack_from(p, 0)
        if magic != _PIECE_MAGIC or version != _VERSION:
            raise SnapshotError(f"piece {i}: bad magic/version")
        if (gen, off, idx, count) != (generation, offset, i, len(pieces)) or sha.hex() != sha256_hex:
            raise SnapshotError(f"piece {i} belongs to another snapshot (generation {gen})")
        parts.append(p[_PIECE.size:])
    state = b"".join(parts)
    if hashlib.sha256(state).hexdigest() != sha256_hex:
        raise SnapshotError("snapshot checksum mismatch")
    return state


def state_sha(state: bytes | Sequence[Buffer]) -> bytes:
    """SHA-256 of a state blob, or of the buffers it is joined from (``state_buffers``)."""
    h = hashlib.sha256()
    for b in [state] if isinstance(state, bytes) else state:
        h.update(b)
    return h.digest()
