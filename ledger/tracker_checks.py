"""What both fast-head trackers share: the Lemma-1 test of a downdate, the drift measures of a
fast head against the exact ledger, and the validation of a tracker update.

Why shared: the SMW and Cholesky trackers take the same updates and refuse the same downdates
(docs/design.md section 1, "Variant B"), so a caller's reset policy does not depend on the form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray
from scipy.linalg.lapack import dpotrf

from unlearn.ledger.exact_ledger import SufficientStatistics
from unlearn.ledger.solve import regularized_gram

__all__ = [
    "DowndateCheck",
    "lemma1_check",
    "prepare_update",
    "relative_deviation",
    "residual_drift",
]


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


def prepare_update(tracker: _Tracker, U: NDArray[np.float64], dG: NDArray[np.float64] | None,
                   Y: NDArray[np.float64] | None
                   ) -> tuple[NDArray[np.float64], NDArray[np.float64] | None, NDArray[np.float64] | None]:
    """Validate a tracker update: U (r, d) with dG (d, c') or the labels Y (r, c') or both, widened
    to the tracker's outputs (growing them first when c' is larger). With Y the trackers never read
    dG (= U^T Y), so a caller with labels may leave it None: at d = 768 it is a (d x r)(r x c)
    product over every column of the head (100 for an auto-created one), 0.45 ms for 90 rows."""
    U = np.asarray(U, dtype=np.float64)
    if U.ndim == 1:
        U = U[None, :]
    d = tracker.dim
    if dG is None and Y is None:
        raise ValueError("an update needs dG or the rows' labels Y")
    if dG is not None:
        dG = np.asarray(dG, dtype=np.float64)
    if Y is not None:
        Y = np.asarray(Y, dtype=np.float64).reshape(U.shape[0], -1)
    if U.shape[1] != d or (dG is not None and dG.shape[0] != d):
        raise ValueError(f"U must be (r, {d}) and dG ({d}, c); got {U.shape}, {None if dG is None else dG.shape}")
    tracker.grow_outputs(dG.shape[1] if dG is not None else Y.shape[1])  # type: ignore[union-attr]
    c = tracker.n_outputs
    if dG is not None and dG.shape[1] < c:
        dG = np.hstack([dG, np.zeros((d, c - dG.shape[1]))])
    if Y is not None and Y.shape[1] < c:
        Y = np.hstack([Y, np.zeros((U.shape[0], c - Y.shape[1]))])
    return U, dG, Y
