"""Rows the fast head's H holds and its Cholesky factor does not yet (:class:`WaitingRows`), and
H^-1 through them.

Why: in the ledger worker the factor's rank-r update was the largest part of the fold of an adds
delta (``hyhound``: 6.4 of ~15 ms for 90 rows at d = 768), and a delete that arrives behind the
adds waits for that fold before its receipt. The served W does not need the updated factor. With
the waiting rows V (k x d) and their signs s (+1 added, -1 deleted), H = L L^T + V^T diag(s) V,
and with P = L^-1 V^T (d x k), by the Woodbury identity

    H^-1 X = L^-T (Z - P K^-1 P^T Z),   Z = L^-1 X,   K = diag(s) + P^T P   (k x k),

two triangular solves of X's columns and O(d k) per column more. ``CholeskyTracker`` keeps W exact
this way and folds the rows into L later (``fold_waiting``: the worker's idle time). K is
symmetric and, when deletes wait, indefinite: it is solved by LU (k is at most a few hundred).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import lu_factor, lu_solve

__all__ = ["WaitingRows"]


class WaitingRows:
    """V, s, P = L^-1 V^T and K = diag(s) + P^T P for the factor L they were taken against."""

    def __init__(self, dim: int) -> None:
        self.V = np.empty((0, dim))
        self.signs = np.empty(0)
        self.P = np.empty((dim, 0))
        self._K = np.empty((0, 0))
        self._lu: tuple[NDArray[np.float64], NDArray[np.int32]] | None = None

    def __len__(self) -> int:
        return int(self.V.shape[0])

    def append(self, U: NDArray[np.float64], sign: int, P_new: NDArray[np.float64]) -> None:
        """Rows U (r, d) now wait with ``sign``; ``P_new`` = L^-1 U^T for the same L."""
        cross = self.P.T @ P_new
        corner = P_new.T @ P_new
        corner.flat[::corner.shape[0] + 1] += float(sign)
        self._K = np.block([[self._K, cross], [cross.T, corner]])
        self.P = np.hstack([self.P, P_new])
        self.V = np.vstack([self.V, U])
        self.signs = np.concatenate([self.signs, np.full(U.shape[0], float(sign))])
        self._lu = None

    def correct(self, Z: NDArray[np.float64]) -> NDArray[np.float64]:
        """Z - P K^-1 P^T Z: for Z = L^-1 X, L^T times this is H^-1 X (module docstring)."""
        if not len(self):
            return Z
        if self._lu is None:
            self._lu = lu_factor(self._K, check_finite=False)
        return Z - self.P @ lu_solve(self._lu, self.P.T @ Z, check_finite=False)

    def split(self, most: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.intp]]:
        """The first ``most`` rows a fold takes (V rows, signs) and the indices of the rest. A fold
        takes the added rows before the deleted ones (every factor on the way is then of a matrix
        at least as large as the final H, so it stays positive definite), oldest first within each."""
        order = np.argsort(-self.signs, kind="stable")
        first = order[:most]
        return self.V[first], self.signs[first], np.sort(order[most:])

    def keep(self, rest: NDArray[np.intp], P_rest: NDArray[np.float64]) -> None:
        """Only the rows ``rest`` wait now, against a new factor L (the others were folded into it):
        ``P_rest`` = L^-1 V[rest]^T for that L."""
        V, signs = self.V[rest], self.signs[rest]
        K = P_rest.T @ P_rest
        K.flat[::K.shape[0] + 1] += signs
        self.V, self.signs, self.P, self._K, self._lu = V, signs, P_rest, K, None
