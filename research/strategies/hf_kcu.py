"""HF-KCU: Hessian-Free Krylov Causal Unlearning (Mahdavi et al. 2026), on a softmax linear head.

Algorithm 1 of the paper, per deletion request D_u in a federation of K clients:

1. every client i holding part of D_u computes g_i, the gradient of its loss on D_u (line 4);
2. it solves (H_i + lambda I) v = g_i by k conjugate-gradient iterations, using only
   Hessian-vector products from torch autograd (eq. 5, lines 5-14), H_i the Hessian of its
   local loss on D_i (``hessian="local"``, Algorithm 1) or of the global loss (eq. 3,
   ``hessian="global"``);
3. causal weight alpha_i = ||g_i|| / sum_j ||g_j|| over affected clients, 0 for the others (eq. 7);
4. adaptive scaling scale_i = min(1, beta ||theta|| / ||dtheta_i^raw||) (line 17, eq. 21);
5. the server aggregates dtheta = sum_i w_i alpha_i scale_i dtheta_i^raw, w_i = |D_i| / sum |D_j|.

Defaults are the paper's: k = 10, lambda = 0.01, beta = 0.01, clients weighted by data size.

Sign (documented deviation): the paper writes dtheta^raw = -H^-1 g (eq. 3, line 15), which is the
influence of *up-weighting* D_u (Koh & Liang); removing D_u moves the optimum by +H^-1 g/n.
Applied literally, the published sign moves the model toward the deleted data. The default
``sign="removal"`` uses +v; ``sign="published"`` reproduces the paper's formula.

Losses: g_i is the gradient of client i's mean-loss contribution of its deleted samples,
(1/|D_i|) sum_{j in D_u cap D_i} grad CE_j, so that sum_i w_i g_i = (1/n) sum_{j in D_u} grad CE_j
(the removal influence of the global mean loss). The Hessian includes the training recipe's L2
term (it is part of the objective) plus the damping lambda.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from numpy.typing import NDArray

from ._softmax import FedAvgTrainer, Trainer, ce_loss_grad, trainer_from_params
from .base import ArrayHeadStrategy, Exactness, Family, RetainedSet, StrategyError
from .retrain import SoftmaxRetrain


@dataclass(frozen=True)
class CGResult:
    """Conjugate-gradient outcome: the solution and the residual norm after every iteration."""

    x: NDArray[np.float64]
    residuals: tuple[float, ...]


def conjugate_gradient(matvec: Callable[[NDArray[np.float64]], NDArray[np.float64]], b: NDArray[np.float64],
                       iters: int, tol: float = 0.0) -> CGResult:
    """Algorithm 1 lines 6-14: CG from v0 = 0 for ``iters`` iterations (stops early on an exact
    zero residual or ||r|| <= tol*||b||). Only matrix-vector products are used."""
    x = np.zeros_like(b)
    r = b.copy()
    p = r.copy()
    rs = float(r @ r)
    b_norm = float(np.sqrt(rs))
    res = [b_norm]
    for _ in range(int(iters)):
        if rs == 0.0 or np.sqrt(rs) <= tol * b_norm:
            break
        q = matvec(p)
        pq = float(p @ q)
        if pq <= 0.0:  # not positive definite along p: stop rather than diverge
            break
        a = rs / pq
        x = x + a * p
        r = r - a * q
        rs_new = float(r @ r)
        res.append(float(np.sqrt(rs_new)))
        p = r + (rs_new / rs) * p
        rs = rs_new
    return CGResult(x, tuple(res))


def softmax_hvp(F: NDArray[np.float64], y: NDArray[np.int64], W: NDArray[np.float64], l2: float,
                damping: float) -> Callable[[NDArray[np.float64]], NDArray[np.float64]]:
    """v -> (Hessian of mean CE(F W, y) + (l2/2)||W||^2 at W) v + damping v, by double backward
    through torch autograd (Pearlmutter; the paper's eq. 5). Vectors are flattened W's (d*c,)."""
    d, c = W.shape
    Ft = torch.from_numpy(np.ascontiguousarray(F, dtype=np.float64))
    yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
    Wt = torch.tensor(W, dtype=torch.float64, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(Ft @ Wt, yt) + 0.5 * l2 * (Wt * Wt).sum()
    (grad,) = torch.autograd.grad(loss, Wt, create_graph=True)

    def hvp(v: NDArray[np.float64]) -> NDArray[np.float64]:
        vt = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64).reshape(d, c))
        (hv,) = torch.autograd.grad(grad, Wt, grad_outputs=vt, retain_graph=True)
        return hv.detach().numpy().ravel() + damping * np.asarray(v, dtype=np.float64)

    return hvp


class HFKCU(ArrayHeadStrategy):
    """Influence-based federated unlearning with CG on Hessian-vector products (delete-only)."""

    name: ClassVar[str] = "hf-kcu"
    family: ClassVar[Family] = "softmax"
    exactness: ClassVar[Exactness] = "approximate"
    supports_add: ClassVar[bool] = False
    uses_retained_data: ClassVar[bool] = True  # each client's HVPs run on its local data
    federated: ClassVar[bool] = True

    def __init__(self, trainer: Trainer | None = None, cg_iters: int = 10, damping: float = 0.01, beta: float = 0.01,
                 causal_weighting: bool = True, adaptive_scaling: bool = True,
                 sign: Literal["removal", "published"] = "removal",
                 hessian: Literal["local", "global"] = "local") -> None:
        super().__init__()
        if cg_iters < 1 or damping < 0 or beta <= 0:
            raise ValueError("need cg_iters >= 1, damping >= 0, beta > 0")
        if sign not in ("removal", "published") or hessian not in ("local", "global"):
            raise ValueError(f"bad sign {sign!r} or hessian {hessian!r}")
        self.trainer: Trainer = trainer if trainer is not None else FedAvgTrainer()
        self.cg_iters, self.damping, self.beta = int(cg_iters), float(damping), float(beta)
        self.causal_weighting, self.adaptive_scaling = bool(causal_weighting), bool(adaptive_scaling)
        self.sign, self.hessian = sign, hessian
        self.last_report: dict[str, Any] = {}

    @property
    def l2(self) -> float:
        return float(self.trainer.params().get("l2", 0.0))

    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None:
        assert self.n_classes is not None
        self.store = RetainedSet(F.shape[1])
        self.store.add(F, y, ids, clients)
        self._W = (np.array(init_weights, dtype=np.float64) if init_weights is not None
                   else self.trainer.train(F, y, clients, self.n_classes))

    def influence_updates(self, F_u: NDArray[np.float64], y_u: NDArray[np.int64], c_u: NDArray[np.int64]
                          ) -> tuple[NDArray[np.float64], dict[str, Any]]:
        """The aggregated update dtheta for deleting (F_u, y_u) held by clients c_u, from the current
        model and retained store (which still contains D_u). Pure: changes nothing."""
        assert self._W is not None
        W = self._W
        theta_norm = float(np.linalg.norm(W))
        Fa, ya, ca = self.store.F, self.store.y, self.store.clients
        sizes = {int(k): int(np.sum(ca == k)) for k in np.unique(ca)}
        n_total = sum(sizes.values())
        global_hvp = softmax_hvp(Fa, ya, W, self.l2, self.damping) if self.hessian == "global" else None
        raw: dict[int, NDArray[np.float64]] = {}
        gnorm: dict[int, float] = {}
        residuals: dict[int, tuple[float, ...]] = {}
        for k in np.unique(c_u):
            k = int(k)
            m = c_u == k
            # g_i: client i's mean-loss contribution of its deleted samples (line 4).
            _, g_sum = ce_loss_grad(W, F_u[m], y_u[m], 0.0)
            g = (g_sum * m.sum() / sizes[k]).ravel()
            local = ca == k
            hvp = global_hvp if global_hvp is not None else softmax_hvp(Fa[local], ya[local], W, self.l2, self.damping)
            cg = conjugate_gradient(hvp, g, self.cg_iters)
            raw[k] = cg.x if self.sign == "removal" else -cg.x  # line 15 (sign: see module doc)
            gnorm[k] = float(np.linalg.norm(g))
            residuals[k] = cg.residuals
        total_g = sum(gnorm.values())
        delta = np.zeros(W.size)
        alphas: dict[int, float] = {}
        scales: dict[int, float] = {}
        for k, d_raw in raw.items():
            alpha = (gnorm[k] / total_g if total_g > 0 else 1.0 / len(raw)) if self.causal_weighting else 1.0
            norm = float(np.linalg.norm(d_raw))
            scale = min(1.0, self.beta * theta_norm / norm) if (self.adaptive_scaling and norm > 0) else 1.0
            alphas[k], scales[k] = alpha, scale
            delta += (sizes[k] / n_total) * alpha * scale * d_raw  # server aggregation, w_i = |D_i|/n
        report = {"alpha": alphas, "scale": scales, "cg_residuals": residuals}
        return delta.reshape(W.shape), report

    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None:
        # The stored client of each id is authoritative (the request's own client field may be absent).
        all_ids, all_clients = self.store.ids, self.store.clients
        pos = {int(i): j for j, i in enumerate(all_ids)}
        missing = [int(i) for i in ids if int(i) not in pos]
        if missing:
            raise StrategyError(f"delete of ids that are not retained: {missing[:5]}")
        c_u = all_clients[[pos[int(i)] for i in ids]]
        delta, self.last_report = self.influence_updates(F, y, c_u)
        self.store.remove(ids)
        assert self._W is not None
        self._W = self._W + delta

    def retrain_counterpart(self) -> SoftmaxRetrain:
        return SoftmaxRetrain(trainer_from_params(self.trainer.params()))

    def params(self) -> Mapping[str, Any]:
        return {"cg_iters": self.cg_iters, "damping": self.damping, "beta": self.beta,
                "causal_weighting": self.causal_weighting, "adaptive_scaling": self.adaptive_scaling,
                "sign": self.sign, "hessian": self.hessian, "trainer": dict(self.trainer.params())}
