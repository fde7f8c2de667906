"""The exact ledger's canonical encodings: its digest (what verifiers compare) and its versioned,
checksummed blob (what deltas and checkpoints carry), pure functions of the limbs (``LedgerParts``).

Byte layouts: docs/design.md section 2 ("Digest") and the functions' docstrings.
"""

from __future__ import annotations

import hashlib
import struct
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from unlearn.ledger import wide
from unlearn.ledger.errors import LedgerError
from unlearn.ledger.limb_products import MAX_COUNT
from unlearn.ledger.quantization import MAX_CLASS_INDEX

DIGEST_DOMAIN = b"unlearn.ledger/v1\x00"
BLOB_MAGIC = b"ULDG"
BLOB_VERSION = 1
BLOB_HEADER = struct.Struct("<4sHqqqqq")  # magic, version, d, c, k, k_y, count
#: Rows of S's upper triangle per step of the digest.
_DIGEST_ROWS = 32

Limbs = tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]


class LedgerParts(NamedTuple):
    """What a blob holds: the grid, the counts and the limbs (S's stored upper-triangular)."""

    dim: int
    n_outputs: int
    frac_bits: int
    label_frac_bits: int
    retained: int  # samples
    class_counts: NDArray[np.int64]
    gram: Limbs  # AA, X, BB (d, d)
    moments: Limbs  # GAA, GX, GBB (d, c)


@lru_cache(maxsize=8)
def triu_flat(d: int) -> NDArray[np.intp]:
    """Upper-triangle flat indices (row-major), cached: the digest and blobs use them every time
    (``M.ravel().take(idx)`` is ~3x faster than ``M[np.triu_indices(d)]``)."""
    iu = np.triu_indices(d)
    return iu[0] * d + iu[1]


def _triu_start(d: int, i: int) -> int:
    """Where row i starts in the row-major upper triangle (incl. diagonal) of a d x d matrix."""
    return i * d - i * (i - 1) // 2


def shifted(limbs: Limbs) -> list[tuple[NDArray[np.int64], int]]:
    """The three limbs with their shifts (2^30, 2^15, 1): what ``wide.combine`` sums exactly."""
    return list(zip(limbs, (30, 15, 0), strict=True))


def upper_limbs(gram: Limbs) -> list[NDArray[np.int64]]:
    """The upper triangles (row-major) of AA, X, BB: what the digest and the blobs encode."""
    idx = triu_flat(gram[0].shape[0])
    return [M.ravel().take(idx) for M in gram]


def ledger_digest(p: LedgerParts) -> str:
    """Hex SHA-256 of the canonical encoding of the exact integers (docs/design.md section 2).

    Byte by byte::

        b"unlearn.ledger/v1\\0"                           18 bytes (domain tag, NUL-terminated)
        i64 d, i64 c, i64 k, i64 k_y, i64 n               5 x 8 bytes, signed little-endian
        i128 S_int[i][j], i = 0..d-1, j = i..d-1          upper triangle incl. diagonal, row-major
        i128 G_int[i][m], i = 0..d-1, m = 0..c-1          row-major

    i128 is signed two's-complement little-endian (16 bytes). S_int = sum q q^T and
    G_int = sum q y^T over the retained multiset, y the integer label vector (one-hot scaled by
    2^k_y for class indices). Equal digests = equal ledgers, whoever computes them.
    """
    h = hashlib.sha256()
    h.update(DIGEST_DOMAIN)
    h.update(struct.pack("<qqqqq", p.dim, p.n_outputs, p.frac_bits, p.label_frac_bits, p.retained))
    # S's upper triangle, row-major, fed to the hash 32 rows at a time: the same byte stream as
    # one encoding of the whole triangle, without its (d^2 / 2)-entry temporaries (every reset)
    d = p.dim
    idx = triu_flat(d)
    limbs = [(M.ravel(), shift) for M, shift in shifted(p.gram)]
    for i0 in range(0, d, _DIGEST_ROWS):
        seg = idx[_triu_start(d, i0):_triu_start(d, min(d, i0 + _DIGEST_ROWS))]
        h.update(wide.to_le_bytes(wide.combine([(v.take(seg), shift) for v, shift in limbs])))
    h.update(wide.to_le_bytes(wide.combine(shifted(p.moments))))
    return h.hexdigest()


