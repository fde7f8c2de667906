"""The exact integer ledger: S = sum q q^T and G = sum q y^T over the retained multiset.

Why integers: float ledgers never return to zero after add-then-delete and their residue grows
with the stream. Integers cancel bit for bit, so the ledger after any interleaving, order or
partitioning of adds and deletes equals the ledger built from scratch on what is retained.

How (docs/design.md section 2): split every quantized value q = a*2^15 + b with b in [-2^14, 2^14).
The three symmetric limb matrices

    AA = sum a a^T,   X = sum (a b^T + b a^T),   BB = sum b b^T

are kept in int64 (bounded by n * 2^30 < 2^62 for n < 2^32 samples) and give
S_int = AA*2^30 + X*2^15 + BB exactly. G uses the same split of the integer labels. The limbs
are a deterministic function of the multiset, so equal multisets have equal limbs. The products
come from float64 ``dsyrk`` calls that are exact by construction (``ledger/limbs.py``); S's limbs
are stored as upper triangles (the strict lower part is zero) and mirrored only when S is read.
"""

from __future__ import annotations

import hashlib
import struct
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import wide
from .errors import LedgerError, NonMemberDelete, OverflowBudgetError
from .limbs import ROW_BLOCK, PendingProducts, exact_int, row_diagonals, split_labels, split_rows
from .quantize import QMAX

#: Retained-sample budget per ledger; beyond it int64 limbs could overflow.
MAX_COUNT = (1 << 32) - 1
#: Largest class index accepted (keeps c, and so W, a sane size).
MAX_CLASS_INDEX = (1 << 20) - 1

DIGEST_DOMAIN = b"unlearn.ledger/v1\x00"
_BLOB_MAGIC = b"ULDG"
_BLOB_VERSION = 1
_HEADER = struct.Struct("<4sHqqqqq")  # magic, version, d, c, k, k_y, count


class SufficientStatistics(Protocol):
    """What a head solver needs: float64 S and G at real scale."""

    @property
    def dim(self) -> int: ...

    def gram(self) -> NDArray[np.float64]: ...

    def moments(self) -> NDArray[np.float64]: ...


@lru_cache(maxsize=8)
def _triu_flat(d: int) -> NDArray[np.intp]:
    """Upper-triangle flat indices (row-major), cached: the digest and blobs use them every time
    (``M.ravel().take(idx)`` is ~3x faster than ``M[np.triu_indices(d)]``)."""
    iu = np.triu_indices(d)
    return iu[0] * d + iu[1]


#: Rows of S's upper triangle per step of the digest.
_DIGEST_ROWS = 32


def _triu_start(d: int, i: int) -> int:
    """Where row i starts in the row-major upper triangle (incl. diagonal) of a d x d matrix."""
    return i * d - i * (i - 1) // 2


@lru_cache(maxsize=8)
def _strict_lower(d: int) -> NDArray[np.bool_]:
    """Mask of the strict lower triangle: where ``_mirror_upper`` copies S^T into S."""
    return np.tri(d, d, -1, dtype=bool)


def _mirror_upper(M: NDArray[Any], block: int = 32) -> NDArray[Any]:
    """The symmetric matrix whose upper triangle is M's (in place; bits copied, not recomputed).
    Block columns at a time: about 3x faster at d = 768 than one masked copy of M.T (a reset
    mirrors S and H^-1)."""
    n = M.shape[0]
    for i0 in range(0, n, block):
        i1 = min(n, i0 + block)
        sq = M[i0:i1, i0:i1]
        np.copyto(sq, sq.T, where=_strict_lower(i1 - i0))
        M[i1:, i0:i1] = M[i0:i1, i1:].T
    return M


