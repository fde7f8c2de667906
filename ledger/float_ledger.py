"""The papers' float ledger (float64 or float32), kept for comparison with the exact ledger.

Adds and deletes are signed float updates of S and G; rounding residue never cancels, which is
exactly what the drift study and the strategy comparisons measure.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray


class FloatLedger:
    """S = F^T F and G = F^T Y accumulated in ``dtype`` (float64 by default)."""

    def __init__(self, dim: int, n_outputs: int, dtype: DTypeLike = np.float64) -> None:
        self.dim = int(dim)
        self.dtype = np.dtype(dtype)
        self.S = np.zeros((self.dim, self.dim), self.dtype)
        self.G = np.zeros((self.dim, int(n_outputs)), self.dtype)
        self.count = 0

    @property
    def n_outputs(self) -> int:
        return self.G.shape[1]

    def _targets(self, y: ArrayLike, r: int) -> NDArray:
        arr = np.asarray(y)
        if arr.ndim <= 1 and arr.dtype.kind in "iu":
            idx = np.atleast_1d(arr).astype(np.int64)
            if idx.size and idx.max() >= self.n_outputs:
                self.G = np.hstack([self.G, np.zeros((self.dim, int(idx.max()) + 1 - self.n_outputs), self.dtype)])
            Y = np.zeros((r, self.n_outputs), self.dtype)
            Y[np.arange(r), idx] = 1
            return Y
        return np.atleast_2d(arr).astype(self.dtype)

    def _apply(self, F: ArrayLike, y: ArrayLike, sign: int) -> None:
        X = np.atleast_2d(np.asarray(F)).astype(self.dtype)
        Y = self._targets(y, X.shape[0])
        if sign > 0:
            self.S += X.T @ X
            self.G += X.T @ Y
        else:
            self.S -= X.T @ X
            self.G -= X.T @ Y
        self.count += sign * X.shape[0]

    def add(self, F: ArrayLike, y: ArrayLike) -> None:
        self._apply(F, y, +1)

    def delete(self, F: ArrayLike, y: ArrayLike) -> None:
        self._apply(F, y, -1)

    def gram(self) -> NDArray[np.float64]:
        return self.S.astype(np.float64)

    def moments(self) -> NDArray[np.float64]:
        return self.G.astype(np.float64)
