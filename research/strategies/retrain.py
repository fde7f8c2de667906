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

from unlearn.ledger import centralized_retrain

from ._softmax import CentralTrainer, FedAvgTrainer, Trainer, one_hot, trainer_from_params
from .base import ArrayHeadStrategy, Exactness, Family, RetainedSet
from .expansion import ExpandedRidgeStrategy


class _RetrainOnChange:
    """Baselines that keep the retained set and retrain from scratch on every request."""

    store: RetainedSet

    def _retrain(self) -> None:  # pragma: no cover - provided by each baseline
        raise NotImplementedError

    def _add(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
             clients: NDArray[np.int64]) -> None:
        self.store.add(F, y, ids, clients)
        self._retrain()

    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None:
        self.store.remove(ids)
        self._retrain()


class RidgeRetrain(_RetrainOnChange, ExpandedRidgeStrategy):
    """Central ridge retrain with scikit-learn on the retained set after every request (the papers'
    "central ridge retrain"), optionally on a random feature expansion (ACU's buffer layer)."""

    name: ClassVar[str] = "retrain-ridge"
    family: ClassVar[Family] = "ridge"
    exactness: ClassVar[Exactness] = "retrain"
    uses_retained_data: ClassVar[bool] = True
    proba_temperature: ClassVar[float] = 0.1

    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None:
        self._init_expansion(F.shape[1])
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

    def retrain_counterpart(self) -> RidgeRetrain:
        return RidgeRetrain(self.gamma, self.expansion_dim, self.activation, self.expansion_seed)


class SoftmaxRetrain(_RetrainOnChange, ArrayHeadStrategy):
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

    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None:
        self.store = RetainedSet(F.shape[1])
        self.store.add(F, y, ids, clients)
        self._retrain()

    def _retrain(self) -> None:
        assert self.n_classes is not None
        self._W = self.trainer.train(self.store.F, self.store.y, self.store.clients, self.n_classes)

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
