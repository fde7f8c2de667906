"""What an update hands the ledger, validated: quantized feature rows and their labels on the
integer grid (class indices one-hot scaled by 2^k_y, or a quantized target matrix)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import LedgerError
from .quantize import QMAX

#: Largest class index accepted (keeps c, and so W, a sane size).
MAX_CLASS_INDEX = (1 << 20) - 1


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
