"""The fast head in factor form (:class:`CholeskyTracker`): the Cholesky factor L of
H = S + gamma*I, updated and downdated in place, and its two kernels.

Why a factor: a reset is one Cholesky and two solves (as in Variant A) instead of also forming
H^-1, the factor stays accurate where T = H^-1 loses digits (small gamma, ill-conditioned S), and a
downdate that would lose positive definiteness shows up as a failed Cholesky of an r x r or
nb x nb matrix before anything is touched. The update (blocked, level-3 BLAS; docs/design.md
section 2): with P = L^-1 V (d x r),

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
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy.linalg.blas import dtrsm, dtrsv
from scipy.linalg.lapack import dpotrf

from unlearn.ledger.exact_ledger import SufficientStatistics
from unlearn.ledger.solve import cholesky_factor, inverse_from_factor, solve_with_factor
from unlearn.ledger.tracker_checks import (
    DowndateCheck,
    lemma1_check,
    prepare_update,
    relative_deviation,
    residual_drift,
)
from unlearn.ledger.waiting_rows import WaitingRows

__all__ = [
    "BLOCK",
    "DEFAULT_FACTOR_KERNEL",
    "CholeskyTracker",
    "FactorKernel",
    "Generators",
    "chol_rank_update",
    "hyperbolic_rank_update",
    "tri_solve",
]


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

    With ``hold_rows`` > 0, up to that many rows of an ``add(wait=True)`` may wait outside the
    factor (``waiting``: H = L L^T + the waiting rows, W kept exact through them,
    waiting_rows.py) until ``fold_waiting`` takes them into L; a delete waits too, behind waiting
    rows or alone (its W then takes two passes over L, not four with the downdate: L is 4.7 MB at
    d = 768, read from memory when the delete comes after idle time); an update that would make
    more wait folds them all first. A delete whose Lemma-1 pivot is under ``BACKUP_BELOW_PIVOT``
    never waits: it is taken against the folded factor.
    """

    def __init__(self, L: NDArray[np.float64], W: NDArray[np.float64], gamma: float,
                 min_pivot: float = 1e-8, kernel: FactorKernel = DEFAULT_FACTOR_KERNEL,
                 hold_rows: int = 0) -> None:
        L = np.array(L, dtype=np.float64, order="F")  # LAPACK's order: no copies in the solves
        W = np.array(W, dtype=np.float64)
        if L.ndim != 2 or L.shape[0] != L.shape[1] or W.ndim != 2 or W.shape[0] != L.shape[0]:
            raise ValueError(f"need L (d, d) and W (d, c), got {L.shape} and {W.shape}")
        self.L = L
        self.W = W
        self._live = (W != 0).any(axis=0)  # columns that may be nonzero: _apply skips the others
        self.gamma = float(gamma)
        self.min_pivot = float(min_pivot)
        if kernel not in ("hyhound", "blocked"):
            raise ValueError(f"kernel must be 'hyhound' or 'blocked', got {kernel!r}")
        if kernel == "hyhound" and hyhound is None:
            raise ValueError("kernel 'hyhound' needs the hyhound package (Linux x86_64 wheels)")
        self.kernel: FactorKernel = kernel
        self.hold_rows = int(hold_rows)
        self._idle_seen = True  # rows may wait: no update found the hold full since the last ``fold_waiting``
        self.waiting = WaitingRows(L.shape[0])
        self.updates_since_reset = 0
        self.last_reset_drift = 0.0
        self._T: NDArray[np.float64] | None = None

    @classmethod
    def from_ledger(cls, stats: SufficientStatistics, gamma: float, min_pivot: float = 1e-8,
                    kernel: FactorKernel = DEFAULT_FACTOR_KERNEL, hold_rows: int = 0) -> CholeskyTracker:
        """Start from the canonical factor of a ledger (L and W exactly as Variant A gives them)."""
        L = cholesky_factor(stats, gamma)
        return cls(L, solve_with_factor(L, stats.moments()), gamma, min_pivot, kernel, hold_rows)

    @property
    def dim(self) -> int:
        return self.L.shape[0]

    @property
    def n_outputs(self) -> int:
        return self.W.shape[1]

    @property
    def T(self) -> NDArray[np.float64]:
        """H^-1 from the factor, symmetrized -- computed on first use after each change (the
        waiting rows are folded first)."""
        if self._T is None:
            self._fold_first(len(self.waiting))
            self._T = inverse_from_factor(self.L)
        return self._T

    def grow_outputs(self, n_outputs: int) -> None:
        """New classes start with zero weight columns (their G column was zero)."""
        if n_outputs > self.n_outputs:
            self._live = np.concatenate([self._live, np.zeros(n_outputs - self.n_outputs, bool)])
            self.W = np.hstack([self.W, np.zeros((self.dim, n_outputs - self.n_outputs))])

    def _apply(self, U: NDArray[np.float64], dG: NDArray[np.float64] | None, Y: NDArray[np.float64] | None,
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
        self._update_weights(U, dG, Y, sign, inverse_times_rows)
        self._T = None
        self.updates_since_reset += 1
        return True

    def _inverse(self, X: NDArray[np.float64], Z: NDArray[np.float64] | None = None) -> NDArray[np.float64]:
        """H^-1 X, the waiting rows included (``Z`` = L^-1 X when the caller has it)."""
        Z = tri_solve(self.L, X) if Z is None else Z
        return tri_solve(self.L, self.waiting.correct(Z), transpose=True)

    def _wait(self, U: NDArray[np.float64], dG: NDArray[np.float64] | None, Y: NDArray[np.float64] | None,
              sign: int, P: NDArray[np.float64] | None) -> None:
        """The rows wait outside the factor; W moves exactly through them (``_inverse``)."""
        P = tri_solve(self.L, U.T) if P is None else P
        self.waiting.append(U, sign, P)
        self._update_weights(U, dG, Y, sign, lambda: self._inverse(U.T, P))
        self._T = None
        self.updates_since_reset += 1

    def _may_wait(self, r: int) -> bool:
        return self._idle_seen and len(self.waiting) + r <= self.hold_rows

    def _fold_now(self) -> None:
        """An update that may not wait folds the waiting rows first. Rows wait again only after the
        next ``fold_waiting`` (the holder's idle time): a holder that is never idle would otherwise
        pay for L^-1 U^T of rows that are folded without waiting for anything (+15% per row)."""
        if len(self.waiting):
            self._idle_seen = False
        self._fold_first(len(self.waiting))

    def fold_waiting(self, most: int | None = None) -> int:
        """Idle work: take up to ``most`` (all: None) waiting rows into L, added before deleted;
        returns how many. W does not change. A downdate that loses positive definiteness in
        rounding (the Lemma-1 check at the delete passed) raises FloatingPointError and leaves the
        factor and the waiting rows as they were: the caller resets from the ledger."""
        self._idle_seen = True
        return self._fold_first(len(self.waiting) if most is None else min(most, len(self.waiting)))

    def _fold_first(self, n: int) -> int:
        """Fold the first ``n`` waiting rows (``WaitingRows.split``) into L."""
        if n <= 0:
            return 0
        V, signs, rest = self.waiting.split(n)
        L = self.L
        backup = L.copy(order="F") if (signs < 0).any() else None
        for sign in (1, -1):
            part = V[signs == sign]
            if part.shape[0] and not self._fold_rows(part, sign):
                if backup is not None:
                    self.L = backup
                raise FloatingPointError("folding the waiting rows into the factor lost positive definiteness")
        self.waiting.keep(rest, tri_solve(self.L, self.waiting.V[rest].T))
        self._T = None
        return n

    def _fold_rows(self, V: NDArray[np.float64], sign: int) -> bool:
        if self.kernel == "hyhound":
            return hyperbolic_rank_update(self.L, V.T, sign)
        return chol_rank_update(self.L, V.T, sign) is not None

    def _update_weights(self, U: NDArray[np.float64], dG: NDArray[np.float64] | None, Y: NDArray[np.float64] | None,
                        sign: int, inverse_times_rows: Callable[[], NDArray[np.float64]]) -> None:
        """W += sigma H~^-1 (dG - U^T U W) on the live columns only: a column whose W, dG and Y are
        all zero stays exactly zero, and an auto-created head has 100 columns of which a few hold
        data (at d = 768 the update of 100 columns cost twice that of 10: bench/results). With the
        labels, dG - U^T U W = U^T (Y - U W): dG is not read (a column of dG is nonzero only where
        Y's is)."""
        named = Y if Y is not None else dG
        assert named is not None  # prepare_update: dG or Y
        live = self._live | (named != 0).any(axis=0)
        self._live = live
        k = int(np.count_nonzero(live))
        if k == 0:
            return  # every column zero, before and after
        cols = None if k == live.shape[0] else np.flatnonzero(live)
        W = self.W if cols is None else self.W[:, cols]
        if Y is not None and U.shape[0] < k:
            step = (sign * inverse_times_rows()) @ ((Y if cols is None else Y[:, cols]) - U @ W)
        else:
            if Y is not None:
                R = U.T @ ((Y if cols is None else Y[:, cols]) - U @ W)
            else:
                R = (named if cols is None else named[:, cols]) - U.T @ (U @ W)
            R = self._inverse(R)
            step = R if sign > 0 else -R
        if cols is None:
            self.W += step
        else:
            self.W[:, cols] = W + step

    def add(self, U: NDArray[np.float64], dG: NDArray[np.float64] | None, Y: NDArray[np.float64] | None = None,
            wait: bool = False) -> None:
        """H += U^T U, G += dG (= U^T Y when the labels Y are given; then dG may be None): an update never fails.
        ``wait``: the rows may wait outside the factor (within ``hold_rows``), for a caller with
        something urgent behind them (a delete whose receipt waits for this update)."""
        U, dG, Y = prepare_update(self, U, dG, Y)
        if wait and self._may_wait(U.shape[0]):
            self._wait(U, dG, Y, +1, None)
            return
        self._fold_now()
        if not self._apply(U, dG, Y, +1, None):  # pragma: no cover - non-finite input only
            raise FloatingPointError("Cholesky update failed: non-finite rows or factor")

    def _downdate_check(self, U: NDArray[np.float64]) -> tuple[DowndateCheck, NDArray[np.float64]]:
        P = tri_solve(self.L, U.T)  # I - P^T P = I - U H^-1 U^T; P is reused by the downdate itself
        M = np.eye(U.shape[0]) - P.T @ self.waiting.correct(P)  # U H^-1 U^T = P^T (L^T H^-1 L) P
        return lemma1_check(M, U, self.gamma, self.min_pivot), P

    def check_downdate(self, U: NDArray[np.float64]) -> DowndateCheck:
        """Lemma 1: H - U^T U is PD iff I - U H^-1 U^T is (= I - P^T P, P = L^-1 U^T, when no rows
        wait)."""
        return self._downdate_check(np.atleast_2d(np.asarray(U, dtype=np.float64)))[0]

    def delete(self, U: NDArray[np.float64], dG: NDArray[np.float64] | None,
               Y: NDArray[np.float64] | None = None) -> DowndateCheck:
        """H -= U^T U, G -= dG (as in ``add``) if feasible; otherwise the state is left unchanged and the returned
        check says why (the caller must reset from the ledger)."""
        U, dG, Y = prepare_update(self, U, dG, Y)
        chk, P = self._downdate_check(U)
        if chk.feasible and chk.min_pivot >= BACKUP_BELOW_PIVOT and self._may_wait(U.shape[0]):
            self._wait(U, dG, Y, -1, P)
            return chk
        if chk.feasible and len(self.waiting):
            try:
                self._fold_now()
            except FloatingPointError:
                return DowndateCheck(False, chk.min_pivot,
                                     "infeasible: folding the waiting rows lost positive definiteness")
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
        self.waiting = WaitingRows(self.dim)
        self._live = (W_canon != 0).any(axis=0)
        self._T = None
        self.updates_since_reset = 0
        self.last_reset_drift = drift
        return drift

    def drift_estimate(self, stats: SufficientStatistics) -> float:
        """Cheap a-posteriori drift of the served W against the exact ledger (``residual_drift``)."""
        return residual_drift(stats, self.gamma, self.W)
