"""The fast head in inverse form (:class:`SMWTracker`): T = (S + gamma*I)^-1 and W tracked by
Sherman-Morrison-Woodbury rank-r updates, O(r d^2) instead of the O(d^3) of a solve.

A downdate is only applied when I - U T U^T is safely positive definite (Lemma 1); otherwise the
tracker refuses and the caller resets from the ledger instead of publishing a wrong head.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla
from numpy.typing import NDArray

from unlearn.ledger.exact_ledger import SufficientStatistics
from unlearn.ledger.solve import cholesky_factor, inverse_from_factor, solve_with_factor
from unlearn.ledger.tracker_checks import (
    DowndateCheck,
    lemma1_check,
    prepare_update,
    relative_deviation,
    residual_drift,
)

__all__ = [
    "SMWTracker",
]


class SMWTracker:
    """Fast head: T and W updated by rank-r SMW steps (paper eq. 7-10, Algorithm 2).

    ``min_pivot``: a downdate whose I - U T U^T has a squared Cholesky pivot below this is
    treated as ill-conditioned (the inverse update would amplify rounding by ~1/pivot) and refused.
    """

    def __init__(self, T: NDArray[np.float64], W: NDArray[np.float64], gamma: float, min_pivot: float = 1e-8) -> None:
        T = np.array(T, dtype=np.float64)
        W = np.array(W, dtype=np.float64)
        if T.ndim != 2 or T.shape[0] != T.shape[1] or W.ndim != 2 or W.shape[0] != T.shape[0]:
            raise ValueError(f"need T (d, d) and W (d, c), got {T.shape} and {W.shape}")
        self.T = T
        self.W = W
        self.gamma = float(gamma)
        self.min_pivot = float(min_pivot)
        self.updates_since_reset = 0
        self.last_reset_drift = 0.0

    @classmethod
    def from_ledger(cls, stats: SufficientStatistics, gamma: float, min_pivot: float = 1e-8) -> SMWTracker:
        """Start from the canonical solve of a ledger (T and W exactly as Variant A gives them)."""
        L = cholesky_factor(stats, gamma)
        return cls(inverse_from_factor(L), solve_with_factor(L, stats.moments()), gamma, min_pivot)

    @property
    def dim(self) -> int:
        return self.T.shape[0]

    @property
    def n_outputs(self) -> int:
        return self.W.shape[1]

    def grow_outputs(self, n_outputs: int) -> None:
        """New classes start with zero weight columns (their G column was zero)."""
        if n_outputs > self.n_outputs:
            self.W = np.hstack([self.W, np.zeros((self.dim, n_outputs - self.n_outputs))])

    def add(self, U: NDArray[np.float64], dG: NDArray[np.float64] | None, Y: NDArray[np.float64] | None = None) -> None:
        """H += U^T U, G += dG. Eq. (7): T+ = T - K (I + U K)^-1 K^T with K = T U^T;
        eq. (8): W+ = W - T+ U^T (U W) + T+ dG, or W+ = W + T+ U^T (Y - U W) when the rows'
        labels Y (dG = U^T Y) are given -- the same update without the d x d x c product T+ dG."""
        U, dG, Y = prepare_update(self, U, dG, Y)
        K = self.T @ U.T
        M = np.eye(U.shape[0]) + U @ K
        L = sla.cholesky(M, lower=True, check_finite=False)  # M is SPD: I + PSD
        Z = sla.solve_triangular(L, K.T, lower=True, check_finite=False)
        self.T -= Z.T @ Z
        TU = self.T @ U.T
        if Y is not None:
            self.W += TU @ (Y - U @ self.W)
        else:
            assert dG is not None  # prepare_update: dG or Y
            self.W += TU @ (-(U @ self.W)) + self.T @ dG
        self.updates_since_reset += 1

    def check_downdate(self, U: NDArray[np.float64]) -> DowndateCheck:
        """Lemma 1: H - U^T U is PD iff I - U T U^T is PD; test it by Cholesky."""
        U = np.atleast_2d(np.asarray(U, dtype=np.float64))
        return lemma1_check(np.eye(U.shape[0]) - U @ (self.T @ U.T), U, self.gamma, self.min_pivot)

    def delete(self, U: NDArray[np.float64], dG: NDArray[np.float64] | None,
               Y: NDArray[np.float64] | None = None) -> DowndateCheck:
        """H -= U^T U, G -= dG (eq. 9-10) if feasible; otherwise the state is left unchanged and
        the returned check says why (the caller must reset from the ledger)."""
        U, dG, Y = prepare_update(self, U, dG, Y)
        chk = self.check_downdate(U)
        if not chk.feasible:
            return chk
        K = self.T @ U.T
        M = np.eye(U.shape[0]) - U @ K
        L = sla.cholesky(M, lower=True, check_finite=False)
        Z = sla.solve_triangular(L, K.T, lower=True, check_finite=False)
        self.T += Z.T @ Z
        TU = self.T @ U.T
        if Y is not None:
            self.W -= TU @ (Y - U @ self.W)
        else:
            assert dG is not None  # prepare_update: dG or Y
            self.W += TU @ (U @ self.W) - self.T @ dG
        self.updates_since_reset += 1
        return chk

    def reset(self, stats: SufficientStatistics) -> float:
        """Replace T and W by the canonical solve; return the drift of the fast head before it."""
        L = cholesky_factor(stats, self.gamma)
        W_canon = solve_with_factor(L, stats.moments())
        self.grow_outputs(W_canon.shape[1])
        drift = relative_deviation(self.W, W_canon) if self.W.shape == W_canon.shape else float("inf")
        self.T = inverse_from_factor(L)
        self.W = W_canon
        self.updates_since_reset = 0
        self.last_reset_drift = drift
        return drift

    def drift_estimate(self, stats: SufficientStatistics) -> float:
        """Cheap a-posteriori drift of the served W against the exact ledger (``residual_drift``)."""
        return residual_drift(stats, self.gamma, self.W)
