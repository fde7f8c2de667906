"""The multiset hash of the retained rows (:class:`MultisetHash`): an incremental,
order-independent LtHash (1024 x 32-bit lanes) of the rows, and the canonical row encodings it
hashes.

Why: the ledger digest is the certificate but costs O(d^2) per event; a receipt needs a
commitment that costs O(row). Decisions and the byte layout: docs/design.md section 6.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
from numpy.typing import ArrayLike, NDArray

from unlearn.ledger.errors import LedgerError

LANES = 1024
STATE_BYTES = 4 * LANES
ROW_TAG = b"unlearn.mset.row/v1\x00"
FINGERPRINT_TAG = b"unlearn.mset/v1\x00"
_LABEL_CLASS = 0
_LABEL_VECTOR = 1
_CHUNK_ROWS = 1024  # rows hashed per numpy sum: bounds the (rows, lanes) temporary to 4 MiB
_I64_MAX = np.iinfo(np.int64).max


def _int64(a: ArrayLike, what: str) -> NDArray[np.int64]:
    arr = np.asarray(a)
    if arr.dtype.kind not in "iu":
        raise LedgerError(f"{what} must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > _I64_MAX:
        raise LedgerError(f"{what} has values beyond int64")
    return np.ascontiguousarray(arr, dtype="<i8")


def _rows(Q: ArrayLike, y: ArrayLike, dim: int) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    """Validated (Q (r, d), labels (r, m), label kind): the shapes ``ExactLedger`` takes."""
    q = _int64(Q, "Q")
    if q.ndim == 1:
        q = q[None, :]
    if q.ndim != 2 or q.shape[1] != dim:
        raise LedgerError(f"Q must have shape (r, {dim}), got {np.asarray(Q).shape}")
    r = q.shape[0]
    lab = _int64(y, "labels")
    if lab.ndim == 0:
        lab = lab[None]
    if lab.ndim == 1 and lab.shape[0] == r:
        return q, lab.reshape(r, 1), _LABEL_CLASS
    if lab.ndim == 2 and lab.shape[0] == r and lab.shape[1] >= 1:
        return q, lab, _LABEL_VECTOR
    raise LedgerError(f"labels must have shape ({r},) or ({r}, c>=1), got {lab.shape}")


def _encodings(q: NDArray[np.int64], lab: NDArray[np.int64], kind: int, frac_bits: int,
               label_frac_bits: int) -> NDArray[np.uint8]:
    """The row encodings of the module docstring, one per row of a (r, length) byte matrix."""
    r, d = q.shape
    m = lab.shape[1]
    head = np.frombuffer(ROW_TAG + struct.pack("<5q", d, frac_bits, label_frac_bits, kind, m), np.uint8)
    h = head.shape[0]
    out = np.empty((r, h + 8 * (d + m)), np.uint8)
    out[:, :h] = head
    out[:, h:h + 8 * d] = q.view(np.uint8).reshape(r, 8 * d)
    out[:, h + 8 * d:] = lab.view(np.uint8).reshape(r, 8 * m)
    return out


def _elements(enc: NDArray[np.uint8]) -> NDArray[np.uint32]:
    """SHAKE-128 of each encoding, as (r, LANES) little-endian u32 lanes."""
    raw = b"".join(hashlib.shake_128(row).digest(STATE_BYTES) for row in enc)
    return np.frombuffer(raw, dtype="<u4").reshape(enc.shape[0], LANES)


def encode_row(q: ArrayLike, label: ArrayLike, frac_bits: int = 30, label_frac_bits: int = 0) -> bytes:
    """The canonical bytes of one row (``q`` (d,), ``label`` a class index or a (c,) target vector)."""
    qa = np.asarray(q)
    if qa.ndim != 1:
        raise LedgerError(f"encode_row takes one row of shape (d,), got {qa.shape}")
    rows, lab, kind = _rows(qa[None, :], np.asarray(label)[None, ...], qa.shape[0])
    return _encodings(rows, lab, kind, frac_bits, label_frac_bits)[0].tobytes()


def row_hashes(Q: ArrayLike, y: ArrayLike, frac_bits: int = 30, label_frac_bits: int = 0) -> NDArray[np.uint32]:
    """The elements h(row), (r, LANES) uint32, of rows given as ``ExactLedger.add`` takes them."""
    qa = np.asarray(Q)
    q, lab, kind = _rows(qa, y, qa.shape[-1] if qa.ndim else 0)
    return _elements(_encodings(q, lab, kind, frac_bits, label_frac_bits)).copy()


class MultisetHash:
    """The LtHash of a multiset of rows on one grid (d, k, k_y): ``add`` / ``delete`` rows as the
    ledger does, ``absorb`` another multiset's hash (a partition, a packed entry). Mutable, like
    ``ExactLedger``; ``to_bytes`` is the 4096-byte state, ``fingerprint`` its 32-byte commitment."""

    __slots__ = ("_lanes", "dim", "frac_bits", "label_frac_bits")

    def __init__(self, dim: int, frac_bits: int = 30, label_frac_bits: int = 0) -> None:
        if int(dim) < 1:
            raise LedgerError(f"dim must be >= 1, got {dim}")
        self.dim = int(dim)
        self.frac_bits = int(frac_bits)
        self.label_frac_bits = int(label_frac_bits)
        self._lanes = np.zeros(LANES, np.uint32)

    @classmethod
    def of_rows(cls, Q: ArrayLike, y: ArrayLike, frac_bits: int = 30, label_frac_bits: int = 0) -> MultisetHash:
        """The hash of exactly these rows (e.g. a packed entry's, computed where the rows are)."""
        qa = np.asarray(Q)
        h = cls(qa.shape[-1] if qa.ndim else 0, frac_bits, label_frac_bits)
        h.add(Q, y)
        return h

    @classmethod
    def from_bytes(cls, raw: bytes | bytearray | memoryview, dim: int, frac_bits: int = 30,
                   label_frac_bits: int = 0) -> MultisetHash:
        """A state serialized by ``to_bytes``, on the grid it was computed on."""
        if len(raw) != STATE_BYTES:
            raise LedgerError(f"a multiset hash state is {STATE_BYTES} bytes, got {len(raw)}")
        h = cls(dim, frac_bits, label_frac_bits)
        h._lanes = np.frombuffer(raw, dtype="<u4").astype(np.uint32)
        return h

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.dim, self.frac_bits, self.label_frac_bits

    @property
    def lanes(self) -> NDArray[np.uint32]:
        """A copy of the 1024 lanes."""
        return self._lanes.copy()

    def copy(self) -> MultisetHash:
        h = MultisetHash(*self.grid)
        h._lanes = self._lanes.copy()
        return h

    def add(self, Q: ArrayLike, y: ArrayLike) -> None:
        """Rows join the multiset (``Q`` int (r, d), ``y`` class indices (r,) or targets (r, c))."""
        self._apply(Q, y, +1)

    def delete(self, Q: ArrayLike, y: ArrayLike) -> None:
        """Rows leave the multiset. The hash cannot tell a non-member: the ledger refuses those."""
        self._apply(Q, y, -1)

    def _apply(self, Q: ArrayLike, y: ArrayLike, sign: int) -> None:
        q, lab, kind = _rows(Q, y, self.dim)
        total = np.zeros(LANES, np.uint64)
        for s in range(0, q.shape[0], _CHUNK_ROWS):
            enc = _encodings(q[s:s + _CHUNK_ROWS], lab[s:s + _CHUNK_ROWS], kind, self.frac_bits,
                             self.label_frac_bits)
            total += _elements(enc).sum(axis=0, dtype=np.uint64)  # < 2^10 * 2^32 per chunk: no wrap
        self._step(total.astype(np.uint32), sign)  # the low 32 bits: the sum mod 2^32

    def _step(self, lanes: NDArray[np.uint32], sign: int) -> None:
        if sign == 1:
            np.add(self._lanes, lanes, out=self._lanes)  # uint32 arithmetic wraps: mod 2^32
        elif sign == -1:
            np.subtract(self._lanes, lanes, out=self._lanes)
        else:
            raise LedgerError("sign must be +1 or -1")

    def absorb(self, other: MultisetHash, sign: int = +1) -> None:
        """Add (sign +1) or remove (-1) another multiset of rows on the same grid."""
        if other.grid != self.grid:
            raise LedgerError(f"multiset hash on grid (d, k, k_y) = {other.grid} cannot join one on {self.grid}")
        self._step(other._lanes, sign)

    def merge(self, other: MultisetHash) -> MultisetHash:
        """The hash of the union of two multisets (partition hashes sum to the whole)."""
        out = self.copy()
        out.absorb(other)
        return out

    def __add__(self, other: MultisetHash) -> MultisetHash:
        return self.merge(other)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultisetHash):
            return NotImplemented
        return self.grid == other.grid and bool(np.array_equal(self._lanes, other._lanes))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MultisetHash(dim={self.dim}, frac_bits={self.frac_bits}, " \
               f"label_frac_bits={self.label_frac_bits}, fingerprint={self.fingerprint()[:16]}...)"

    def to_bytes(self) -> bytes:
        """The state: 1024 u32 lanes, little-endian (4096 bytes)."""
        return self._lanes.astype("<u4").tobytes()

    def fingerprint(self) -> str:
        """Hex SHA-256 of the domain tag and the state: what receipts and head updates carry."""
        return hashlib.sha256(FINGERPRINT_TAG + self.to_bytes()).hexdigest()
