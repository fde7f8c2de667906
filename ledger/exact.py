"""The exact integer ledger: S = sum q q^T and G = sum q y^T over the retained multiset, from the
quantized rows to the ledger's canonical encodings.

**Why integers.** Float ledgers never return to zero after add-then-delete and their residue
grows with the stream. Integers cancel bit for bit, so the ledger after any interleaving, order or
partitioning of adds and deletes equals the ledger built from scratch on what is retained.

**Quantization at the featurizer**: floats become exact integers once, and never again. Features
are (optionally) L2-normalized so every component is bounded by 1, then mapped to the grid
q = rint(f * 2^k) (round half to even, as numpy.rint). The grid is part of the backbone phi: the
retrain reference uses the same q. Out-of-bound or non-finite input is rejected, never clipped,
because clipping would silently change the model the user asked for. What an update hands the
ledger is checked to be on the grid (``check_rows``, ``label_matrix``: class indices one-hot
scaled by 2^k_y, or a quantized target matrix).

**Limbs** (docs/design.md section 2). Every q (|q| <= 2^30) splits as q = a*2^15 + b with b in
[-2^14, 2^14), and s = a + b. The three symmetric limb matrices

    AA = sum a a^T,   X = sum (a b^T + b a^T),   BB = sum b b^T,   S_int = AA*2^30 + X*2^15 + BB

are kept in int64 (bounded by n * 2^30 < 2^62 for n < 2^32 samples); G uses the same split of the
integer labels. The limbs are a deterministic function of the multiset, so equal multisets have
equal limbs. S's limbs are stored as upper triangles (the strict lower part is zero) and mirrored
only when S is read.

**Exact products through float64 BLAS.** The limbs come from three *symmetric* products, KK =
sum s s^T giving the cross limb as X = KK - AA - BB (Karatsuba: three products instead of four),
each computed by ``dsyrk`` on the upper triangle only. Float64 is exact here: |a| <= 2^15,
|b| <= 2^14 and |s| < 1.5*2^15, so one row adds at most 2^30 to AA and X, 2^28 to BB and
2.25*2^30 to KK. A float64 accumulator fed by at most ``EXACT_ROWS`` = 2^20 rows therefore only
ever holds integers below 2.25*2^50 < 2^53 -- every partial sum is exact, whatever the BLAS's
summation order, blocking or FMA use -- and the limbs derived from it stay below 2^50 in
magnitude, which the conversion to int64 requires.

The accumulators live *pending* in float64 (``PendingProducts``) and are folded into the int64
limbs only when a reader needs exact values or the row budget is spent: an update of S is three
in-place ``dsyrk`` calls and nothing else, and the float->int conversion is paid once per read,
not per update. Small updates (fewer than ``DEFER_ROWS`` rows: a delete, a trickle of adds) are
not even multiplied at once: their split rows wait and go into one ``dsyrk`` per sign with the
rows deferred after them, once ``DEFER_ROWS`` are waiting or at the next read. Every product is
an exact integer whatever the grouping, so the limbs are the same bits; the O(d^2) memory pass of
a rank-1 update is paid once per ``DEFER_ROWS`` rows instead of once per row. A delete's
membership check reads the diagonals, which the deferred rows give directly (``diagonals``).

**Encodings**: the ledger's digest (what verifiers compare) and its versioned, checksummed blob
(what deltas and checkpoints carry), pure functions of the limbs; ``ExactLedger.digest``,
``to_bytes`` and ``from_bytes`` are the API.

**The multiset hash** (:class:`MultisetHash`): an incremental, order-independent hash of the
retained rows (docs/design.md section 6).

Why: the ledger digest (section 2) is the certificate, but it hashes the d(d+1)/2 + d*c integers
of the ledger, O(d^2) per event. A receipt needs a commitment that costs O(row). This is LtHash
(Lewi et al., "Securing Update Propagation with Homomorphic Hashing", 2019; the 1024 x 32-bit
parameter set of its implementation, folly's ``LtHash<32, 1024>``): each row is hashed to a vector
of 1024 lanes with SHAKE-128, and the multiset's hash is the lane-wise sum mod 2^32. So an add is
``+h(row)``, a delete ``-h(row)``, partition hashes sum to the whole, and any order of the same
adds and deletes gives the same state, bit for bit.

Byte for byte (all integers signed little-endian)::

    element:     SHAKE-128(row encoding), 4096 bytes read as u32 lanes[0..1023], little-endian
    row encoding:
      b"unlearn.mset.row/v1\\x00"          20 bytes: the domain tag, NUL-terminated
      i64 d, i64 k, i64 k_y              the feature dimension and the feature / label grids
      i64 label_kind, i64 m              0, 1 for a class index; 1, c for a target vector of c values
      i64 q[0..d-1]                      the quantized features
      i64 label[0..m-1]                  the class index, or the quantized target vector
    state:       u32 lanes[0..1023], each the sum of the elements' lanes mod 2^32 (4096 bytes)
    fingerprint: SHA-256(b"unlearn.mset/v1\\x00" || state), 32 bytes (64 hex characters)

Content only: the sample id is not hashed. The hash commits to the multiset of rows, which is
what determines the ledger, so anyone holding the retained rows can recompute it, as they can the
digest. 32-bit lanes, not LtHash's usual 16: the same row may be retained up to 2^32 - 1 times
(the ledger's budget), and with 16-bit lanes 65536 copies of a row would hash to nothing.
"""

