"""Retrain-from-scratch baselines: central ridge, central softmax, and FedAvg with K clients.

They are the gold standards the other strategies are compared with (each strategy names one as
its ``retrain_counterpart``), and they are strategies themselves so their cost per request is
measured on the same stream: every add/delete retrains on the whole retained set.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ledger import centralized_retrain

from ._softmax import CentralTrainer, FedAvgTrainer, Trainer, one_hot, trainer_from_params
from .base import Exactness, Family, RetainedSet, Strategy
from .expansion import Activation, RandomFeatureExpansion


class RidgeRetrain(Strategy):
    """Central ridge retrain with scikit-learn on the retained set after every request (the papers'
    "central ridge retrain"), optionally on a random feature expansion (ACU's buffer layer)."""

    name: ClassVar[str] = "retrain-ridge"
    family: ClassVar[Family] = "ridge"
    exactness: ClassVar[Exactness] = "retrain"
    uses_retained_data: ClassVar[bool] = True
    proba_temperature: ClassVar[float] = 0.1

    def __init__(self, gamma: float = 1.0, expansion_dim: int | None = None, activation: Activation = "relu",
                 expansion_seed: int = 0) -> None:
        super().__init__()
        if not gamma > 0:
            raise ValueError(f"gamma must be > 0, got {gamma}")
        self.gamma = float(gamma)
        self.expansion_dim, self.activation, self.expansion_seed = expansion_dim, activation, int(expansion_seed)
        self.expansion: RandomFeatureExpansion | None = None
        self._W: NDArray[np.float64] | None = None

    def transform(self, F: NDArray[np.float64]) -> NDArray[np.float64]:
        return F if self.expansion is None else self.expansion(F)

    @property
    def weights(self) -> NDArray[np.float64]:
        if self._W is None:
            raise ValueError("not fitted")
        return self._W

    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None:
        if self.expansion_dim is not None:
            self.expansion = RandomFeatureExpansion(F.shape[1], self.expansion_dim, self.activation,
                                                    self.expansion_seed)
        self.store = RetainedSet(F.shape[1])
        self.store.add(F, y, ids, clients)
        self._retrain()

    def _retrain(self) -> None:
        assert self.n_classes is not None and self.dim is not None
        width = self.dim if self.expansion is None else self.expansion.out_dim
        if len(self.store) == 0:
            self._W = np.zeros((width, self.n_classes))
            return
        self._W = centralized_retrain(self.transform(self.store.F), one_hot(self.store.y, self.n_classes), self.gamma)

    def _add(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
             clients: NDArray[np.int64]) -> None:
        self.store.add(F, y, ids, clients)
        self._retrain()

    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None:
        self.store.remove(ids)
        self._retrain()

    def retrain_counterpart(self) -> RidgeRetrain:
        return RidgeRetrain(self.gamma, self.expansion_dim, self.activation, self.expansion_seed)

    def params(self) -> Mapping[str, Any]:
        p: dict[str, Any] = {"gamma": self.gamma}
        if self.expansion_dim is not None:
            p.update(expansion_dim=self.expansion_dim, activation=self.activation, expansion_seed=self.expansion_seed)
        return p


class SoftmaxRetrain(Strategy):
    """Retrain the softmax head from scratch on the retained set after every request, with the given
    recipe: central L-BFGS (``retrain-softmax``) or FedAvg over the retained clients (``fedavg-retrain``)."""

    name: ClassVar[str] = "retrain-softmax"
    family: ClassVar[Family] = "softmax"
    exactness: ClassVar[Exactness] = "retrain"
    uses_retained_data: ClassVar[bool] = True

    def __init__(self, trainer: Trainer | None = None) -> None:
        super().__init__()
        self.trainer: Trainer = trainer if trainer is not None else CentralTrainer()
        self.federated = self.trainer.kind == "fedavg"  # type: ignore[misc]
        self._W: NDArray[np.float64] | None = None

    @property
    def weights(self) -> NDArray[np.float64]:
        if self._W is None:
            raise ValueError("not fitted")
        return self._W

    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None:
        self.store = RetainedSet(F.shape[1])
        self.store.add(F, y, ids, clients)
        self._retrain()

    def _retrain(self) -> None:
        assert self.n_classes is not None
        self._W = self.trainer.train(self.store.F, self.store.y, self.store.clients, self.n_classes)

    def _add(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
             clients: NDArray[np.int64]) -> None:
        self.store.add(F, y, ids, clients)
        self._retrain()

    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None:
        self.store.remove(ids)
        self._retrain()

    def retrain_counterpart(self) -> SoftmaxRetrain:
        return SoftmaxRetrain(trainer_from_params(self.trainer.params()))

    def params(self) -> Mapping[str, Any]:
        return dict(self.trainer.params())


class FedAvgRetrain(SoftmaxRetrain):
    """FedAvg retrain from scratch with K clients after every request (the ridge paper's and
    HF-KCU's federated baseline). Clients with no retained data are skipped."""

    name: ClassVar[str] = "fedavg-retrain"

    def __init__(self, trainer: FedAvgTrainer | None = None) -> None:
        super().__init__(trainer if trainer is not None else FedAvgTrainer())

    def retrain_counterpart(self) -> FedAvgRetrain:
        return FedAvgRetrain(trainer_from_params(self.trainer.params()))  # type: ignore[arg-type]
