"""Independent references: a centralized retrain from scratch and the paper's deviation metric."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .tracker_checks import relative_deviation


def one_hot(y: ArrayLike, n_outputs: int) -> NDArray[np.float64]:
    """Class indices -> one-hot float64 targets (n, n_outputs)."""
    idx = np.asarray(y, dtype=np.int64)
    Y = np.zeros((idx.shape[0], n_outputs))
    Y[np.arange(idx.shape[0]), idx] = 1.0
    return Y


def centralized_retrain(F: ArrayLike, Y: ArrayLike, gamma: float) -> NDArray[np.float64]:
    """Ridge from scratch with scikit-learn (an implementation independent of this package):
    Ridge(alpha=gamma, fit_intercept=False) on the given float features and targets; W is (d, c)."""
    from sklearn.linear_model import Ridge  # lazy: heavy import, only references need it

    X = np.asarray(F, dtype=np.float64)
    T = np.asarray(Y, dtype=np.float64)
    model = Ridge(alpha=float(gamma), fit_intercept=False, solver="cholesky")
    model.fit(X, T if T.ndim == 2 else T[:, None])
    return np.atleast_2d(model.coef_).T.copy()


def retrain_deviation(W: ArrayLike, F: ArrayLike, Y: ArrayLike, gamma: float) -> float:
    """The paper's metric: ||W - W_retrain||_F / ||W_retrain||_F against a fresh centralized retrain."""
    return relative_deviation(np.asarray(W, dtype=np.float64), centralized_retrain(F, Y, gamma))
