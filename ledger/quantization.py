"""The feature and label grid: floats become exact integers once (q = rint(f * 2^k)), and what an
update hands the ledger is checked to be on the grid.

Out-of-bound or non-finite input is rejected, never clipped: clipping would silently change the
model the user asked for (docs/design.md section 2, "Quantize once, at the featurizer").
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from unlearn.ledger.errors import LedgerError, QuantizationError

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
