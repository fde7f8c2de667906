"""The softmax (cross-entropy) linear head shared by the approximate methods and their baselines.

HF-KCU, SAFE, NegGrad, fine-tuning and FedAvg all act on the same model: logits = F W on the
frozen features (the intercept is a constant feature column, so W is (d, c) like the ridge head
and parameter gaps are comparable). Two training recipes produce it:

- ``CentralTrainer``: full-batch L-BFGS on the L2-regularized mean cross-entropy. The objective
  is strongly convex, so "retrain from scratch" has one well-defined answer (to the optimizer
  tolerance) -- which is what parameter gaps to the retrained model need.
- ``FedAvgTrainer``: FedAvg with K clients (HF-KCU section 5.1 and the ridge paper's baseline):
  rounds of local SGD epochs, aggregated weighted by local data size. Deterministic given a seed.

Everything here is plain numpy (the gradient of a linear softmax head is closed-form); torch is
used where the seeds use autograd (HF-KCU's Hessian-vector products, SAFE's KL gradient).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import scipy.optimize as sopt
from numpy.typing import NDArray

from .base import softmax


def one_hot(y: NDArray[np.int64], n_classes: int) -> NDArray[np.float64]:
    Y = np.zeros((y.shape[0], n_classes))
    Y[np.arange(y.shape[0]), y] = 1.0
    return Y


def ce_loss_grad(W: NDArray[np.float64], F: NDArray[np.float64], y: NDArray[np.int64],
                 l2: float = 0.0) -> tuple[float, NDArray[np.float64]]:
    """Mean cross-entropy + (l2/2)||W||^2 and its gradient (d, c)."""
    n = F.shape[0]
    Z = F @ W
    Z = Z - Z.max(axis=1, keepdims=True)
    logZ = np.log(np.exp(Z).sum(axis=1))
    loss = float(np.mean(logZ - Z[np.arange(n), y])) if n else 0.0
    P = np.exp(Z - logZ[:, None])
    P[np.arange(n), y] -= 1.0
    grad = F.T @ P / max(n, 1)
    if l2:
        loss += 0.5 * l2 * float(np.sum(W * W))
        grad = grad + l2 * W
    return loss, grad


def per_sample_loss(W: NDArray[np.float64], F: NDArray[np.float64], y: NDArray[np.int64]) -> NDArray[np.float64]:
    """Cross-entropy of every row (for membership-inference features)."""
    P = softmax(F @ W)
    return -np.log(np.clip(P[np.arange(F.shape[0]), y], 1e-300, None))


def sgd_epochs(W: NDArray[np.float64], F: NDArray[np.float64], y: NDArray[np.int64], *, epochs: int, lr: float,
               batch_size: int, l2: float, rng: np.random.Generator, ascent: bool = False) -> NDArray[np.float64]:
    """Minibatch SGD (or gradient *ascent* on the loss, for NegGrad) for a number of epochs."""
    W = np.array(W, dtype=np.float64)
    n = F.shape[0]
    if n == 0:
        return W
    sign = 1.0 if ascent else -1.0
    for _ in range(int(epochs)):
        order = rng.permutation(n)
        for s in range(0, n, batch_size):
            b = order[s:s + batch_size]
            _, g = ce_loss_grad(W, F[b], y[b], 0.0)
            if l2 and not ascent:  # weight decay is a descent-side regularizer
                g = g + l2 * W
            W += sign * lr * g
    return W


class Trainer(Protocol):
    """A softmax-head training recipe: same inputs -> same W (deterministic)."""

    @property
    def kind(self) -> str: ...

    def train(self, F: NDArray[np.float64], y: NDArray[np.int64], clients: NDArray[np.int64],
              n_classes: int) -> NDArray[np.float64]: ...

    def params(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class CentralTrainer:
    """Full-batch L-BFGS on mean CE + (l2/2)||W||^2, from W = 0.

    ``l2 = 1e-3``: chosen (the seeds train CNNs with weight decay 1e-4 by SGD; on a convex linear
    head a slightly larger value keeps the optimum well-conditioned, so L-BFGS converges tightly
    in a few hundred iterations and the retrain reference is sharp). ``gtol`` bounds the
    reference's own error, so parameter gaps far below ~1e-6 are not meaningful for softmax heads.
    """

    l2: float = 1e-3
    max_iter: int = 2000
    gtol: float = 1e-9
    kind: str = "central"

    def train(self, F: NDArray[np.float64], y: NDArray[np.int64], clients: NDArray[np.int64],
              n_classes: int) -> NDArray[np.float64]:
        d = F.shape[1]
        if F.shape[0] == 0:
            return np.zeros((d, n_classes))

        def fun(w: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
            loss, g = ce_loss_grad(w.reshape(d, n_classes), F, y, self.l2)
            return loss, g.ravel()

        res = sopt.minimize(fun, np.zeros(d * n_classes), jac=True, method="L-BFGS-B",
                            options={"maxiter": self.max_iter, "gtol": self.gtol, "ftol": 1e-15, "maxcor": 20})
        return res.x.reshape(d, n_classes)

    def params(self) -> Mapping[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FedAvgTrainer:
    """FedAvg from W = 0: ``n_rounds`` rounds; each samples ``clients_per_round`` clients holding
    data (all when None), runs ``local_epochs`` of minibatch SGD on each, and averages the local
    models weighted by local data size.

    Defaults follow HF-KCU section 5.1 (20 rounds, 5 local epochs, batch 64, SGD, all 10 clients)
    except ``lr``: the paper's 0.01 is for CNNs on pixels; on unit-norm frozen features the
    softmax head's curvature is <= ~1, so 0.5 (about 1/L) is used, documented in docs/strategies.md.
    """

    n_rounds: int = 20
    clients_per_round: int | None = None
    local_epochs: int = 5
    batch_size: int = 64
    lr: float = 0.5
    l2: float = 1e-3
    seed: int = 0
    kind: str = "fedavg"

    def train(self, F: NDArray[np.float64], y: NDArray[np.int64], clients: NDArray[np.int64],
              n_classes: int) -> NDArray[np.float64]:
        rng = np.random.default_rng(self.seed)
        W = np.zeros((F.shape[1], n_classes))
        present = np.unique(clients)
        if present.size == 0:
            return W
        members = {int(k): np.flatnonzero(clients == k) for k in present}
        for _ in range(int(self.n_rounds)):
            m = len(present) if self.clients_per_round is None else min(int(self.clients_per_round), len(present))
            chosen = np.sort(rng.choice(present, size=m, replace=False))
            acc = np.zeros_like(W)
            total = 0
            for k in chosen:
                idx = members[int(k)]
                Wk = sgd_epochs(W, F[idx], y[idx], epochs=self.local_epochs, lr=self.lr,
                                batch_size=self.batch_size, l2=self.l2, rng=rng)
                acc += idx.size * Wk
                total += idx.size
            W = acc / total
        return W

    def params(self) -> Mapping[str, Any]:
        return asdict(self)


def trainer_from_params(params: Mapping[str, Any]) -> Trainer:
    """Rebuild a trainer from its ``params()`` (used to clone recipes for counterparts)."""
    p = dict(params)
    kind = p.pop("kind", "central")
    if kind == "central":
        return CentralTrainer(**p)
    if kind == "fedavg":
        return FedAvgTrainer(**p)
    raise ValueError(f"unknown trainer kind {kind!r}")