class ExactLedger:
    """Exact sufficient statistics of a ridge head, in integers.

    ``dim``: feature dimension d. ``n_outputs``: c, grows when a larger class index or a wider
    target matrix is added (class-incremental heads); it never shrinks, so a from-scratch
    reference must be built with the same ``n_outputs``. ``frac_bits``: k of the feature grid;
    ``label_frac_bits``: k_y of the label grid (0 = class indices / integer targets).
    """

    def __init__(self, dim: int, n_outputs: int = 0, frac_bits: int = 30, label_frac_bits: int = 0) -> None:
        if int(dim) < 1:
            raise LedgerError(f"dim must be >= 1, got {dim}")
        if int(n_outputs) < 0:
            raise LedgerError(f"n_outputs must be >= 0, got {n_outputs}")
        if not 0 <= int(frac_bits) <= 30 or not 0 <= int(label_frac_bits) <= 30:
            raise LedgerError("frac_bits and label_frac_bits must be in 0..30")
        self.dim = int(dim)
        self.frac_bits = int(frac_bits)
        self.label_frac_bits = int(label_frac_bits)
        d, c = self.dim, int(n_outputs)
        self._AA = np.zeros((d, d), np.int64)
        self._X = np.zeros((d, d), np.int64)
        self._BB = np.zeros((d, d), np.int64)
        self._GAA = np.zeros((d, c), np.int64)
        self._GX = np.zeros((d, c), np.int64)
        self._GBB = np.zeros((d, c), np.int64)
        self._class_counts = np.zeros(c, np.int64)
        self._count = 0
        self._mutations = 0  # bumped by every change: keys the cache of derived values
        self._cache: dict[str, tuple[int, Any]] = {}
        # Products of rows not yet folded into _AA/_X/_BB (allocated by the first row update).
        self._pending: PendingProducts | None = None

    # ------------------------------------------------------------------ introspection
    @property
    def n_outputs(self) -> int:
        return self._GAA.shape[1]

    @property
    def count(self) -> int:
        """Number of retained samples."""
        return self._count

    @property
    def class_counts(self) -> NDArray[np.int64]:
        """Retained samples per class index (samples added with class-index labels only)."""
        return self._class_counts.copy()

    def __repr__(self) -> str:
        return (f"ExactLedger(dim={self.dim}, n_outputs={self.n_outputs}, count={self.count}, "
                f"frac_bits={self.frac_bits}, label_frac_bits={self.label_frac_bits})")

    def copy(self) -> ExactLedger:
        self.fold()
        other = ExactLedger.__new__(ExactLedger)
        other.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in self.__dict__.items()})
        other._cache = dict(self._cache)
        other._pending = None
        return other

    def _cached(self, name: str, compute: Any) -> Any:
        hit = self._cache.get(name)
        if hit is not None and hit[0] == self._mutations:
            return hit[1]
        value = compute()
        self._cache[name] = (self._mutations, value)
        return value

    # ------------------------------------------------------------------ validation
    def check_rows(self, Q: ArrayLike) -> NDArray[np.int64]:
        """Validate quantized rows: integer dtype, shape (r, dim), |q| <= 2^30."""
        arr = np.asarray(Q)
        if arr.dtype.kind not in "iu":
            raise LedgerError(f"Q must be an integer array from Quantizer.quantize, got dtype {arr.dtype}")
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise LedgerError(f"Q must have shape (r, {self.dim}), got {np.asarray(Q).shape}")
        if arr.dtype.kind == "u" and arr.size and arr.max() > QMAX:
            raise LedgerError("Q has values beyond 2^30")
        arr = arr.astype(np.int64, copy=False)
        if arr.size and (arr.max() > QMAX or arr.min() < -QMAX):  # min/max: no |arr| temporary
            row = int(np.argmax((np.abs(arr) > QMAX).any(axis=1)))
            raise LedgerError(f"row {row}: |q| exceeds 2^30, not a value the Quantizer produces")
        return arr

    def label_matrix(self, y: ArrayLike, r: int) -> tuple[NDArray[np.int64], NDArray[np.int64] | None]:
        """Integer label matrix Y (r, c') and, for class-index labels, the indices.

        Class index j becomes the row with 2^label_frac_bits at column j (one-hot on the label grid).
        """
        arr = np.asarray(y)
        if arr.ndim == 0:
            arr = arr[None]
        if arr.dtype.kind not in "iu":
            raise LedgerError(
                "labels must be integer class indices (r,) or an int64 quantized target matrix (r, c); "
                f"got dtype {arr.dtype}")
        if arr.ndim == 1:
            if arr.shape[0] != r:
                raise LedgerError(f"got {arr.shape[0]} class labels for {r} rows")
            if r and (arr.min() < 0 or arr.max() > MAX_CLASS_INDEX):
                raise LedgerError(
                    f"class indices must be in 0..{MAX_CLASS_INDEX}, got {int(arr.min())}..{int(arr.max())}")
            idx = arr.astype(np.int64)
            c = max(self.n_outputs, int(idx.max()) + 1 if r else 0)
            Y = np.zeros((r, c), np.int64)
            Y[np.arange(r), idx] = 1 << self.label_frac_bits
            return Y, idx
        if arr.ndim == 2:
            if arr.shape[0] != r:
                raise LedgerError(f"target matrix has {arr.shape[0]} rows for {r} feature rows")
            if arr.shape[1] < self.n_outputs:
                raise LedgerError(f"target matrix has {arr.shape[1]} columns, the head has {self.n_outputs} outputs")
            if arr.shape[1] > MAX_CLASS_INDEX + 1:
                raise LedgerError(f"target matrix has too many columns ({arr.shape[1]})")
            Y = arr.astype(np.int64, copy=False)
            if Y.size and np.abs(Y).max() > QMAX:
                raise LedgerError("quantized targets must satisfy |y| <= 2^30")
            return Y, None
        raise LedgerError(f"labels must be 1-d class indices or a 2-d target matrix, got shape {arr.shape}")

    # ------------------------------------------------------------------ updates
    def add(self, Q: ArrayLike, y: ArrayLike) -> None:
        """Add the rows Q (int64 (r, d)) with labels y; all or nothing."""
        self._apply_rows(Q, y, +1)

    def delete(self, Q: ArrayLike, y: ArrayLike) -> None:
        """Remove the rows Q with labels y. Refused atomically (NonMemberDelete) when it would make
        the count, a class count or a diagonal of S negative -- a delete of something never added."""
        self._apply_rows(Q, y, -1)

    def _apply_rows(self, Q: ArrayLike, y: ArrayLike, sign: int) -> None:
        self.apply_prepared(*self.prepare_rows(Q, y), sign)

    def prepare_rows(self, Q: ArrayLike, y: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.int64],
                                                                NDArray[np.int64] | None]:
        """Validate an update once: (rows, integer label matrix, class indices or None).
        Callers that also need Y (the fast head) validate here and then ``apply_prepared``."""
        Qc = self.check_rows(Q)
        Y, idx = self.label_matrix(y, Qc.shape[0])
        return Qc, Y, idx

    def apply_prepared(self, Qc: NDArray[np.int64], Y: NDArray[np.int64], idx: NDArray[np.int64] | None,
                       sign: int) -> None:
        """Apply rows that came out of ``prepare_rows``; all or nothing (NonMemberDelete etc.)."""
        if sign not in (1, -1):
            raise LedgerError("sign must be +1 or -1")
        r = Qc.shape[0]
        if r == 0:
            return
        # Validate everything before touching state (atomic: a refused update changes nothing).
        c_new = max(self.n_outputs, Y.shape[1])
        batch_counts = np.bincount(idx, minlength=c_new).astype(np.int64) if idx is not None else None
        self._check_update(sign, Qc, c_new, batch_counts)
        if c_new > self.n_outputs:
            self._grow_outputs(c_new)
        Yp = Y if Y.shape[1] == c_new else np.hstack([Y, np.zeros((r, c_new - Y.shape[1]), np.int64)])
        if self._pending is None:
            self._pending = PendingProducts(self.dim)
        pending = self._pending
        s0 = 0
        while s0 < r:
            if not pending.room:
                pending.fold_into(self._AA, self._X, self._BB)
            n = min(ROW_BLOCK, pending.room, r - s0)
            a, b, s = split_rows(Qc[s0:s0 + n])
            pending.accumulate(a, b, s, sign)
            self._accumulate_moments(a, b, s, Yp[s0:s0 + n], sign)
            s0 += n
        if batch_counts is not None:
            self._class_counts += sign * batch_counts
        self._count += sign * r
        self._mutations += 1

    def _check_update(self, sign: int, Qc: NDArray[np.int64], c_new: int,
                      batch_counts: NDArray[np.int64] | None) -> None:
        r = Qc.shape[0]
        new_count = self._count + sign * r
        if new_count > MAX_COUNT:
            raise OverflowBudgetError(
                f"ledger would hold {new_count} samples; the exactness budget is < 2^32 per ledger "
                "(split the head into partition ledgers)")
        if sign > 0:
            return
        if new_count < 0:
            raise NonMemberDelete(f"delete of {r} samples from a ledger holding {self._count}")
        if batch_counts is not None:
            if c_new > self.n_outputs and batch_counts[self.n_outputs:].any():
                raise NonMemberDelete("delete names a class index this head has never seen")
            left = self._class_counts - batch_counts[:self.n_outputs]
            if (left < 0).any():
                j = int(np.argmax(left < 0))
                raise NonMemberDelete(f"delete of {int(batch_counts[j])} samples of class {j}; "
                                      f"the ledger holds {int(self._class_counts[j])}")
        held = self._diagonals()
        gone = row_diagonals(Qc)
        after = wide.combine([(held[0] - gone[0], 30), (held[1] - gone[1], 15), (held[2] - gone[2], 0)])
        if wide.is_negative(after).any():
            i = int(np.argmax(wide.is_negative(after)))
            raise NonMemberDelete(f"delete would make S[{i},{i}] negative: those rows were never added")

    def _diagonals(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """Diagonals of the limbs (AA, X, BB), pending products included, without folding them."""
        held = (np.diagonal(self._AA), np.diagonal(self._X), np.diagonal(self._BB))
        if self._pending is None:
            return held
        pend = self._pending.diagonals()
        return held[0] + pend[0], held[1] + pend[1], held[2] + pend[2]

    def _accumulate_moments(self, a: NDArray[np.float64], b: NDArray[np.float64], s: NDArray[np.float64],
                            Y: NDArray[np.int64], sign: int) -> None:
        """G's limbs += sign * (a^T ya, a^T yb + b^T ya, b^T yb) for one chunk (<= ROW_BLOCK rows).
        The same Karatsuba split as S: the cross limb is s^T (ya + yb) minus the other two; every
        product sums at most ROW_BLOCK terms below 2.25*2^30, so the float64 GEMMs are exact."""
        ya, yb = split_labels(Y)
        op = np.add if sign > 0 else np.subtract
        gbb = b.T @ yb
        if ya.any():
            gaa = a.T @ ya
            gx = s.T @ (ya + yb)
            gx -= gaa
            gx -= gbb
            op(self._GAA, exact_int(gaa), out=self._GAA)
        else:  # labels below 2^14 (class indices on a grid k_y <= 13): GAA gets nothing, GX = a^T yb
            gx = a.T @ yb
        op(self._GX, exact_int(gx), out=self._GX)
        op(self._GBB, exact_int(gbb), out=self._GBB)

    def fold(self) -> None:
        """Fold the pending float64 products into the int64 limbs. No change of value: every reader
        (digest, gram, blobs, absorb, copy) does it first; call it to pay that cost up front."""
        if self._pending is not None:
            self._pending.fold_into(self._AA, self._X, self._BB)

    @classmethod
    def from_rows(cls, Q: ArrayLike, y: ArrayLike, n_outputs: int = 0, frac_bits: int = 30,
                  label_frac_bits: int = 0) -> ExactLedger:
        """The ledger of exactly these rows (e.g. a packed batch for federated mode)."""
        Qa = np.asarray(Q)
        d = Qa.shape[-1] if Qa.ndim else 0
        led = cls(d, n_outputs, frac_bits, label_frac_bits)
        led.add(Q, y)
        return led

    def absorb(self, other: ExactLedger, sign: int = +1) -> None:
        """In place: self += sign * other (the packed-statistics path). Validated before mutation."""
        if sign not in (1, -1):
            raise LedgerError("sign must be +1 or -1")
        if not isinstance(other, ExactLedger):
            raise LedgerError(f"can only absorb an ExactLedger, got {type(other).__name__}")
        if (other.dim, other.frac_bits, other.label_frac_bits) != (self.dim, self.frac_bits, self.label_frac_bits):
            raise LedgerError(
                "incompatible ledgers: (dim, frac_bits, label_frac_bits) "
                f"{(other.dim, other.frac_bits, other.label_frac_bits)} "
                f"vs {(self.dim, self.frac_bits, self.label_frac_bits)}")
        new_count = self._count + sign * other._count
        if new_count > MAX_COUNT:
            raise OverflowBudgetError(
                f"ledger would hold {new_count} samples; the exactness budget is < 2^32 per ledger "
                "(split the head into partition ledgers)")
        c_new = max(self.n_outputs, other.n_outputs)
        self.fold()
        other.fold()
        if sign < 0:
            if other.n_outputs > self.n_outputs and other._class_counts[self.n_outputs:].any():
                raise NonMemberDelete("delete names a class index this head has never seen")
            if new_count < 0:
                raise NonMemberDelete(f"delete of {other._count} samples from a ledger holding {self._count}")
            oc = np.zeros(c_new, np.int64)
            oc[:other.n_outputs] = other._class_counts
            sc = np.zeros(c_new, np.int64)
            sc[:self.n_outputs] = self._class_counts
            if (sc - oc < 0).any():
                j = int(np.argmax(sc - oc < 0))
                raise NonMemberDelete(f"delete of {int(oc[j])} samples of class {j}; the ledger holds {int(sc[j])}")
            diag = wide.combine([
                (np.diagonal(self._AA) - np.diagonal(other._AA), 30),
                (np.diagonal(self._X) - np.diagonal(other._X), 15),
                (np.diagonal(self._BB) - np.diagonal(other._BB), 0),
            ])
            if wide.is_negative(diag).any():
                i = int(np.argmax(wide.is_negative(diag)))
                raise NonMemberDelete(f"delete would make S[{i},{i}] negative: those rows were never added")
        # Validation passed: mutate.
        if c_new > self.n_outputs:
            self._grow_outputs(c_new)
        c_o = other.n_outputs
        if sign > 0:
            self._AA += other._AA
            self._X += other._X
            self._BB += other._BB
            self._GAA[:, :c_o] += other._GAA
            self._GX[:, :c_o] += other._GX
            self._GBB[:, :c_o] += other._GBB
            self._class_counts[:c_o] += other._class_counts
        else:
            self._AA -= other._AA
            self._X -= other._X
            self._BB -= other._BB
            self._GAA[:, :c_o] -= other._GAA
            self._GX[:, :c_o] -= other._GX
            self._GBB[:, :c_o] -= other._GBB
            self._class_counts[:c_o] -= other._class_counts
        self._count = new_count
        self._mutations += 1

    def _grow_outputs(self, c_new: int) -> None:
        pad = c_new - self.n_outputs
        z = np.zeros((self.dim, pad), np.int64)
        self._GAA = np.hstack([self._GAA, z])
        self._GX = np.hstack([self._GX, z])
        self._GBB = np.hstack([self._GBB, z])
        self._class_counts = np.concatenate([self._class_counts, np.zeros(pad, np.int64)])
        self._mutations += 1

    def grow_outputs(self, n_outputs: int) -> None:
        """Widen the head to ``n_outputs`` (zero columns); shrinking is refused."""
        if n_outputs < self.n_outputs:
            raise LedgerError(f"cannot shrink outputs from {self.n_outputs} to {n_outputs}")
        if n_outputs > self.n_outputs:
            self._grow_outputs(n_outputs)

    def merge(self, other: ExactLedger) -> ExactLedger:
        """A new ledger of the disjoint union: ledgers of partitions sum exactly."""
        out = self.copy()
        out.absorb(other, +1)
        return out

    def __add__(self, other: ExactLedger) -> ExactLedger:
        return self.merge(other)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExactLedger):
            return NotImplemented
        return self.digest() == other.digest() and np.array_equal(self._class_counts, other._class_counts)

    __hash__ = None  # type: ignore[assignment]  # mutable

    # ------------------------------------------------------------------ exact values
    def _S_wide(self) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
        """S_int's upper triangle as 128-bit (hi, lo) (d, d); the strict lower part is zero."""
        self.fold()
        return wide.combine([(self._AA, 30), (self._X, 15), (self._BB, 0)])

    def _G_wide(self) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
        return wide.combine([(self._GAA, 30), (self._GX, 15), (self._GBB, 0)])

    def gram_int(self) -> NDArray[np.object_]:
        """S_int as Python ints (d, d) -- for audits and tests on small d."""
        return _mirror_upper(np.array(wide.to_pyints(self._S_wide()), dtype=object).reshape(self.dim, self.dim))

    def moments_int(self) -> NDArray[np.object_]:
        """G_int as Python ints (d, c)."""
        return np.array(wide.to_pyints(self._G_wide()), dtype=object).reshape(self.dim, self.n_outputs)

    def gram(self) -> NDArray[np.float64]:
        """Float64 S at real scale, S_int * 2^-2k, by a fixed sequence of operations (deterministic).
        Returns a fresh array (cached per state, copied out)."""
        scale = 2.0 ** (-2 * self.frac_bits)
        return self._cached("gram", lambda: _mirror_upper(self._gram_upper(scale))).copy()

    def _gram_upper(self, scale: float) -> NDArray[np.float64]:
        self.fold()
        return wide.upper_to_float64([(self._AA, 30), (self._X, 15), (self._BB, 0)], scale)

    def moments(self) -> NDArray[np.float64]:
        """Float64 G at real scale, G_int * 2^-(k + k_y)."""
        scale = 2.0 ** (-(self.frac_bits + self.label_frac_bits))
        return self._cached("moments", lambda: wide.to_float64(self._G_wide()) * scale).copy()

    def digest(self) -> str:
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
        return self._cached("digest", self._compute_digest)

    def _compute_digest(self) -> str:
        h = hashlib.sha256()
        h.update(DIGEST_DOMAIN)
        h.update(struct.pack("<qqqqq", self.dim, self.n_outputs, self.frac_bits, self.label_frac_bits, self._count))
        # S's upper triangle, row-major, fed to the hash 32 rows at a time: the same byte stream as
        # one encoding of the whole triangle, without its (d^2 / 2)-entry temporaries (every reset)
        self.fold()
        d = self.dim
        idx = _triu_flat(d)
        limbs = [(M.ravel(), shift) for M, shift in ((self._AA, 30), (self._X, 15), (self._BB, 0))]
        for i0 in range(0, d, _DIGEST_ROWS):
            seg = idx[_triu_start(d, i0):_triu_start(d, min(d, i0 + _DIGEST_ROWS))]
            h.update(wide.to_le_bytes(wide.combine([(v.take(seg), shift) for v, shift in limbs])))
        h.update(wide.to_le_bytes(self._G_wide()))
        return h.hexdigest()

    def _upper_limbs(self) -> list[NDArray[np.int64]]:
        """The upper triangles (row-major) of AA, X, BB: what the digest and the blobs encode."""
        self.fold()
        idx = _triu_flat(self.dim)
        return [M.ravel().take(idx) for M in (self._AA, self._X, self._BB)]

    # ------------------------------------------------------------------ serialization
    def to_bytes(self) -> bytes:
        """Versioned, checksummed snapshot (restores the limbs, class counts and count).

        Layout (little-endian): magic "ULDG", u16 version=1, i64 d, c, k, k_y, count;
        i64 class_counts[c]; i64 upper triangles (row-major) of AA, X, BB (d(d+1)/2 each);
        i64 GAA, GX, GBB (d x c each, row-major); 32-byte SHA-256 of everything before it.
        """
        parts = [
            _HEADER.pack(_BLOB_MAGIC, _BLOB_VERSION, self.dim, self.n_outputs, self.frac_bits,
                         self.label_frac_bits, self._count),
            self._class_counts.astype("<i8").tobytes(),
            *(M.astype("<i8").tobytes() for M in self._upper_limbs()),
            self._GAA.astype("<i8").tobytes(), self._GX.astype("<i8").tobytes(), self._GBB.astype("<i8").tobytes(),
        ]
        body = b"".join(parts)
        return body + hashlib.sha256(body).digest()

    @classmethod
    def from_bytes(cls, blob: bytes) -> ExactLedger:
        """Inverse of to_bytes; rejects truncated, corrupted or unknown-version input with LedgerError."""
        blob = bytes(blob)
        if len(blob) < _HEADER.size + 32:
            raise LedgerError(f"ledger blob truncated ({len(blob)} bytes)")
        magic, version, d, c, k, k_y, count = _HEADER.unpack_from(blob, 0)
        if magic != _BLOB_MAGIC:
            raise LedgerError("not a ledger blob (bad magic)")
        if version != _BLOB_VERSION:
            raise LedgerError(f"unknown ledger blob version {version}")
        if not (1 <= d <= 1 << 16 and 0 <= c <= MAX_CLASS_INDEX + 1 and 0 <= k <= 30 and 0 <= k_y <= 30
                and 0 <= count <= MAX_COUNT):
            raise LedgerError("ledger blob header out of range")
        t = d * (d + 1) // 2
        expected = _HEADER.size + 8 * (c + 3 * t + 3 * d * c) + 32
        if len(blob) != expected:
            raise LedgerError(f"ledger blob has {len(blob)} bytes, expected {expected}")
        if hashlib.sha256(blob[:-32]).digest() != blob[-32:]:
            raise LedgerError("ledger blob checksum mismatch (corrupted)")
        led = cls(d, c, k, k_y)
        off = _HEADER.size

        def take(n: int) -> NDArray[np.int64]:
            nonlocal off
            a = np.frombuffer(blob, dtype="<i8", count=n, offset=off).astype(np.int64)
            off += 8 * n
            return a

        led._class_counts = take(c)
        idx = _triu_flat(d)
        for name in ("_AA", "_X", "_BB"):
            M = np.zeros((d, d), np.int64)  # stored upper-triangular, as the updates keep it
            M.ravel()[idx] = take(t)
            setattr(led, name, M)
        for name in ("_GAA", "_GX", "_GBB"):
            setattr(led, name, take(d * c).reshape(d, c))
        led._count = int(count)
        return led
