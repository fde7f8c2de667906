"""Gradient baselines from the seeds: NegGrad (gradient ascent on the forget set) and fine-tuning
on the retained set, both on the softmax head and applied continually (each request starts from
the current model).

Settings (ACU appendix E.3): NegGrad runs 5 epochs on the forgetting set, fine-tuning 10 epochs on
the retained set, per request. The learning rates in ACU's text did not survive extraction, and
theirs were for CNNs; we use SGD with batch 64 and lr 0.5 (about 1/L for a softmax head on
unit-norm features), documented in docs/strategies.md. NegGrad is the one baseline that needs
no retained data (ACU's "privacy" column); fine-tuning needs all of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ._softmax import CentralTrainer, Trainer, sgd_epochs, trainer_from_params
from .base import ArrayHeadStrategy, Exactness, Family, RetainedSet
from .retrain import SoftmaxRetrain


class _SoftmaxUnlearner(ArrayHeadStrategy):
    family: ClassVar[Family] = "softmax"
    exactness: ClassVar[Exactness] = "approximate"
    supports_add: ClassVar[bool] = False

    def __init__(self, trainer: Trainer | None = None, epochs: int = 5, lr: float = 0.5, batch_size: int = 64,
                 seed: int = 0) -> None:
        super().__init__()
        if epochs < 0 or lr <= 0 or batch_size < 1:
            raise ValueError("need epochs >= 0, lr > 0, batch_size >= 1")
        self.trainer: Trainer = trainer if trainer is not None else CentralTrainer()
        self.epochs, self.lr, self.batch_size, self.seed = int(epochs), float(lr), int(batch_size), int(seed)

    @property
    def l2(self) -> float:
        return float(self.trainer.params().get("l2", 0.0))

    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None:
        assert self.n_classes is not None
        self.rng = np.random.default_rng(self.seed)
        self._W = (np.array(init_weights, dtype=np.float64) if init_weights is not None
                   else self.trainer.train(F, y, clients, self.n_classes))

    def retrain_counterpart(self) -> SoftmaxRetrain:
        return SoftmaxRetrain(trainer_from_params(self.trainer.params()))

    def params(self) -> Mapping[str, Any]:
        return {"epochs": self.epochs, "lr": self.lr, "batch_size": self.batch_size, "seed": self.seed,
                "trainer": dict(self.trainer.params())}


class NegGrad(_SoftmaxUnlearner):
    """Gradient ascent on the forgetting set (5 epochs per request); no retained data."""

    name: ClassVar[str] = "neggrad"
    uses_retained_data: ClassVar[bool] = False

    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None:
        self._W = sgd_epochs(self.weights, F, y, epochs=self.epochs, lr=self.lr, batch_size=self.batch_size,
                             l2=0.0, rng=self.rng, ascent=True)


class Finetune(_SoftmaxUnlearner):
    """Fine-tune on the retained set (10 epochs per request), relying on catastrophic forgetting."""

    name: ClassVar[str] = "finetune"
    uses_retained_data: ClassVar[bool] = True

    def __init__(self, trainer: Trainer | None = None, epochs: int = 10, lr: float = 0.5, batch_size: int = 64,
                 seed: int = 0) -> None:
        super().__init__(trainer, epochs, lr, batch_size, seed)

    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None:
        super()._fit(F, y, ids, clients, init_weights)
        self.store = RetainedSet(F.shape[1])
        self.store.add(F, y, ids, clients)

    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None:
        self.store.remove(ids)
        self._W = sgd_epochs(self.weights, self.store.F, self.store.y, epochs=self.epochs, lr=self.lr,
                             batch_size=self.batch_size, l2=self.l2, rng=self.rng)


class NoUnlearning(_SoftmaxUnlearner):
    """The original softmax model, never changed: the floor every approximate method must beat
    (a gap to the retrain larger than this one means the "unlearning" moved away from retraining)."""

    name: ClassVar[str] = "no-unlearning"
    uses_retained_data: ClassVar[bool] = False

    def __init__(self, trainer: Trainer | None = None) -> None:
        super().__init__(trainer, epochs=0)

    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None:
        return None

    def params(self) -> Mapping[str, Any]:
        return {"trainer": dict(self.trainer.params())}
