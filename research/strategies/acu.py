"""ACU: Analytic Continual Unlearning (Tang et al. 2025), in float64 as published.

The model is a ridge ("analytic") classifier W = R X^T Y with the Knowledge Tracking Matrix
R = (X^T X + gamma I)^-1 over the retained set. An unlearning request with forgetting features
X_u and one-hot labels Y_u updates (ACU eq. 5-6):

    R  <- R + R X_u^T (I - X_u R X_u^T)^-1 X_u R
    W  <- (I + R X_u^T X_u) W - R X_u^T Y_u            (R already updated)

which equals a fresh solve on the retained set in exact arithmetic (ACU Theorem 1). Learning
requests use the analytic-learning recursion of ACU Appendix C (ACIL):

    R  <- R - R X^T (I + X R X^T)^-1 X R,       W <- W + R X^T (Y - X W).

The optional buffer layer (RanPAC / ACIL) expands features by a fixed random projection and a
ReLU before the analytic classifier. Everything is float64 with no feasibility check and no
resets: that is the published method, and the contrast with our Variant B (same recursion, with
Lemma-1 checks, resets and an exact ledger) is the point of running both.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from ._softmax import one_hot
from .base import Exactness, Family
from .expansion import Activation, ExpandedRidgeStrategy
from .retrain import RidgeRetrain


class ACU(ExpandedRidgeStrategy):
    """Knowledge-Tracking-Matrix recursion, float64, optional random-projection buffer layer."""

    name: ClassVar[str] = "acu"
    family: ClassVar[Family] = "ridge"
    exactness: ClassVar[Exactness] = "exact arithmetic"
    proba_temperature: ClassVar[float] = 0.1

    def __init__(self, gamma: float = 1.0, expansion_dim: int | None = None, activation: Activation = "relu",
                 expansion_seed: int = 0) -> None:
        super().__init__(gamma, expansion_dim, activation, expansion_seed)
        self.R: NDArray[np.float64] | None = None

    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None:
        """CL phase, closed form (ACU eq. 3-4): R = (X^T X + gamma I)^-1, W = R X^T Y."""
        assert self.n_classes is not None
        self._init_expansion(F.shape[1])
        X = self.transform(F)
        A = X.T @ X
        A[np.diag_indices_from(A)] += self.gamma
        R = np.asarray(np.linalg.inv(A), dtype=np.float64)
        self.R = R
        self._W = R @ (X.T @ one_hot(y, self.n_classes))

    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None:
        """ACU eq. 5-6 (one request = one batch)."""
        assert self.R is not None and self._W is not None and self.n_classes is not None
        Xu = self.transform(F)
        RXt = self.R @ Xu.T                                        # (d, r)
        M = np.eye(Xu.shape[0]) - Xu @ RXt                         # I - X_u R X_u^T
        self.R = self.R + RXt @ np.linalg.solve(M, RXt.T)          # eq. 5
        RXt = self.R @ Xu.T
        self._W = self._W + RXt @ (Xu @ self._W) - RXt @ one_hot(y, self.n_classes)  # eq. 6

    def _add(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
             clients: NDArray[np.int64]) -> None:
        """ACU Appendix C (the CL-phase recursion), so the stream can also learn."""
        assert self.R is not None and self._W is not None and self.n_classes is not None
        X = self.transform(F)
        RXt = self.R @ X.T
        M = np.eye(X.shape[0]) + X @ RXt
        self.R = self.R - RXt @ np.linalg.solve(M, RXt.T)
        self._W = self._W + (self.R @ X.T) @ (one_hot(y, self.n_classes) - X @ self._W)

    def retrain_counterpart(self) -> RidgeRetrain:
        return RidgeRetrain(self.gamma, self.expansion_dim, self.activation, self.expansion_seed)


class ACURandomProjection(ACU):
    """ACU with its optional nonlinear buffer layer (default width 2048, ReLU, seed 0)."""

    name: ClassVar[str] = "acu-rp"

    def __init__(self, gamma: float = 1.0, expansion_dim: int = 2048, activation: Activation = "relu",
                 expansion_seed: int = 0) -> None:
        super().__init__(gamma, expansion_dim, activation, expansion_seed)
