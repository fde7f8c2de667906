"""The Bayesian reading of the ridge head (paper section 6.6).

Under y | f, W ~ N(W^T f, sigma^2 I) and vec(W) ~ N(0, tau^2 I) with gamma = sigma^2 / tau^2,
the posterior is MatrixNormal(W, sigma^2 T, I_c) with T = (S + gamma I)^-1. Because the ledger
is exact, so is this posterior: KL to the retrained posterior is exactly zero.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla
from numpy.typing import ArrayLike, NDArray


def posterior_covariance(T: NDArray[np.float64], sigma2: float = 1.0) -> NDArray[np.float64]:
    """Row covariance of the matrix-normal posterior: sigma^2 T."""
    if sigma2 <= 0:
        raise ValueError("sigma2 must be > 0")
    return sigma2 * np.asarray(T, dtype=np.float64)


def predictive_variance(F: ArrayLike, T: NDArray[np.float64], sigma2: float = 1.0,
                        include_noise: bool = False) -> NDArray[np.float64]:
    """Per-sample variance of each output's predictive mean, sigma^2 f^T T f (plus sigma^2 noise
    when ``include_noise``): how much the head is unsure about this input."""
    X = np.atleast_2d(np.asarray(F, dtype=np.float64))
    v = sigma2 * np.einsum("ij,jk,ik->i", X, T, X)
    return v + sigma2 if include_noise else v


def predictive_variance_cholesky(F: ArrayLike, L: NDArray[np.float64], sigma2: float = 1.0) -> NDArray[np.float64]:
    """Same as ``predictive_variance`` from the Cholesky factor L of H (T = L^-T L^-1): stabler."""
    X = np.atleast_2d(np.asarray(F, dtype=np.float64))
    Z = sla.solve_triangular(L, X.T, lower=True, check_finite=False)
    return sigma2 * np.einsum("ij,ij->j", Z, Z)


def kl_matrix_normal(M1: NDArray[np.float64], T1: NDArray[np.float64], M2: NDArray[np.float64],
                     T2: NDArray[np.float64], sigma2: float = 1.0) -> float:
    """KL( MN(M1, sigma^2 T1, I) || MN(M2, sigma^2 T2, I) ): the unlearning certificate's metric."""
    d, c = M1.shape
    L2 = sla.cholesky(T2, lower=True)
    L1 = sla.cholesky(T1, lower=True)
    A = sla.solve_triangular(L2, L1, lower=True)
    tr = float(np.sum(A * A))
    D = sla.solve_triangular(L2, M2 - M1, lower=True)
    maha = float(np.sum(D * D)) / sigma2
    logdet = 2.0 * (np.sum(np.log(np.diagonal(L2))) - np.sum(np.log(np.diagonal(L1))))
    return 0.5 * (c * tr + maha - c * d + c * logdet)