def encode_ledger(p: LedgerParts) -> bytes:
    """Versioned, checksummed snapshot (restores the limbs, class counts and count).

    Layout (little-endian): magic "ULDG", u16 version=1, i64 d, c, k, k_y, count;
    i64 class_counts[c]; i64 upper triangles (row-major) of AA, X, BB (d(d+1)/2 each);
    i64 GAA, GX, GBB (d x c each, row-major); 32-byte SHA-256 of everything before it.
    """
    return b"".join(ledger_buffers(p))


def ledger_buffers(p: LedgerParts) -> list[bytes | memoryview]:
    """``encode_ledger``'s bytes as the buffers they are joined from: the arrays themselves where
    their layout is the blob's, hashed where they lie. Why: a checkpoint writes 7 MB per head at
    d = 768 (51 MB at 2048); every copy of it held the GIL the ledger's poll thread waits for
    (bench/results/pipeline_bench.md section 30), so a caller joining more around it joins once."""
    header = BLOB_HEADER.pack(BLOB_MAGIC, BLOB_VERSION, p.dim, p.n_outputs, p.frac_bits, p.label_frac_bits,
                              p.retained)
    arrays = [p.class_counts, *upper_limbs(p.gram), *p.moments]
    parts: list[bytes | memoryview] = [header]
    parts += [np.ascontiguousarray(M, dtype="<i8").reshape(-1).view(np.uint8).data for M in arrays]
    h = hashlib.sha256()
    for b in parts:
        h.update(b)
    return [*parts, h.digest()]


def decode_ledger(blob: bytes) -> LedgerParts:
    """Inverse of ``encode_ledger``; rejects truncated, corrupted or unknown-version input with
    LedgerError."""
    blob = bytes(blob)
    if len(blob) < BLOB_HEADER.size + 32:
        raise LedgerError(f"ledger blob truncated ({len(blob)} bytes)")
    magic, version, d, c, k, k_y, count = BLOB_HEADER.unpack_from(blob, 0)
    if magic != BLOB_MAGIC:
        raise LedgerError("not a ledger blob (bad magic)")
    if version != BLOB_VERSION:
        raise LedgerError(f"unknown ledger blob version {version}")
    if not (1 <= d <= 1 << 16 and 0 <= c <= MAX_CLASS_INDEX + 1 and 0 <= k <= 30 and 0 <= k_y <= 30
            and 0 <= count <= MAX_COUNT):
        raise LedgerError("ledger blob header out of range")
    t = d * (d + 1) // 2
    expected = BLOB_HEADER.size + 8 * (c + 3 * t + 3 * d * c) + 32
    if len(blob) != expected:
        raise LedgerError(f"ledger blob has {len(blob)} bytes, expected {expected}")
    if hashlib.sha256(blob[:-32]).digest() != blob[-32:]:
        raise LedgerError("ledger blob checksum mismatch (corrupted)")
    off = BLOB_HEADER.size

    def take(n: int) -> NDArray[np.int64]:
        nonlocal off
        a = np.frombuffer(blob, dtype="<i8", count=n, offset=off).astype(np.int64)
        off += 8 * n
        return a

    class_counts = take(c)
    idx = triu_flat(d)
    gram = []
    for _ in range(3):
        M = np.zeros((d, d), np.int64)  # stored upper-triangular, as the updates keep it
        M.ravel()[idx] = take(t)
        gram.append(M)
    moments = tuple(take(d * c).reshape(d, c) for _ in range(3))
    return LedgerParts(d, c, k, k_y, int(count), class_counts, (gram[0], gram[1], gram[2]),
                       (moments[0], moments[1], moments[2]))
