"""Quantization at the featurizer: floats become exact integers once, and never again.

Features are (optionally) L2-normalized so every component is bounded by 1, then mapped to the
grid q = rint(f * 2^k) (round half to even, as numpy.rint). The grid is part of the backbone phi:
the retrain reference uses the same q. Out-of-bound or non-finite input is rejected, never
clipped, because clipping would silently change the model the user asked for.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import QuantizationError

#: Largest |q| the split-GEMM scheme accepts: halves of q stay <= 2^15 so products stay < 2^31.
QMAX = 1 << 30


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
