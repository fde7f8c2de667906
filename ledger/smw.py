"""Variant B: track T = (S + gamma*I)^-1 and W with Sherman-Morrison-Woodbury rank-r updates.

O(r d^2) per update instead of O(d^3). Float drift accumulates, so the tracker is always paired
with the exact ledger: ``reset(ledger)`` restores the canonical head (bit-identical to
``solve_head``) and reports how far the fast head had drifted. A downdate is only applied when
I - U T U^T is safely positive definite (Lemma 1); otherwise the tracker refuses and the caller
resets from the ledger instead of publishing a wrong head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import scipy.linalg as sla
from numpy.typing import NDArray
from scipy.linalg.lapack import dpotrf

from .exact import SufficientStatistics
from .solve import cholesky_factor, inverse_from_factor, posterior_inverse, regularized_gram, solve_with_factor


@dataclass(frozen=True)
class DowndateCheck:
    """Outcome of the Lemma-1 feasibility test for a downdate."""

    feasible: bool
    min_pivot: float  # smallest eigenvalue proxy of I - U T U^T (squared Cholesky pivot)
    reason: str = ""


def relative_deviation(W: NDArray[np.float64], W_ref: NDArray[np.float64]) -> float:
    """||W - W_ref||_F / ||W_ref||_F (absolute norm when the reference is zero)."""
    W = np.asarray(W, dtype=np.float64)
    W_ref = np.asarray(W_ref, dtype=np.float64)
    if W.shape != W_ref.shape:
        raise ValueError(f"shape mismatch: {W.shape} vs {W_ref.shape}")
    num = float(np.linalg.norm(W - W_ref))
    den = float(np.linalg.norm(W_ref))
    return num / den if den > 0 else num


def lemma1_check(M: NDArray[np.float64], U: NDArray[np.float64], gamma: float, min_pivot: float) -> DowndateCheck:
    """Lemma 1 on M = I - U H^-1 U^T (r x r): the downdate H - U^T U is PD iff M is, tested by Cholesky.

    Rounding in U H^-1 U^T is about eps * ||U||^2 * ||H^-1||, and ||H^-1|| <= 1/gamma: a squared
    pivot not clearly above that noise floor (or ``min_pivot``) is not evidence of feasibility.
    """
    L, info = dpotrf(M, lower=1, clean=1)
    if info != 0:
        return DowndateCheck(False, 0.0, "infeasible: I - U T U^T is not positive definite")
    piv = float(np.min(np.diagonal(L)) ** 2)
    noise = 64.0 * np.finfo(np.float64).eps * float(np.sum(U * U)) / gamma
    tol = max(min_pivot, noise)
    if piv < tol:
        return DowndateCheck(False, piv, f"ill-conditioned: pivot {piv:.3g} < {tol:.3g}")
    return DowndateCheck(True, piv)


def residual_drift(stats: SufficientStatistics, gamma: float, W: NDArray[np.float64]) -> float:
    """Cheap a-posteriori drift: relative residual ||H W - G||_F / ||G||_F with H, G from the exact
    ledger, O(d^2 c). The head error is bounded by cond(H) times this; a reset is cheaper than worrying."""
    H = regularized_gram(stats, gamma)
    G = stats.moments()
    den = float(np.linalg.norm(G))
    res = float(np.linalg.norm(H @ W[:, :G.shape[1]] - G))
    return res / den if den > 0 else res


class _Tracker(Protocol):
    @property
    def dim(self) -> int: ...

    @property
    def n_outputs(self) -> int: ...

    def grow_outputs(self, n_outputs: int) -> None: ...


def prepare_update(tracker: _Tracker, U: NDArray[np.float64], dG: NDArray[np.float64],
                   Y: NDArray[np.float64] | None
                   ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64] | None]:
    """Validate a tracker update: U (r, d), dG (d, c') and optional labels Y (r, c'), widened to the
    tracker's outputs (growing them first when c' is larger)."""
    U = np.asarray(U, dtype=np.float64)
    if U.ndim == 1:
        U = U[None, :]
    dG = np.asarray(dG, dtype=np.float64)
    d = tracker.dim
    if U.shape[1] != d or dG.shape[0] != d:
        raise ValueError(f"U must be (r, {d}) and dG ({d}, c); got {U.shape}, {dG.shape}")
    tracker.grow_outputs(dG.shape[1])
    c = tracker.n_outputs
    if dG.shape[1] < c:
        dG = np.hstack([dG, np.zeros((d, c - dG.shape[1]))])
    if Y is not None:
        Y = np.asarray(Y, dtype=np.float64).reshape(U.shape[0], -1)
        if Y.shape[1] < c:
            Y = np.hstack([Y, np.zeros((U.shape[0], c - Y.shape[1]))])
    return U, dG, Y


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

    def add(self, U: NDArray[np.float64], dG: NDArray[np.float64], Y: NDArray[np.float64] | None = None) -> None:
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
            self.W += TU @ (-(U @ self.W)) + self.T @ dG
        self.updates_since_reset += 1

    def check_downdate(self, U: NDArray[np.float64]) -> DowndateCheck:
        """Lemma 1: H - U^T U is PD iff I - U T U^T is PD; test it by Cholesky."""
        U = np.atleast_2d(np.asarray(U, dtype=np.float64))
        return lemma1_check(np.eye(U.shape[0]) - U @ (self.T @ U.T), U, self.gamma, self.min_pivot)

    def delete(self, U: NDArray[np.float64], dG: NDArray[np.float64],
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


__all__ = ["DowndateCheck", "SMWTracker", "lemma1_check", "posterior_inverse", "prepare_update",
           "relative_deviation", "residual_drift"]