from __future__ import annotations

import hashlib
import struct
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.linalg.blas import dsyr, dsyrk

from unlearn.ledger import wide
from unlearn.ledger.errors import LedgerError, NonMemberDelete, OverflowBudgetError, QuantizationError

__all__ = [
    "MAX_CLASS_INDEX",
    "MAX_COUNT",
    "ExactLedger",
    "SufficientStatistics",
]

#: Rows one float64 accumulator may hold: products sum below 2.25*2^50 (exact), limbs below 2^50.
EXACT_ROWS = 1 << 20
#: Rows split and multiplied per BLAS call: keeps the float halves of a chunk in cache.
ROW_BLOCK = 512
#: Updates of fewer rows are deferred, and the deferred rows multiplied once this many wait: one
#: rank-64 ``dsyrk`` at d = 768 costs about what 3-4 rank-1 updates do (each a pass over 3 x 4.7 MB).
DEFER_ROWS = 64

# x + 1.5*2^52 has the integer x in its low mantissa bits for |x| < 2^51: the float->int64
# conversion becomes one float add and one int subtract (SIMD), instead of a scalar cast.
_MAGIC = 1.5 * 2.0**52
_MAGIC_BITS = np.array(_MAGIC).view(np.int64)


def split_rows(Q: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """The halves a, b and s = a + b of int64 rows, as float64 (exact small integers).

    a = floor((q + 2^14) / 2^15) is computed in float64: q + 2^14 is an integer below 2^31 and the
    scaling by 2^-15 is exact, so the floor equals the integer shift ``(q + 2^14) >> 15``.
    """
    b = Q.astype(np.float64)
    a = np.add(b, 16384.0)
    np.multiply(a, 2.0**-15, out=a)
    np.floor(a, out=a)
    s = np.multiply(a, 32768.0)
    np.subtract(b, s, out=b)
    np.add(a, b, out=s)
    return a, b, s


def split_labels(Y: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The halves of an integer label matrix, as float64 (same split as the rows)."""
    a, b, _ = split_rows(Y)
    return a, b


def exact_int(M: NDArray[np.float64]) -> NDArray[np.int64]:
    """int64 of a float64 array holding integers below 2^51 in magnitude (exact, no scalar cast)."""
    v = np.add(M, _MAGIC).view(np.int64)
    v -= _MAGIC_BITS
    return v


def _fold_exact(target: NDArray[np.int64], P: NDArray[np.float64]) -> None:
    """target += P for P holding integers below 2^51; P is clobbered (used as the int buffer)."""
    P += _MAGIC
    v = P.view(np.int64)
    v -= _MAGIC_BITS
    target += v


def syrk_upper(alpha: float, M: NDArray[np.float64], C: NDArray[np.float64], accumulate: bool) -> None:
    """C[upper] = alpha * M^T M (+ C[upper] when ``accumulate``), in place; C's lower part untouched.

    ``M`` is C-ordered (r, d) and ``C`` a C-ordered (d, d) buffer: BLAS sees C^T (Fortran order) and
    fills its lower triangle, which is C's upper one -- no copy of either operand. One row takes the
    level-2 ``dsyr`` (no GEMM set-up: 1.4x-3x faster than ``dsyrk`` with k = 1 at d = 768-1536).
    """
    if accumulate and M.shape[0] == 1:
        out = dsyr(alpha, M[0], a=C.T, lower=1, overwrite_a=1)
    else:
        out = dsyrk(alpha, M.T, beta=1.0 if accumulate else 0.0, c=C.T, trans=0, lower=1, overwrite_c=1)
    if not np.may_share_memory(out, C):  # pragma: no cover - f2py copies only for a wrongly laid out C
        raise RuntimeError("dsyrk did not update the accumulator in place")


class PendingProducts:
    """float64 upper triangles of AA, BB and KK over the rows not yet folded into the int64 limbs.

    The strict lower triangles are never written (they stay zero), so a fold adds zeros there and the
    int64 limbs stay upper-triangular. ``rows`` counts the rows accumulated since the last fold (adds
    and deletes alike, multiplied or deferred: the bound is on sum |product|). While no row has been
    multiplied since the last fold the buffers hold stale values, and the next product overwrites
    them (BLAS beta = 0) instead of paying for a reset.
    """

    def __init__(self, dim: int) -> None:
        self.AA = np.zeros((dim, dim))
        self.BB = np.zeros((dim, dim))
        self.KK = np.zeros((dim, dim))
        self.rows = 0
        self._multiplied = 0  # rows whose products are in AA, BB, KK since the last fold
        self._deferred: dict[int, list[tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]]] = {
            1: [], -1: []}
        self._n_deferred = 0
        self._deferred_diag = np.zeros((3, dim), np.int64)  # the deferred rows' (aa, bb, kk) diagonals

    @property
    def room(self) -> int:
        """Rows that can still be accumulated exactly before a fold."""
        return EXACT_ROWS - self.rows

    @property
    def deferred(self) -> int:
        """Rows waiting to be multiplied (small updates since the last flush)."""
        return self._n_deferred

    def accumulate(self, a: NDArray[np.float64], b: NDArray[np.float64], s: NDArray[np.float64], sign: int) -> None:
        """Add sign * (a^T a, b^T b, s^T s) for at most ``room`` rows: now (upper triangles, in place),
        or, for fewer than ``DEFER_ROWS`` rows, with later rows (the arrays are kept, not copied)."""
        r = a.shape[0]
        if r > self.room:
            raise ValueError(f"{r} rows exceed the exact budget ({self.room} left): fold first")
        self.rows += r
        if r < DEFER_ROWS:
            self._deferred[sign].append((a, b, s))
            self._n_deferred += r
            for i, v in enumerate((a, b, s)):  # each sum is below 2^53 (fewer than DEFER_ROWS rows): exact
                diag = exact_int(np.einsum("ij,ij->j", v, v))
                if sign > 0:
                    self._deferred_diag[i] += diag
                else:
                    self._deferred_diag[i] -= diag
            if self._n_deferred >= DEFER_ROWS:
                self.flush()
            return
        self._multiply(a, b, s, sign)

    def _multiply(self, a: NDArray[np.float64], b: NDArray[np.float64], s: NDArray[np.float64], sign: int) -> None:
        acc = self._multiplied > 0
        alpha = float(sign)
        syrk_upper(alpha, a, self.AA, acc)
        syrk_upper(alpha, b, self.BB, acc)
        syrk_upper(alpha, s, self.KK, acc)
        self._multiplied += a.shape[0]

    def flush(self) -> None:
        """Multiply the deferred rows: one ``dsyrk`` per limb and sign."""
        for sign, parts in self._deferred.items():
            if parts:
                a, b, s = (np.concatenate([p[i] for p in parts]) for i in range(3))
                self._multiply(a, b, s, sign)
                parts.clear()
        self._n_deferred = 0
        self._deferred_diag[:] = 0

    def diagonals(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """Pending diagonals of (AA, X, BB) as int64, deferred rows included (zeros when nothing is
        pending): O(d), the deferred rows' diagonals are summed as they arrive."""
        aa, bb, kk = self._deferred_diag.copy()
        if self._multiplied:
            aa += exact_int(np.diagonal(self.AA))
            bb += exact_int(np.diagonal(self.BB))
            kk += exact_int(np.diagonal(self.KK))
        return aa, kk - aa - bb, bb

    def fold_into(self, AA: NDArray[np.int64], X: NDArray[np.int64], BB: NDArray[np.int64]) -> None:
        """Add the pending products to the int64 limbs exactly, then mark the buffers stale."""
        self.flush()
        if self._multiplied:
            self.KK -= self.AA  # X = KK - AA - BB: integers below 2^51 at every step, so exact
            self.KK -= self.BB
            _fold_exact(AA, self.AA)
            _fold_exact(BB, self.BB)
            _fold_exact(X, self.KK)
        self.rows = 0
        self._multiplied = 0


def row_diagonals(Q: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Diagonals of the limbs (AA, X, BB) of these rows alone: what a delete takes off S's diagonal."""
    out = [np.zeros(Q.shape[1], np.int64) for _ in range(3)]
    for s0 in range(0, Q.shape[0], ROW_BLOCK):
        a, b, s = split_rows(Q[s0:s0 + ROW_BLOCK])
        aa, bb, kk = (np.einsum("ij,ij->j", v, v) for v in (a, b, s))
        out[0] += exact_int(aa)
        out[1] += exact_int(kk - aa - bb)
        out[2] += exact_int(bb)
    return out[0], out[1], out[2]


def accumulate_moments(G: tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]], a: NDArray[np.float64],
                       b: NDArray[np.float64], s: NDArray[np.float64], Y: NDArray[np.int64], sign: int) -> None:
    """G's limbs (GAA, GX, GBB) += sign * (a^T ya, a^T yb + b^T ya, b^T yb) for one chunk of split
    rows (<= ROW_BLOCK), in place. The same Karatsuba split as S: the cross limb is
    s^T (ya + yb) minus the other two; every product sums at most ROW_BLOCK terms below
    2.25*2^30, so the float64 GEMMs are exact."""
    GAA, GX, GBB = G
    ya, yb = split_labels(Y)
    op = np.add if sign > 0 else np.subtract
    gbb = b.T @ yb
    if ya.any():
        gaa = a.T @ ya
        gx = s.T @ (ya + yb)
        gx -= gaa
        gx -= gbb
        op(GAA, exact_int(gaa), out=GAA)
    else:  # labels below 2^14 (class indices on a grid k_y <= 13): GAA gets nothing, GX = a^T yb
        gx = a.T @ yb
    op(GX, exact_int(gx), out=GX)
    op(GBB, exact_int(gbb), out=GBB)


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


#: Largest |q| the split-GEMM scheme accepts: halves of q stay <= 2^15 so products stay < 2^31.
QMAX = 1 << 30
#: Largest class index accepted (keeps c, and so W, a sane size).
MAX_CLASS_INDEX = (1 << 20) - 1


def l2_normalize(F: ArrayLike, eps: float = 1e-12) -> NDArray[np.float64]:
    """Scale each row to unit L2 norm (rows of zeros stay zero) so |f_i| <= 1 holds by design."""
    X = np.asarray(F, dtype=np.float64)
    if X.ndim == 1:
        X = X[None, :]
    norms = np.sqrt(np.einsum("ij,ij->i", X, X))
    return X / np.maximum(norms, eps)[:, None]


def with_intercept(F: ArrayLike, value: float = 1.0) -> NDArray[np.float64]:
    """Append a constant column, the paper's intercept-by-augmentation (f <- [f, 1]).

    The intercept is then regularized like every other weight (as in the paper); choose
    ``value`` < 1 to regularize it more weakly relative to its scale.
    """
    X = np.asarray(F, dtype=np.float64)
    if X.ndim == 1:
        X = X[None, :]
    return np.hstack([X, np.full((X.shape[0], 1), value, dtype=np.float64)])


class Quantizer:
    """Maps float features to int64 on the grid 2^-frac_bits, rejecting what it cannot represent.

    ``bound * 2^frac_bits`` may not exceed 2^30: that is what keeps every split-GEMM product
    exact (docs/design.md section 2).
    """

    def __init__(self, frac_bits: int = 30, bound: float = 1.0) -> None:
        if not isinstance(frac_bits, (int, np.integer)) or not 0 <= int(frac_bits) <= 30:
            raise ValueError(f"frac_bits must be an int in 0..30, got {frac_bits!r}")
        if not (np.isfinite(bound) and bound > 0):
            raise ValueError(f"bound must be a finite positive number, got {bound!r}")
        if bound * float(1 << int(frac_bits)) > QMAX:
            raise ValueError(
                f"bound * 2^frac_bits = {bound} * 2^{frac_bits} exceeds 2^30; "
                "lower frac_bits or the bound so integer products stay exact"
            )
        self.frac_bits = int(frac_bits)
        self.bound = float(bound)
        self.scale = float(1 << self.frac_bits)

    def __repr__(self) -> str:
        return f"Quantizer(frac_bits={self.frac_bits}, bound={self.bound})"

    def quantize(self, F: ArrayLike) -> NDArray[np.int64]:
        """Return rint(F * 2^k) as int64 (shape (r, d)); a 1-d input is one row.

        Raises QuantizationError naming the first offending row for NaN/Inf or |f| > bound.
        """
        X = np.asarray(F)
        if X.dtype.kind not in "fiub":
            raise QuantizationError(f"features must be numeric, got dtype {X.dtype}")
        X = X.astype(np.float64, copy=False)
        if X.ndim == 1:
            X = X[None, :]
        if X.ndim != 2:
            raise QuantizationError(f"features must be 1-d or 2-d, got shape {X.shape}")
        finite = np.isfinite(X)
        if not finite.all():
            row = int(np.argmin(finite.all(axis=1)))
            raise QuantizationError(f"row {row}: feature is NaN or infinite")
        over = np.abs(X) > self.bound
        if over.any():
            row = int(np.argmax(over.any(axis=1)))
            col = int(np.argmax(over[row]))
            raise QuantizationError(
                f"row {row}: |feature[{col}]| = {abs(X[row, col]):.6g} exceeds the bound {self.bound} "
                "(features are rejected, never clipped; L2-normalize them first)"
            )
        return np.rint(X * self.scale).astype(np.int64)

    def dequantize(self, Q: ArrayLike) -> NDArray[np.float64]:
        """The float64 features the ledger actually represents: q * 2^-k (exact)."""
        return np.asarray(Q, dtype=np.int64).astype(np.float64) / self.scale


def quantize_targets(Y: ArrayLike, frac_bits: int, bound: float = 1.0) -> NDArray[np.int64]:
    """Quantize real-valued/soft labels on their own grid 2^-frac_bits (same rules as features)."""
    return Quantizer(frac_bits=frac_bits, bound=bound).quantize(Y)


def check_rows(Q: ArrayLike, dim: int) -> NDArray[np.int64]:
    """Validate quantized rows: integer dtype, shape (r, dim), |q| <= 2^30."""
    arr = np.asarray(Q)
    if arr.dtype.kind not in "iu":
        raise LedgerError(f"Q must be an integer array from Quantizer.quantize, got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise LedgerError(f"Q must have shape (r, {dim}), got {np.asarray(Q).shape}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > QMAX:
        raise LedgerError("Q has values beyond 2^30")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.max() > QMAX or arr.min() < -QMAX):  # min/max: no |arr| temporary
        row = int(np.argmax((np.abs(arr) > QMAX).any(axis=1)))
        raise LedgerError(f"row {row}: |q| exceeds 2^30, not a value the Quantizer produces")
    return arr


def label_matrix(y: ArrayLike, r: int, n_outputs: int,
                 label_frac_bits: int) -> tuple[NDArray[np.int64], NDArray[np.int64] | None]:
    """Integer label matrix Y (r, c') of ``r`` rows for a head of ``n_outputs`` outputs and, for
    class-index labels, the indices. Class index j becomes the row with 2^label_frac_bits at
    column j (one-hot on the label grid)."""
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
        c = max(n_outputs, int(idx.max()) + 1 if r else 0)
        Y = np.zeros((r, c), np.int64)
        Y[np.arange(r), idx] = 1 << label_frac_bits
        return Y, idx
    if arr.ndim == 2:
        if arr.shape[0] != r:
            raise LedgerError(f"target matrix has {arr.shape[0]} rows for {r} feature rows")
        if arr.shape[1] < n_outputs:
            raise LedgerError(f"target matrix has {arr.shape[1]} columns, the head has {n_outputs} outputs")
        if arr.shape[1] > MAX_CLASS_INDEX + 1:
            raise LedgerError(f"target matrix has too many columns ({arr.shape[1]})")
        Y = arr.astype(np.int64, copy=False)
        if Y.size and np.abs(Y).max() > QMAX:
            raise LedgerError("quantized targets must satisfy |y| <= 2^30")
        return Y, None
    raise LedgerError(f"labels must be 1-d class indices or a 2-d target matrix, got shape {arr.shape}")


class SufficientStatistics(Protocol):
    """What a head solver needs: float64 S and G at real scale."""

    @property
    def dim(self) -> int: ...

    def gram(self) -> NDArray[np.float64]: ...

    def moments(self) -> NDArray[np.float64]: ...


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


def _check_grid(dim: int, n_outputs: int, frac_bits: int, label_frac_bits: int) -> None:
    if int(dim) < 1:
        raise LedgerError(f"dim must be >= 1, got {dim}")
    if int(n_outputs) < 0:
        raise LedgerError(f"n_outputs must be >= 0, got {n_outputs}")
    if not 0 <= int(frac_bits) <= 30 or not 0 <= int(label_frac_bits) <= 30:
        raise LedgerError("frac_bits and label_frac_bits must be in 0..30")


def _check_budget(count: int) -> None:
    if count > MAX_COUNT:
        raise OverflowBudgetError(
            f"ledger would hold {count} samples; the exactness budget is < 2^32 per ledger "
            "(split the head into partition ledgers)")


def _refuse_non_member(held: int, gone: int, held_classes: NDArray[np.int64], gone_classes: NDArray[np.int64] | None,
                       diagonal_after: list[tuple[NDArray[np.int64], int]]) -> None:
    """NonMemberDelete when removing ``gone`` samples (per class: ``gone_classes``, None for
    target-matrix labels) from ``held`` would leave a negative count, a class index never seen, a
    negative class count, or a negative diagonal of S (its limbs after the removal, with shifts):
    a delete of something never added."""
    if held - gone < 0:
        raise NonMemberDelete(f"delete of {gone} samples from a ledger holding {held}")
    if gone_classes is None:
        pass
    elif gone_classes[held_classes.shape[0]:].any():
        raise NonMemberDelete("delete names a class index this head has never seen")
    else:
        n = min(held_classes.shape[0], gone_classes.shape[0])
        left = held_classes.copy()
        left[:n] -= gone_classes[:n]
        if (left < 0).any():
            j = int(np.argmax(left < 0))
            raise NonMemberDelete(f"delete of {int(gone_classes[j])} samples of class {j}; "
                                  f"the ledger holds {int(held_classes[j])}")
    after = wide.combine(diagonal_after)
    if wide.is_negative(after).any():
        i = int(np.argmax(wide.is_negative(after)))
        raise NonMemberDelete(f"delete would make S[{i},{i}] negative: those rows were never added")


class ExactLedger:
    """Exact sufficient statistics of a ridge head, in integers.

    ``dim``: feature dimension d. ``n_outputs``: c, grows when a larger class index or a wider
    target matrix is added (class-incremental heads); it never shrinks, so a from-scratch
    reference must be built with the same ``n_outputs``. ``frac_bits``: k of the feature grid;
    ``label_frac_bits``: k_y of the label grid (0 = class indices / integer targets).
    """

    def __init__(self, dim: int, n_outputs: int = 0, frac_bits: int = 30, label_frac_bits: int = 0) -> None:
        _check_grid(dim, n_outputs, frac_bits, label_frac_bits)
        self.dim = int(dim)
        self.frac_bits = int(frac_bits)
        self.label_frac_bits = int(label_frac_bits)
        d, c = self.dim, int(n_outputs)
        # S's limbs (stored upper-triangular) and G's: S_int = AA*2^30 + X*2^15 + BB, G_int likewise
        self._AA, self._X, self._BB = (np.zeros((d, d), np.int64) for _ in range(3))
        self._GAA, self._GX, self._GBB = (np.zeros((d, c), np.int64) for _ in range(3))
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

    # ------------------------------------------------------------------ updates
    def add(self, Q: ArrayLike, y: ArrayLike) -> None:
        """Add the rows Q (int64 (r, d)) with labels y; all or nothing."""
        self.apply_prepared(*self.prepare_rows(Q, y), +1)

    def delete(self, Q: ArrayLike, y: ArrayLike) -> None:
        """Remove the rows Q with labels y. Refused atomically (NonMemberDelete) when it would make
        the count, a class count or a diagonal of S negative -- a delete of something never added."""
        self.apply_prepared(*self.prepare_rows(Q, y), -1)

    def prepare_rows(self, Q: ArrayLike, y: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.int64],
                                                                NDArray[np.int64] | None]:
        """Validate an update once: (rows, integer label matrix, class indices or None).
        Callers that also need Y (the fast head) validate here and then ``apply_prepared``."""
        Qc = check_rows(Q, self.dim)
        Y, idx = label_matrix(y, Qc.shape[0], self.n_outputs, self.label_frac_bits)
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
        _check_budget(self._count + sign * r)
        if sign < 0:
            held, gone = self._diagonals(), row_diagonals(Qc)
            _refuse_non_member(self._count, r, self._class_counts, batch_counts,
                               [(held[0] - gone[0], 30), (held[1] - gone[1], 15), (held[2] - gone[2], 0)])
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
            accumulate_moments((self._GAA, self._GX, self._GBB), a, b, s, Yp[s0:s0 + n], sign)
            s0 += n
        if batch_counts is not None:
            self._class_counts += sign * batch_counts
        self._count += sign * r
        self._mutations += 1

    def _diagonals(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """Diagonals of the limbs (AA, X, BB), pending products included, without folding them."""
        held = (np.diagonal(self._AA), np.diagonal(self._X), np.diagonal(self._BB))
        if self._pending is None:
            return held
        pend = self._pending.diagonals()
        return held[0] + pend[0], held[1] + pend[1], held[2] + pend[2]

    def fold(self) -> None:
        """Fold the pending float64 products into the int64 limbs. No change of value: every reader
        (digest, gram, blobs, absorb, copy) does it first; call it to pay that cost up front."""
        if self._pending is not None:
            self._pending.fold_into(self._AA, self._X, self._BB)

    @classmethod
    def from_rows(cls, Q: ArrayLike, y: ArrayLike, n_outputs: int = 0, frac_bits: int = 30,
                  label_frac_bits: int = 0) -> ExactLedger:
        """The ledger of exactly these rows (e.g. a packed batch for federated mode)."""
        led = cls(np.shape(Q)[-1] if np.ndim(Q) else 0, n_outputs, frac_bits, label_frac_bits)
        led.add(Q, y)
        return led

    def absorb(self, other: ExactLedger, sign: int = +1) -> None:
        """In place: self += sign * other (the packed-statistics path). Validated before mutation."""
        if sign not in (1, -1):
            raise LedgerError("sign must be +1 or -1")
        if not isinstance(other, ExactLedger):
            raise LedgerError(f"can only absorb an ExactLedger, got {type(other).__name__}")
        if (other.dim, other.frac_bits, other.label_frac_bits) != (self.dim, self.frac_bits, self.label_frac_bits):
            raise LedgerError("incompatible ledgers: (dim, frac_bits, label_frac_bits) "
                              f"{(other.dim, other.frac_bits, other.label_frac_bits)} "
                              f"vs {(self.dim, self.frac_bits, self.label_frac_bits)}")
        new_count = self._count + sign * other._count
        _check_budget(new_count)
        c_new = max(self.n_outputs, other.n_outputs)
        self.fold()
        other.fold()
        if sign < 0:
            after = [(np.diagonal(mine) - np.diagonal(theirs), shift) for mine, theirs, shift in
                     ((self._AA, other._AA, 30), (self._X, other._X, 15), (self._BB, other._BB, 0))]
            _refuse_non_member(self._count, other._count, self._class_counts, other._class_counts, after)
        # Validation passed: mutate.
        if c_new > self.n_outputs:
            self._grow_outputs(c_new)
        c_o = other.n_outputs
        op = np.add if sign > 0 else np.subtract
        for mine, theirs in ((self._AA, other._AA), (self._X, other._X), (self._BB, other._BB)):
            op(mine, theirs, out=mine)
        for mine, theirs in ((self._GAA, other._GAA), (self._GX, other._GX), (self._GBB, other._GBB)):
            op(mine[:, :c_o], theirs, out=mine[:, :c_o])
        op(self._class_counts[:c_o], other._class_counts, out=self._class_counts[:c_o])
        self._count = new_count
        self._mutations += 1

    def _grow_outputs(self, c_new: int) -> None:
        pad = c_new - self.n_outputs
        z = np.zeros((self.dim, pad), np.int64)
        self._GAA, self._GX, self._GBB = (np.hstack([M, z]) for M in (self._GAA, self._GX, self._GBB))
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
    def gram_int(self) -> NDArray[np.object_]:
        """S_int as Python ints (d, d) -- for audits and tests on small d."""
        S = wide.to_pyints(wide.combine(shifted(self.parts().gram)))
        return _mirror_upper(np.array(S, dtype=object).reshape(self.dim, self.dim))

    def moments_int(self) -> NDArray[np.object_]:
        """G_int as Python ints (d, c)."""
        G = wide.to_pyints(wide.combine(shifted(self.parts().moments)))
        return np.array(G, dtype=object).reshape(self.dim, self.n_outputs)

    def gram(self) -> NDArray[np.float64]:
        """Float64 S at real scale, S_int * 2^-2k, by a fixed sequence of operations (deterministic).
        Returns a fresh array (cached per state, copied out)."""
        scale = 2.0 ** (-2 * self.frac_bits)
        return self._cached("gram", lambda: _mirror_upper(
            wide.upper_to_float64(shifted(self.parts().gram), scale))).copy()

    def moments(self) -> NDArray[np.float64]:
        """Float64 G at real scale, G_int * 2^-(k + k_y)."""
        scale = 2.0 ** (-(self.frac_bits + self.label_frac_bits))
        return self._cached("moments", lambda: wide.to_float64(wide.combine(shifted(self.parts().moments))) * scale
                            ).copy()

    def digest(self) -> str:
        """Hex SHA-256 of the canonical encoding of the exact integers (:func:`ledger_digest`):
        equal digests = equal ledgers, whoever computes them."""
        return self._cached("digest", lambda: ledger_digest(self.parts()))

    def parts(self) -> LedgerParts:
        """The grid, counts and limbs (pending products folded in; the arrays are the ledger's own)."""
        self.fold()
        return LedgerParts(self.dim, self.n_outputs, self.frac_bits, self.label_frac_bits, self._count,
                           self._class_counts, (self._AA, self._X, self._BB), (self._GAA, self._GX, self._GBB))

    # ------------------------------------------------------------------ serialization
    def to_bytes(self) -> bytes:
        """Versioned, checksummed snapshot (:func:`encode_ledger`)."""
        return encode_ledger(self.parts())

    @classmethod
    def from_bytes(cls, blob: bytes) -> ExactLedger:
        """Inverse of to_bytes; rejects truncated, corrupted or unknown-version input with LedgerError."""
        p = decode_ledger(blob)
        led = cls(p.dim, p.n_outputs, p.frac_bits, p.label_frac_bits)
        led._class_counts = p.class_counts
        led._AA, led._X, led._BB = p.gram
        led._GAA, led._GX, led._GBB = p.moments
        led._count = p.retained
        return led


#: Retained-sample budget per ledger; beyond it int64 limbs could overflow.
MAX_COUNT = (1 << 32) - 1

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
    parts = [
        BLOB_HEADER.pack(BLOB_MAGIC, BLOB_VERSION, p.dim, p.n_outputs, p.frac_bits, p.label_frac_bits, p.retained),
        p.class_counts.astype("<i8").tobytes(),
        *(M.astype("<i8").tobytes() for M in upper_limbs(p.gram)),
        *(M.astype("<i8").tobytes() for M in p.moments),
    ]
    body = b"".join(parts)
    return body + hashlib.sha256(body).digest()


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
