"""Unlearning metrics shared by every experiment (pure functions on arrays; no I/O, no clocks).

What the seeds measure, in one place:

- accuracy on the retained / forgotten / test sets (RA, FA, TA; SAFE and ACU) and the absolute
  gap of each to the retrained model (ACU's Delta-RA/FA/TA);
- a membership-inference attack (SAFE appendix B.2, ACU E.2): a classifier trained to tell the
  model's outputs on *retained* samples (members) from its outputs on *test* samples
  (non-members), then applied to the forgotten samples; the score is the fraction of forgotten
  samples it calls members, reported with its gap to the same attack on the retrained model;
- the parameter gap ||W - W_retrain||_F / ||W_retrain||_F (ACU, HF-KCU, the ridge paper's deviation);
- the output KL E_x KL(p_retrain(.|x) || p_model(.|x)) (HF-KCU eq. 36 / appendix C);
- HF-KCU's causal faithfulness CF and the speedup over retraining.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

MiaMethod = Literal["svc", "threshold"]


def accuracy(pred: ArrayLike, y: ArrayLike) -> float:
    """Fraction of correct predictions; NaN for an empty set (e.g. nothing forgotten yet)."""
    p, t = np.asarray(pred), np.asarray(y)
    if p.shape != t.shape:
        raise ValueError(f"prediction shape {p.shape} != label shape {t.shape}")
    return float(np.mean(p == t)) if t.size else float("nan")


def parameter_gap(W: ArrayLike, W_ref: ArrayLike) -> float:
    """||W - W_ref||_F / ||W_ref||_F (the absolute norm when W_ref = 0)."""
    A, B = np.asarray(W, dtype=np.float64), np.asarray(W_ref, dtype=np.float64)
    if A.shape != B.shape:
        raise ValueError(f"parameter shapes differ: {A.shape} vs {B.shape}")
    den = float(np.linalg.norm(B))
    num = float(np.linalg.norm(A - B))
    return num / den if den > 0 else num


def output_kl(P_ref: ArrayLike, P: ArrayLike, eps: float = 1e-12) -> float:
    """Mean over rows of KL(P_ref || P) in nats; probabilities are floored at ``eps`` so a zero in
    P cannot make one row infinite, and each row's value is clamped at 0 (rounding of two equal
    distributions gives ~-1e-19, not a negative divergence). NaN for no rows."""
    R, Q = np.asarray(P_ref, dtype=np.float64), np.asarray(P, dtype=np.float64)
    if R.shape != Q.shape:
        raise ValueError(f"distribution shapes differ: {R.shape} vs {Q.shape}")
    if R.shape[0] == 0:
        return float("nan")
    R = np.clip(R, eps, None)
    Q = np.clip(Q, eps, None)
    R = R / R.sum(axis=1, keepdims=True)
    Q = Q / Q.sum(axis=1, keepdims=True)
    rows = np.sum(R * (np.log(R) - np.log(Q)), axis=1)
    return float(np.mean(np.maximum(rows, 0.0)))  # KL >= 0; clamp float rounding (~-1e-19) of equal rows


def mia_features(P: ArrayLike, y: ArrayLike) -> NDArray[np.float64]:
    """Per-sample attack features from a model's output distribution: the probability of the
    true class (confidence; -log of it is the per-sample loss) and the prediction entropy."""
    Pm = np.asarray(P, dtype=np.float64)
    lab = np.asarray(y, dtype=np.int64)
    conf = Pm[np.arange(lab.shape[0]), lab]
    ent = -np.sum(Pm * np.log(np.clip(Pm, 1e-300, None)), axis=1)
    return np.column_stack([conf, ent])


class MembershipAttack:
    """Binary member/non-member classifier on ``mia_features``.

    ``svc``: an RBF-kernel SVC on standardized features (SAFE's protocol); ``threshold``: the
    confidence threshold with the best balanced accuracy on the training data (the simplest
    loss-threshold attack). Training sets are balanced by subsampling to the smaller side (at
    most ``max_per_class``), deterministically from ``seed``.
    """

    def __init__(self, method: MiaMethod = "svc", max_per_class: int = 10_000, seed: int = 0) -> None:
        if method not in ("svc", "threshold"):
            raise ValueError(f"method must be 'svc' or 'threshold', got {method!r}")
        self.method, self.max_per_class, self.seed = method, int(max_per_class), int(seed)

    def fit(self, members: NDArray[np.float64], nonmembers: NDArray[np.float64]) -> MembershipAttack:
        if members.shape[0] == 0 or nonmembers.shape[0] == 0:
            raise ValueError("the attack needs both member and non-member samples")
        rng = np.random.default_rng(self.seed)
        m = min(members.shape[0], nonmembers.shape[0], self.max_per_class)
        A = members[rng.choice(members.shape[0], m, replace=False)]
        B = nonmembers[rng.choice(nonmembers.shape[0], m, replace=False)]
        X = np.vstack([A, B])
        t = np.concatenate([np.ones(m, bool), np.zeros(m, bool)])
        if self.method == "svc":
            from sklearn.pipeline import make_pipeline
            from sklearn.preprocessing import StandardScaler
            from sklearn.svm import SVC

            self.model = make_pipeline(StandardScaler(), SVC(kernel="rbf", C=1.0, gamma="scale"))
            self.model.fit(X, t)
        else:
            conf = X[:, 0]
            cands = np.unique(conf)
            best, best_thr = -1.0, float(cands[0])
            for thr in cands:
                pred = conf >= thr
                bal = 0.5 * (np.mean(pred[t]) + np.mean(~pred[~t]))
                if bal > best:
                    best, best_thr = bal, float(thr)
            self.threshold = best_thr
        return self

    def predict(self, feats: NDArray[np.float64]) -> NDArray[np.bool_]:
        """True = predicted member."""
        if feats.shape[0] == 0:
            return np.zeros(0, bool)
        if self.method == "svc":
            return np.asarray(self.model.predict(feats), dtype=bool)
        return feats[:, 0] >= self.threshold


def mia_score(P_retain: ArrayLike, y_retain: ArrayLike, P_test: ArrayLike, y_test: ArrayLike,
              P_forget: ArrayLike, y_forget: ArrayLike, method: MiaMethod = "svc", max_per_class: int = 10_000,
              seed: int = 0) -> float:
    """Fraction of forgotten samples the attack (trained on retained vs test) calls members.

    A model that truly forgot them scores like the retrained model does; so compare via the gap.
    NaN when nothing is forgotten.
    """
    F_forget = mia_features(P_forget, y_forget)
    if F_forget.shape[0] == 0:
        return float("nan")
    attack = MembershipAttack(method, max_per_class, seed).fit(mia_features(P_retain, y_retain),
                                                               mia_features(P_test, y_test))
    return float(np.mean(attack.predict(F_forget)))


def causal_faithfulness(acc_unlearned: float, acc_retrain: float, acc_trained: float) -> float:
    """HF-KCU's CF = 1 - |Acc_u - Acc_r| / |Acc_t - Acc_r|; NaN when Acc_t == Acc_r (undefined,
    the paper's own edge case 1)."""
    den = abs(acc_trained - acc_retrain)
    return float("nan") if den == 0 else 1.0 - abs(acc_unlearned - acc_retrain) / den


def speedup(retrain_seconds: float, unlearn_seconds: float) -> float:
    """Retraining time over unlearning time (inf when unlearning took no measurable time)."""
    if unlearn_seconds <= 0:
        return float("inf")
    return float(retrain_seconds / unlearn_seconds)


def cumulative(times: Sequence[float]) -> list[float]:
    """Running sum of per-request wall times."""
    return [float(x) for x in np.cumsum(np.asarray(times, dtype=np.float64))]


@dataclass(frozen=True)
class SetOutputs:
    """A model's outputs on the three evaluation sets (probabilities), with their labels."""

    P_retain: NDArray[np.float64]
    y_retain: NDArray[np.int64]
    P_forget: NDArray[np.float64]
    y_forget: NDArray[np.int64]
    P_test: NDArray[np.float64]
    y_test: NDArray[np.int64]


def unlearning_metrics(model: SetOutputs, reference: SetOutputs, W: ArrayLike, W_ref: ArrayLike, *,
                       mia_method: MiaMethod = "svc", mia_max_per_class: int = 10_000, seed: int = 0,
                       with_mia: bool = True, reference_mia: float | None = None) -> dict[str, Any]:
    """Every per-step metric of a model against its retrained reference, as one flat dict.

    ``reference_mia``: the reference's own MIA score when already computed (several strategies
    share one retrained reference; the attack on it need not be retrained for each)."""
    out: dict[str, Any] = {}
    for key, P, y, Pr in (("ra", model.P_retain, model.y_retain, reference.P_retain),
                          ("fa", model.P_forget, model.y_forget, reference.P_forget),
                          ("ta", model.P_test, model.y_test, reference.P_test)):
        a = accuracy(np.argmax(P, axis=1), y) if len(y) else float("nan")
        ar = accuracy(np.argmax(Pr, axis=1), y) if len(y) else float("nan")
        out[key], out[f"{key}_retrain"], out[f"{key}_gap"] = a, ar, abs(a - ar)
    if with_mia:
        kw: Mapping[str, Any] = {"method": mia_method, "max_per_class": mia_max_per_class, "seed": seed}
        m = mia_score(model.P_retain, model.y_retain, model.P_test, model.y_test, model.P_forget, model.y_forget, **kw)
        mr = reference_mia if reference_mia is not None else mia_score(
            reference.P_retain, reference.y_retain, reference.P_test, reference.y_test,
            reference.P_forget, reference.y_forget, **kw)
        out["mia"], out["mia_retrain"], out["mia_gap"] = m, mr, abs(m - mr)
    out["param_gap"] = parameter_gap(W, W_ref)
    out["kl_test"] = output_kl(reference.P_test, model.P_test)
    out["kl_forget"] = output_kl(reference.P_forget, model.P_forget)
    return out
