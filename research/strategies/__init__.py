"""Every seed method as a strategy on the same add/delete stream of frozen features.

One interface (``Strategy``: fit, add, delete, weights, predict, retrain_counterpart) and a
registry of names, so experiments and users can run exact and approximate unlearning side by side::

    from research.strategies import make_strategy
    s = make_strategy("exact-a", gamma=1.0).fit(F, y, n_classes=10)
    s.delete(F[:5], y[:5], ids=np.arange(5))

Strategies (docs/strategies.md has the hyperparameters and deviations from the papers):

=================  ============================================================================
exact-a / exact-b  ours: ridge over the exact integer ledger, Variant A (Cholesky) / B (SMW+resets)
float64-a/-b       the ridge paper's float64 ledger, Variant A / B
float32-a/-b       the same in float32
acu / acu-rp       ACU's Knowledge-Tracking-Matrix recursion (float64), without / with RP buffer
hf-kcu             HF-KCU: CG on autograd HVPs, causal weights, adaptive scaling (softmax, FL)
safe               SAFE: one noisy normalized step from w0 per request (softmax, no retained data)
neggrad, finetune  gradient baselines (softmax)
no-unlearning      the original softmax model, unchanged (the floor for approximate methods)
retrain-ridge      central ridge retrain (sklearn) after every request
retrain-softmax    central softmax retrain (L-BFGS) after every request
fedavg-retrain     FedAvg retrain with K clients after every request
=================  ============================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._softmax import CentralTrainer, FedAvgTrainer, Trainer
from .acu import ACU, ACURandomProjection
from .base import RetainedSet, Strategy, StrategyError, UnsupportedOperation, softmax
from .exact_ridge import ExactRidgeA, ExactRidgeB
from .expansion import RandomFeatureExpansion
from .federation import client_weights, dirichlet_partition, iid_partition
from .float_ridge import Float32RidgeA, Float32RidgeB, Float64RidgeA, Float64RidgeB, FloatRidge
from .gradient_baselines import Finetune, NegGrad, NoUnlearning
from .hf_kcu import HFKCU, conjugate_gradient, softmax_hvp
from .retrain import FedAvgRetrain, RidgeRetrain, SoftmaxRetrain
from .safe import SAFE, GaussianClassStats

STRATEGIES: dict[str, Callable[..., Strategy]] = {
    cls.name: cls
    for cls in (ExactRidgeA, ExactRidgeB, Float64RidgeA, Float64RidgeB, Float32RidgeA, Float32RidgeB, ACU,
                ACURandomProjection, HFKCU, SAFE, NegGrad, Finetune, NoUnlearning, RidgeRetrain, SoftmaxRetrain,
                FedAvgRetrain)
}


def available_strategies() -> list[str]:
    """Registered strategy names."""
    return sorted(STRATEGIES)


def make_strategy(name: str, **params: Any) -> Strategy:
    """Build a strategy by registry name with keyword hyperparameters (papers' defaults otherwise)."""
    try:
        factory = STRATEGIES[name]
    except KeyError:
        raise StrategyError(f"unknown strategy {name!r}; known: {', '.join(available_strategies())}") from None
    return factory(**params)


__all__ = [
    "Strategy", "StrategyError", "UnsupportedOperation", "RetainedSet", "softmax",
    "STRATEGIES", "available_strategies", "make_strategy",
    "ExactRidgeA", "ExactRidgeB", "FloatRidge", "Float64RidgeA", "Float64RidgeB", "Float32RidgeA", "Float32RidgeB",
    "ACU", "ACURandomProjection", "RandomFeatureExpansion", "HFKCU", "conjugate_gradient", "softmax_hvp",
    "SAFE", "GaussianClassStats", "NegGrad", "Finetune", "NoUnlearning", "RidgeRetrain", "SoftmaxRetrain",
    "FedAvgRetrain",
    "Trainer", "CentralTrainer", "FedAvgTrainer", "dirichlet_partition", "iid_partition", "client_weights",
]
