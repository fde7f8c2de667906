"""Random nonlinear feature expansion: the "buffer layer" of RanPAC / ACIL-style analytic learning.

ACU (section 3.1) notes that the feature map may include "random projections or kernel
functions to enhance the representational capacity of features": a fixed random matrix followed
by a nonlinearity, h = act(f Wr). It is frozen (seeded), so it is part of phi: the retrain
reference must use the same map, and a ridge head on h is still an exact ridge problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from .base import ArrayHeadStrategy

Activation = Literal["relu", "identity"]


class RandomFeatureExpansion:
    """h = act(F @ Wr), Wr ~ N(0, 1)^(in_dim x out_dim) drawn from ``seed`` (RanPAC's choice)."""

    def __init__(self, in_dim: int, out_dim: int, activation: Activation = "relu", seed: int = 0) -> None:
        if in_dim < 1 or out_dim < 1:
            raise ValueError(f"dimensions must be >= 1, got {in_dim} -> {out_dim}")
        if activation not in ("relu", "identity"):
            raise ValueError(f"activation must be 'relu' or 'identity', got {activation!r}")
        self.in_dim, self.out_dim, self.activation, self.seed = int(in_dim), int(out_dim), activation, int(seed)
        self.Wr = np.random.default_rng(self.seed).standard_normal((self.in_dim, self.out_dim))

    def __call__(self, F: NDArray[np.float64]) -> NDArray[np.float64]:
        if F.shape[1] != self.in_dim:
            raise ValueError(f"expansion expects {self.in_dim} input features, got {F.shape[1]}")
        H = F @ self.Wr
        return np.maximum(H, 0.0) if self.activation == "relu" else H

    def params(self) -> Mapping[str, Any]:
        return {"expansion_dim": self.out_dim, "activation": self.activation, "expansion_seed": self.seed}


class ExpandedRidgeStrategy(ArrayHeadStrategy):
    """A ridge head (regularizer ``gamma``) on the features, or on their random expansion of width
    ``expansion_dim`` (ACU's buffer layer), drawn at fit by ``_init_expansion``."""

    def __init__(self, gamma: float = 1.0, expansion_dim: int | None = None, activation: Activation = "relu",
                 expansion_seed: int = 0) -> None:
        super().__init__()
        if not gamma > 0:
            raise ValueError(f"gamma must be > 0, got {gamma}")
        self.gamma = float(gamma)
        self.expansion_dim, self.activation, self.expansion_seed = expansion_dim, activation, int(expansion_seed)
        self.expansion: RandomFeatureExpansion | None = None

    def _init_expansion(self, in_dim: int) -> None:
        """Draw the expansion for ``in_dim`` input features (nothing to do without ``expansion_dim``)."""
        if self.expansion_dim is not None:
            self.expansion = RandomFeatureExpansion(in_dim, self.expansion_dim, self.activation,
                                                    self.expansion_seed)

    def transform(self, F: NDArray[np.float64]) -> NDArray[np.float64]:
        return F if self.expansion is None else self.expansion(F)

    def params(self) -> Mapping[str, Any]:
        p: dict[str, Any] = {"gamma": self.gamma}
        if self.expansion_dim is not None:
            p.update(expansion_dim=self.expansion_dim, activation=self.activation, expansion_seed=self.expansion_seed)
        return p
