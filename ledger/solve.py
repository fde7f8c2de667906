"""Variant A: the canonical head from the ledger by Cholesky, deterministic for a given ledger.

H = S + gamma*I is formed by a fixed sequence of float64 operations and factored once; W comes
from two triangular solves (no explicit inverse). Same ledger, same machine/BLAS -> same bits.

The factorization and solves run with ONE BLAS thread: a multithreaded blocked Cholesky may sum
in a different order for a different thread count, and the verifier, serving and the tests
compare heads computed in different processes bit for bit.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import scipy.linalg as sla
from numpy.typing import NDArray
from scipy.linalg.lapack import dpotri

from .errors import LedgerError
from .exact_ledger import SufficientStatistics, _mirror_upper

_controller = None


def single_threaded_blas() -> AbstractContextManager[Any]:
    """Context manager limiting BLAS to one thread (deterministic summation order)."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


def _check_gamma(gamma: float) -> float:
    g = float(gamma)
    if not (np.isfinite(g) and g > 0):
        raise ValueError(f"gamma must be a finite positive number, got {gamma!r}")
    return g


def regularized_gram(stats: SufficientStatistics, gamma: float) -> NDArray[np.float64]:
    """H = S + gamma*I in float64."""
    H = stats.gram()
    H[np.diag_indices_from(H)] += _check_gamma(gamma)
    return H


def cholesky_factor(stats: SufficientStatistics, gamma: float) -> NDArray[np.float64]:
    """Lower Cholesky factor L of H = S + gamma*I (H = L L^T)."""
    H = regularized_gram(stats, gamma)
    try:
        with single_threaded_blas():
            return sla.cholesky(H, lower=True, check_finite=False)
    except np.linalg.LinAlgError as exc:
        raise LedgerError(f"S + gamma*I is not positive definite ({exc}); the ledger is inconsistent") from exc


def solve_with_factor(L: NDArray[np.float64], G: NDArray[np.float64]) -> NDArray[np.float64]:
    """W = H^-1 G from the Cholesky factor of H, by two triangular solves."""
    if G.shape[1] == 0:
        return np.zeros((L.shape[0], 0))
    with single_threaded_blas():
        Z = sla.solve_triangular(L, G, lower=True, check_finite=False)
        return sla.solve_triangular(L.T, Z, lower=False, check_finite=False)


def solve_head(stats: SufficientStatistics, gamma: float) -> NDArray[np.float64]:
    """The ridge head W = (S + gamma*I)^-1 G, shape (d, c), float64 (Variant A)."""
    L = cholesky_factor(stats, gamma)
    return solve_with_factor(L, stats.moments())


def inverse_from_factor(L: NDArray[np.float64]) -> NDArray[np.float64]:
    """H^-1 from the lower Cholesky factor L of H, exactly symmetric, C-ordered.

    LAPACK ``dpotri`` (inverts L, then forms L^-T L^-1 on one triangle): about d^3 flops against
    about 2 d^3 for ``cho_solve`` with an identity right-hand side, at the same accuracy (tests
    compare the two). It fills the lower triangle; the strict upper one is mirrored from it.
    One BLAS thread, so the published posterior T is the same bits in every process.
    """
    with single_threaded_blas():
        T, info = dpotri(L, lower=1)
    if info != 0:
        raise LedgerError(f"dpotri failed (info={info}): singular Cholesky factor")
    return _mirror_upper(np.ascontiguousarray(T.T))  # LAPACK's lower triangle is C's upper one


def posterior_inverse(stats: SufficientStatistics, gamma: float) -> NDArray[np.float64]:
    """T = (S + gamma*I)^-1: the SMW tracker's state and the posterior covariance up to sigma^2."""
    return inverse_from_factor(cholesky_factor(stats, gamma))


def posterior_inverse_cho_solve(stats: SufficientStatistics, gamma: float) -> NDArray[np.float64]:
    """T as exact heads published before ``inverse_from_factor`` (dpotri) computed it: ``cho_solve``
    with an identity right-hand side, symmetrized. Why kept: a head that has not been reset since
    an upgrade still carries that T, and the verifier must accept it bit for bit."""
    L = cholesky_factor(stats, gamma)
    with single_threaded_blas():
        T = sla.cho_solve((L, True), np.eye(L.shape[0]), check_finite=False)
    return (T + T.T) * 0.5
