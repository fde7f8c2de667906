"""The fast head (Variant B): a float tracker of the ridge head, beside the exact ledger, in inverse
or factor form, and the policy that resets it from the ledger.

Updates cost O(r d^2) instead of the O(d^3) of a solve. Float drift accumulates, so a tracker is
always paired with the exact ledger: ``reset(ledger)`` restores the canonical head (bit-identical
to ``solve_head``) and reports how far the fast head had drifted.

**Inverse form** (:class:`SMWTracker`): track T = (S + gamma*I)^-1 and W with
Sherman-Morrison-Woodbury rank-r updates. A downdate is only applied when I - U T U^T is safely
positive definite (Lemma 1); otherwise the tracker refuses and the caller resets from the ledger
instead of publishing a wrong head.

**Factor form** (:class:`CholeskyTracker`): track the Cholesky factor L of H = S + gamma*I. A
reset is one Cholesky and two solves (as in Variant A) instead of also forming H^-1, the factor
stays accurate where T = H^-1 loses digits (small gamma, ill-conditioned S), and a downdate that
would lose positive definiteness shows up as a failed Cholesky of an r x r or nb x nb matrix
before anything is touched. The update (blocked, level-3 BLAS; docs/design.md section 2): with
P = L^-1 V (d x r),

    L L^T + sigma V V^T = L (I + sigma P P^T) L^T = (L M)(L M)^T,   M = chol(I + sigma P P^T).

M is lower triangular and semiseparable: its diagonal blocks are M_JJ = chol(I + P_J S_J P_J^T) and
its blocks below them are P_K B_J^T, where S_J = (sigma I + P_<J^T P_<J)^-1 is carried forward as an
r x r matrix (S <- S - B_J^T B_J) and B_J = M_JJ^-1 P_J S_J. So the new column block J of L is

    L~[:, J] = L[:, J] M_JJ + (sum_{K > J} L[:, K] P_K) B_J^T,

one forward sweep over small matrices and one backward sweep with one GEMM and one matrix-vector
product per block: O(d^2 (nb + r)) flops, no d x d temporary, L updated in place. Two kernels do
the update: ``hyhound`` (the compiled hyperbolic-Householder update/downdate of the ``hyhound``
package, where its wheel exists: Linux x86_64) by default, and the blocked sweep above in numpy
(``blocked``) everywhere else; bench/results/ledger_kernel.md (section 8) compares them with SMW.

**A live head** (:class:`TrackedHead`): the exact ledger (source of truth) plus a fast head of
either form (``tracker``), which share the drift checks and the reset policy. This is the pure
core the ledger processor wraps. Every update goes to the exact ledger first (which rejects
invalid deletes atomically), then to the fast tracker: at once (``add``, ``delete``), or, for a
caller that applies many messages between publications (the ledger processor), ``apply`` now and
``sync`` once later (apply-then-sync: the rows of every message applied since in one tracker
update). The canonical head is restored from the ledger every ``reset_every`` updates, on an
infeasible/ill-conditioned downdate, when the drift estimate passes ``drift_threshold``, when
``sync`` has packed statistics or at least ``d / 2`` rows to take, or when the caller asks (e.g.
a timer).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Literal, Protocol

import numpy as np
import scipy.linalg as sla
from numpy.typing import ArrayLike, NDArray
from scipy.linalg.blas import dtrsm, dtrsv
from scipy.linalg.lapack import dpotrf

from unlearn.ledger.exact import ExactLedger, SufficientStatistics
from unlearn.ledger.solve import (
    cholesky_factor,
    inverse_from_factor,
    posterior_inverse,
    regularized_gram,
    solve_with_factor,
)

__all__ = [
    "DowndateCheck",
    "SMWTracker",
    "lemma1_check",
    "posterior_inverse",
    "prepare_update",
    "relative_deviation",
    "residual_drift",
    "BLOCK",
    "DEFAULT_FACTOR_KERNEL",
    "CholeskyTracker",
    "FactorKernel",
    "Generators",
    "chol_rank_update",
    "hyperbolic_rank_update",
    "tri_solve",
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


try:  # compiled factor update/downdate; its wheels exist for Linux x86_64 only (pyproject marker)
    hyhound: ModuleType | None = importlib.import_module("hyhound")
except ImportError:  # pragma: no cover - exercised on platforms without the wheel
    hyhound = None

FactorKernel = Literal["hyhound", "blocked"]
#: The factor update the tracker uses unless told otherwise: the compiled one where installed.
DEFAULT_FACTOR_KERNEL: FactorKernel = "hyhound" if hyhound is not None else "blocked"

#: A downdate whose Lemma-1 pivot is below this keeps a copy of L first: hyhound works in place and
#: leaves NaNs where a downdate at the margin of positive definiteness fails, and a refused
#: downdate must leave the factor as it was. Pivots of ordinary deletes are near 1 - leverage.
BACKUP_BELOW_PIVOT = 1e-3

#: Columns of L per block of the update: small enough that the M_JJ products stay cheap for rank 1,
#: large enough that the per-block overhead of the Python loop does not dominate.
BLOCK = 48


def tri_solve(L: NDArray[np.float64], B: NDArray[np.float64], transpose: bool = False) -> NDArray[np.float64]:
    """L^-1 B (or L^-T B) for a lower-triangular L, in either memory order, without copying L.

    A C-ordered L is handed to BLAS as its Fortran view L^T (upper triangular); one column takes
    ``dtrsv``. (An f2py call with the wrong order copies L first: ~3 ms at d = 768.)
    """
    if L.flags.f_contiguous:
        A, lower, trans = L, 1, int(transpose)
    else:
        A, lower, trans = L.T, 0, int(not transpose)
    if B.shape[1] == 1:
        return dtrsv(A, B[:, 0], lower=lower, trans=trans)[:, None]
    return dtrsm(1.0, A, B, lower=lower, trans_a=trans)


@dataclass(frozen=True)
class Generators:
    """The factor M of I + sigma P P^T (see the module docstring): M_JJ and B_J per column block."""

    P: NDArray[np.float64]
    starts: list[int]
    blocks: list[tuple[NDArray[np.float64], NDArray[np.float64]]]

    def solve(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """M^-1 X by block forward substitution, O(d (nb + r) k) for X (d, k): M's strictly lower
        blocks are P_K B_J^T, so the history of earlier blocks is one r x k running sum."""
        Z = np.empty_like(X)
        R = np.zeros((self.P.shape[1], X.shape[1]))  # sum_{K < J} B_K^T z_K
        for j0, (M, B) in zip(self.starts, self.blocks):
            j1 = j0 + M.shape[0]
            Z[j0:j1] = dtrsm(1.0, M, X[j0:j1] - self.P[j0:j1] @ R, lower=1)
            R += B.T @ Z[j0:j1]
        return Z


def factor_generators(P: NDArray[np.float64], sigma: int, block: int = BLOCK) -> Generators | None:
    """Forward sweep: M_JJ = chol(I + P_J S P_J^T), B_J = M_JJ^-1 P_J S, S <- S - B_J^T B_J, starting
    from S = sigma I. None when a diagonal block is not positive definite (downdate past PD)."""
    d, r = P.shape
    S = float(sigma) * np.eye(r)
    starts = list(range(0, d, block))
    blocks = []
    for j0 in starts:
        PJ = P[j0:j0 + block]
        PS = PJ @ S
        C = PS @ PJ.T
        C.flat[::C.shape[0] + 1] += 1.0
        M, info = dpotrf(C.T, lower=1, clean=1, overwrite_a=1)  # C is symmetric: C.T is C, Fortran-ordered
        if info != 0:
            return None
        B = dtrsm(1.0, M, PS, lower=1)
        S -= B.T @ B
        blocks.append((M, B))
    return Generators(P, starts, blocks)


def apply_generators(L: NDArray[np.float64], gen: Generators) -> None:
    """Backward sweep, in place: L[:, J] <- [L[:, J], T_J] @ [M_JJ; B_J^T] with the running tail sum
    T_J = sum_{K > J} L[:, K] P_K (its rows above block K are zero, so only rows j0: are touched).
    One GEMM per block on a copied [L_J, T_J] panel beats two thin ones plus an add."""
    d = L.shape[0]
    P = gen.P
    r = P.shape[1]
    T = np.zeros((d, r))
    panel = np.empty((d, max(M.shape[0] for M, _ in gen.blocks) + r))
    for j0, (M, B) in zip(reversed(gen.starts), reversed(gen.blocks)):
        nb = M.shape[0]
        Lj = L[j0:, j0:j0 + nb]
        w = panel[:d - j0, :nb + r]
        w[:, :nb] = Lj
        w[:, nb:] = T[j0:]
        T[j0:] += Lj @ P[j0:j0 + nb]
        np.matmul(w, np.vstack([M, B.T]), out=Lj)


def chol_rank_update(L: NDArray[np.float64], V: NDArray[np.float64], sigma: int,
                     P: NDArray[np.float64] | None = None, block: int = BLOCK) -> Generators | None:
    """In place: L <- L~ with L~ L~^T = L L^T + sigma V V^T (L lower, either order; V (d, r); sigma = +-1).

    ``P`` = L^-1 V when the caller already has it. Returns the generators of M (L~ = L M, so
    L~^-1 X = M^-1 L^-1 X), or None with L untouched when the downdate would lose positive
    definiteness.
    """
    if P is None:
        P = tri_solve(L, V)
    gen = factor_generators(P, sigma, block)
    if gen is not None:
        apply_generators(L, gen)
    return gen


def hyperbolic_rank_update(L: NDArray[np.float64], V: NDArray[np.float64], sigma: int) -> bool:
    """In place with ``hyhound``: L <- L~, L~ L~^T = L L^T + sigma V V^T (L lower, Fortran order).

    False when the result is not a valid factor (a downdate past positive definiteness): L then
    holds NaNs and must be restored or rebuilt by the caller. Only L's lower triangle is touched.
    """
    if hyhound is None:  # pragma: no cover - platforms without the wheel
        raise RuntimeError("the hyhound factor kernel is not installed: use kernel='blocked'")
    if not L.flags.f_contiguous:
        raise ValueError("hyperbolic_rank_update needs L in Fortran order")
    A = np.array(V, dtype=np.float64, order="F")  # hyhound overwrites it
    (hyhound.update_cholesky_inplace if sigma > 0 else hyhound.downdate_cholesky_inplace)(L, A)
    diag = np.diagonal(L)
    return bool(np.isfinite(diag).all() and diag.min() > 0.0)


class CholeskyTracker:
    """Fast head from a maintained Cholesky factor L of H = S + gamma*I (drop-in for SMWTracker).

    W is updated incrementally like SMW's (W += sigma H~^-1 (dG - U^T U W)); given the rows' labels
    Y (dG = U^T Y) the solve runs on r columns instead of c. ``T`` (the posterior inverse) is formed
    on demand only; right after a reset it is bit-identical to ``posterior_inverse``.
    """

    def __init__(self, L: NDArray[np.float64], W: NDArray[np.float64], gamma: float,
                 min_pivot: float = 1e-8, kernel: FactorKernel = DEFAULT_FACTOR_KERNEL) -> None:
        L = np.array(L, dtype=np.float64, order="F")  # LAPACK's order: no copies in the solves
        W = np.array(W, dtype=np.float64)
        if L.ndim != 2 or L.shape[0] != L.shape[1] or W.ndim != 2 or W.shape[0] != L.shape[0]:
            raise ValueError(f"need L (d, d) and W (d, c), got {L.shape} and {W.shape}")
        self.L = L
        self.W = W
        self.gamma = float(gamma)
        self.min_pivot = float(min_pivot)
        if kernel not in ("hyhound", "blocked"):
            raise ValueError(f"kernel must be 'hyhound' or 'blocked', got {kernel!r}")
        if kernel == "hyhound" and hyhound is None:
            raise ValueError("kernel 'hyhound' needs the hyhound package (Linux x86_64 wheels)")
        self.kernel: FactorKernel = kernel
        self.updates_since_reset = 0
        self.last_reset_drift = 0.0
        self._T: NDArray[np.float64] | None = None

    @classmethod
    def from_ledger(cls, stats: SufficientStatistics, gamma: float, min_pivot: float = 1e-8,
                    kernel: FactorKernel = DEFAULT_FACTOR_KERNEL) -> CholeskyTracker:
        """Start from the canonical factor of a ledger (L and W exactly as Variant A gives them)."""
        L = cholesky_factor(stats, gamma)
        return cls(L, solve_with_factor(L, stats.moments()), gamma, min_pivot, kernel)

    @property
    def dim(self) -> int:
        return self.L.shape[0]

    @property
    def n_outputs(self) -> int:
        return self.W.shape[1]

    @property
    def T(self) -> NDArray[np.float64]:
        """H^-1 from the factor, symmetrized -- computed on first use after each change."""
        if self._T is None:
            self._T = inverse_from_factor(self.L)
        return self._T

    def grow_outputs(self, n_outputs: int) -> None:
        """New classes start with zero weight columns (their G column was zero)."""
        if n_outputs > self.n_outputs:
            self.W = np.hstack([self.W, np.zeros((self.dim, n_outputs - self.n_outputs))])

    def _apply(self, U: NDArray[np.float64], dG: NDArray[np.float64], Y: NDArray[np.float64] | None,
               sign: int, P: NDArray[np.float64] | None) -> bool:
        L = self.L
        if self.kernel == "hyhound":
            if not hyperbolic_rank_update(L, U.T, sign):
                return False

            def inverse_times_rows() -> NDArray[np.float64]:  # H~^-1 U^T = L~^-T L~^-1 U^T
                return tri_solve(L, tri_solve(L, U.T), transpose=True)
        else:
            P0 = tri_solve(L, U.T) if P is None else P  # L^-1 U^T on the factor before the update
            gen = chol_rank_update(L, U.T, sign, P0)
            if gen is None:
                return False

            def inverse_times_rows() -> NDArray[np.float64]:  # = L~^-T M^-1 L^-1 U^T, M from the update
                return tri_solve(L, gen.solve(P0), transpose=True)
        if Y is not None and U.shape[0] < self.n_outputs:
            self.W += (sign * inverse_times_rows()) @ (Y - U @ self.W)
        else:
            R = dG - U.T @ (U @ self.W)
            R = tri_solve(L, tri_solve(L, R), transpose=True)
            self.W += R if sign > 0 else -R
        self._T = None
        self.updates_since_reset += 1
        return True

    def add(self, U: NDArray[np.float64], dG: NDArray[np.float64], Y: NDArray[np.float64] | None = None) -> None:
        """H += U^T U, G += dG (= U^T Y when the labels Y are given): an update never fails."""
        U, dG, Y = prepare_update(self, U, dG, Y)
        if not self._apply(U, dG, Y, +1, None):  # pragma: no cover - non-finite input only
            raise FloatingPointError("Cholesky update failed: non-finite rows or factor")

    def _downdate_check(self, U: NDArray[np.float64]) -> tuple[DowndateCheck, NDArray[np.float64]]:
        P = tri_solve(self.L, U.T)  # I - P^T P = I - U H^-1 U^T; P is reused by the downdate itself
        return lemma1_check(np.eye(U.shape[0]) - P.T @ P, U, self.gamma, self.min_pivot), P

    def check_downdate(self, U: NDArray[np.float64]) -> DowndateCheck:
        """Lemma 1: H - U^T U is PD iff I - U H^-1 U^T = I - P^T P is, P = L^-1 U^T."""
        return self._downdate_check(np.atleast_2d(np.asarray(U, dtype=np.float64)))[0]

    def delete(self, U: NDArray[np.float64], dG: NDArray[np.float64],
               Y: NDArray[np.float64] | None = None) -> DowndateCheck:
        """H -= U^T U, G -= dG if feasible; otherwise the state is left unchanged and the returned
        check says why (the caller must reset from the ledger)."""
        U, dG, Y = prepare_update(self, U, dG, Y)
        chk, P = self._downdate_check(U)
        in_place = self.kernel == "hyhound" and chk.feasible and chk.min_pivot < BACKUP_BELOW_PIVOT
        backup = self.L.copy(order="F") if in_place else None
        if chk.feasible and not self._apply(U, dG, Y, -1, P):
            # The r x r test passed but the factor's downdate failed (rounding at the margin): refuse
            # like an infeasible downdate. The blocked kernel fails before touching L; hyhound fails
            # in place, so L comes back from the copy taken at a small pivot. (A hyhound failure
            # far from the margin, never observed, leaves NaNs in L: a caller resets from the
            # ledger on any refused downdate, as TrackedHead does.)
            if backup is not None:
                self.L = backup
            return DowndateCheck(False, chk.min_pivot, "infeasible: factor downdate lost positive definiteness")
        return chk

    def reset(self, stats: SufficientStatistics) -> float:
        """Replace L and W by the canonical ones; return the drift of the fast head before it."""
        L = cholesky_factor(stats, self.gamma)
        W_canon = solve_with_factor(L, stats.moments())
        self.grow_outputs(W_canon.shape[1])
        drift = relative_deviation(self.W, W_canon) if self.W.shape == W_canon.shape else float("inf")
        # Fortran order as in __init__: hyhound updates L in place only in that order, and SciPy's
        # cholesky does not promise it (a newer SciPy returned C order and the next add failed).
        self.L, self.W = np.asfortranarray(L), W_canon
        self._T = None
        self.updates_since_reset = 0
        self.last_reset_drift = drift
        return drift

    def drift_estimate(self, stats: SufficientStatistics) -> float:
        """Cheap a-posteriori drift of the served W against the exact ledger (``residual_drift``)."""
        return residual_drift(stats, self.gamma, self.W)


HeadMode = Literal["exact", "fast"]
#: Rows the ledger holds and the fast head has not taken yet: (Q, Y, sign) from ``prepare_rows``.
Rows = list[tuple[NDArray[np.int64], NDArray[np.int64], int]]
TrackerKind = Literal["smw", "cholesky"]
#: The fast head's default form: the factor, 1.6-4x faster than SMW per update with the compiled kernel
#: and 2x cheaper to reset (docs/design.md section 2, bench/results/ledger_kernel.md section 8).
DEFAULT_TRACKER: TrackerKind = "cholesky"


@dataclass(frozen=True)
class UpdateReport:
    """What an update did to the served head."""

    mode: HeadMode  # "exact" right after a reset, else "fast"
    reset_reason: str = ""  # why a reset ran ("" when none)
    drift: float = 0.0  # drift of the fast head measured at that reset
    measured: bool = True  # False: the replaced fast head had not taken every row, so drift compares nothing


class TrackedHead:
    """Exact ledger + fast tracker (SMW or Cholesky factor) with periodic Cholesky resets."""

    def __init__(self, ledger: ExactLedger, gamma: float = 1.0, reset_every: int = 1000,
                 drift_threshold: float = 1e-9, drift_check_every: int = 64, min_pivot: float = 1e-8,
                 tracker: TrackerKind = DEFAULT_TRACKER,
                 factor_kernel: FactorKernel = DEFAULT_FACTOR_KERNEL) -> None:
        if reset_every < 1 or drift_check_every < 1:
            raise ValueError("reset_every and drift_check_every must be >= 1")
        if tracker not in ("smw", "cholesky"):
            raise ValueError(f"tracker must be 'smw' or 'cholesky', got {tracker!r}")
        self.ledger = ledger
        self.gamma = float(gamma)
        self.reset_every = int(reset_every)
        self.drift_threshold = float(drift_threshold)
        self.drift_check_every = int(drift_check_every)
        self.tracker: SMWTracker | CholeskyTracker = (
            CholeskyTracker.from_ledger(ledger, gamma, min_pivot, factor_kernel) if tracker == "cholesky"
            else SMWTracker.from_ledger(ledger, gamma, min_pivot))
        self.mode: HeadMode = "exact"
        self.resets = 0
        self._pending: Rows = []  # applied to the ledger, not yet to the fast head
        self._reset_due = ""  # why the next ``sync`` must reset ("" = it need not)

    @property
    def weights(self) -> NDArray[np.float64]:
        """The served head W (d, c): canonical after a reset, tracker-updated otherwise."""
        return self.tracker.W

    @property
    def posterior(self) -> NDArray[np.float64]:
        """(F^T F + gamma I)^-1 (d, d) as the fast head holds it: exact right after a reset."""
        return self.tracker.T

    @property
    def last_reset_drift(self) -> float:
        return self.tracker.last_reset_drift

    def _factor(self, Q: NDArray[np.int64], Y: NDArray[np.int64]
                ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        # U = Q * 2^-k is exact in float64 (|q| <= 2^30); U^T U is the real-scale delta S. The labels
        # go along so that the trackers can update W by r-column instead of c-column products.
        U = Q.astype(np.float64) * (2.0 ** -self.ledger.frac_bits)
        Yf = Y.astype(np.float64) * (2.0 ** -self.ledger.label_frac_bits)
        return U, U.T @ Yf, Yf

    def add(self, Q: ArrayLike, y: ArrayLike) -> UpdateReport:
        """Add rows to the ledger (exact) and to the fast head."""
        return self._update(Q, y, +1)

    def delete(self, Q: ArrayLike, y: ArrayLike) -> UpdateReport:
        """Delete rows; a non-member delete raises (from the ledger) and changes nothing."""
        return self._update(Q, y, -1)

    def _update(self, Q: ArrayLike, y: ArrayLike, sign: int) -> UpdateReport:
        Qc, Y, idx = self.ledger.prepare_rows(Q, y)
        self.ledger.apply_prepared(Qc, Y, idx, sign)
        return self.track([(Qc, Y, sign)])

    def apply(self, Q: ArrayLike, y: ArrayLike, sign: int) -> None:
        """Apply rows to the ledger now, all or nothing (a refused entry raises and changes
        nothing); the fast head takes them at the next ``sync``."""
        Qc, Y, idx = self.ledger.prepare_rows(Q, y)
        self.ledger.apply_prepared(Qc, Y, idx, sign)
        self._pending.append((Qc, Y, sign))

    def apply_packed(self, other: ExactLedger, sign: int) -> None:
        """Packed statistics into the ledger now; the next ``sync`` resets (no rows to factor, and
        factoring a Gram costs as much as the reset itself)."""
        self.ledger.absorb(other, sign)
        self._reset_due = "packed statistics"

    def sync(self) -> UpdateReport:
        """Bring the fast head up to the ledger: every row ``apply`` took since the last sync in one
        ``track``, or a reset when one is due (packed statistics) or cheaper (at least ``d / 2``
        rows: a tracker update of rank r costs O(r d^2), and at d = 768 a rank-384 update costs
        about as much as a reset). A reset here measures nothing (the replaced head lagged)."""
        pending, reason = self._pending, self._reset_due
        self.ledger_outputs_sync()  # columns the ledger grew (a contract's classes) serve as zeros
        rows = sum(Q.shape[0] for Q, _, _ in pending)
        if not reason and 2 * rows >= self.ledger.dim:
            reason = f"coalesced {rows} rows"
        if reason:
            return self.reset(reason, measured=self.mode == "fast")
        self._pending = []
        return self.track(pending)

    def track(self, batches: Sequence[tuple[NDArray[np.int64], NDArray[np.int64], int]]) -> UpdateReport:
        """Move the fast head by rows the ledger already holds: ``(Q, Y, sign)`` as ``prepare_rows``
        gave them. A caller that applies many batches to the ledger (the ledger processor, once
        per poll) updates the tracker once: all adds as one rank-r update, then all deletes as one
        (after the adds, so that the Lemma-1 check sees the largest H), then the reset policy."""
        before = self.tracker.updates_since_reset
        for sign in (1, -1):
            parts = [(Q, Y) for Q, Y, s in batches if s == sign and Q.shape[0]]
            if not parts:
                continue
            c = max(Y.shape[1] for _, Y in parts)
            Qs = np.concatenate([Q for Q, _ in parts])
            Ys = np.concatenate([np.pad(Y, ((0, 0), (0, c - Y.shape[1]))) for _, Y in parts])
            U, dG, Yf = self._factor(Qs, Ys)
            if sign > 0:
                self.tracker.add(U, dG, Yf)
            else:
                chk = self.tracker.delete(U, dG, Yf)
                if not chk.feasible:  # the fast head did not take the delete: nothing to measure
                    return self.reset(f"downdate {chk.reason}", measured=False)
        if self.tracker.updates_since_reset == before:
            return UpdateReport(self.mode)
        return self._after_update(before)

    def absorb(self, other: ExactLedger, sign: int) -> UpdateReport:
        """Packed statistics (federated mode): exact in the ledger, then a canonical reset (no rows
        to factor, and factoring a Gram costs as much as the reset itself)."""
        self.ledger.absorb(other, sign)
        return self.reset("packed statistics")

    def _after_update(self, before: int) -> UpdateReport:
        self.mode = "fast"
        t = self.tracker.updates_since_reset
        if t >= self.reset_every:
            return self.reset(f"periodic ({t} updates)")
        if t // self.drift_check_every > before // self.drift_check_every:  # passed a multiple: check
            est = self.tracker.drift_estimate(self.ledger)
            if est > self.drift_threshold:
                return self.reset(f"drift estimate {est:.3g} > {self.drift_threshold:.3g}")
        return UpdateReport(self.mode)

    def reset(self, reason: str = "requested", measured: bool = True) -> UpdateReport:
        """Canonical head from the ledger (Variant A), which also covers rows applied and not yet
        synced; the served head becomes exact. ``measured``: the caller knows the fast head was
        worth measuring, so the drift reported is the fast path's error; never while rows or
        statistics wait for ``sync`` (a stale head was replaced: its drift means nothing)."""
        measured = measured and not self._pending and not self._reset_due
        self._pending, self._reset_due = [], ""
        self.ledger_outputs_sync()
        drift = self.tracker.reset(self.ledger)
        self.mode = "exact"
        self.resets += 1
        return UpdateReport("exact", reason, drift, measured)

    def ledger_outputs_sync(self) -> None:
        self.tracker.grow_outputs(self.ledger.n_outputs)
