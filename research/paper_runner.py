"""Drive many strategies through the same add/delete stream and measure them against retraining.

For every strategy the runner builds its ``retrain_counterpart`` (one per distinct reference:
strategies with the same model family and recipe share it), trains it on the initial set, and
hands its weights to softmax strategies as their common starting model. At each evaluation step
the references are retrained from scratch on the current retained set (timed: that is the
retraining cost each request would have paid) and every strategy is scored with ``research.metrics``.
Each request is timed per strategy with ``time.perf_counter``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from research.metrics import MiaMethod, SetOutputs, mia_score, unlearning_metrics
from research.strategies import RidgeRetrain, SoftmaxRetrain, Strategy, UnsupportedOperation

from .paper_data import PaperData

StrategyFactory = Callable[[], Strategy]
Extra = Callable[[Strategy, NDArray[np.int64]], Mapping[str, Any]]


@dataclass(frozen=True)
class Request:
    """One event of the stream: add or delete these training-set indices."""

    op: Literal["add", "delete"]
    idx: NDArray[np.int64]


@dataclass
class StrategyRun:
    """Everything measured for one strategy in one run."""

    name: str
    strategy: Strategy
    reference_key: str
    status: str = "ok"  # ok | unsupported-add@<step> | error@<step>: <msg>
    fit_seconds: float = 0.0
    request_seconds: list[float | None] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    lazy: bool = False

    @property
    def active(self) -> bool:
        return self.status == "ok"


def _is_retrain(s: Strategy) -> bool:
    return isinstance(s, (RidgeRetrain, SoftmaxRetrain))


class StreamRunner:
    """Run strategies over one stream on ``data``'s training set, with client assignment ``clients``."""

    def __init__(self, data: PaperData, clients: NDArray[np.int64], factories: Mapping[str, StrategyFactory], *,
                 mia_method: MiaMethod = "svc", mia_max_per_class: int = 10_000, with_mia: bool = True,
                 seed: int = 0, lazy_retrain: bool = False, extra: Extra | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.data, self.clients = data, np.asarray(clients, dtype=np.int64)
        self.factories = dict(factories)
        self.mia_method, self.mia_max, self.with_mia, self.seed = mia_method, mia_max_per_class, with_mia, seed
        self.lazy_retrain, self.extra = lazy_retrain, extra
        self.log = log or (lambda _m: None)
        self.retrain_seconds: dict[str, list[float | None]] = {}
        self._alias: dict[str, StrategyRun] = {}

    # ------------------------------------------------------------------ helpers
    def _fit(self, s: Strategy, idx: NDArray[np.int64], init: NDArray[np.float64] | None = None) -> float:
        d = self.data
        t0 = time.perf_counter()
        s.fit(d.F_train[idx], d.y_train[idx], ids=idx, clients=self.clients[idx], n_classes=d.n_classes,
              init_weights=init)
        return time.perf_counter() - t0

    def _outputs(self, s: Strategy, retained: NDArray[np.int64], forgotten: NDArray[np.int64]) -> SetOutputs:
        d = self.data
        return SetOutputs(s.predict_proba(d.F_train[retained]), d.y_train[retained],
                          s.predict_proba(d.F_train[forgotten]) if forgotten.size else np.zeros((0, d.n_classes)),
                          d.y_train[forgotten], s.predict_proba(d.F_test), d.y_test)

    # ------------------------------------------------------------------ run
    def run(self, initial: NDArray[np.int64], requests: Sequence[Request],
            eval_steps: Iterable[int] | Literal["all"] = "all", eval_initial: bool = False) -> dict[str, StrategyRun]:
        """Fit on ``initial`` (training-set indices), apply ``requests``; evaluate at the 1-based
        request numbers in ``eval_steps`` (and at step 0 if ``eval_initial``)."""
        d = self.data
        n = d.F_train.shape[0]
        retained = np.zeros(n, bool)
        retained[initial] = True
        forgotten = np.zeros(n, bool)
        evals = set(range(1, len(requests) + 1)) if eval_steps == "all" else set(eval_steps)
        if eval_initial:
            evals.add(0)

        runs: dict[str, StrategyRun] = {}
        counterparts: dict[str, Strategy] = {}
        for name, factory in self.factories.items():
            s = factory()
            key = s.reference_key()
            runs[name] = StrategyRun(name, s, key, lazy=self.lazy_retrain and _is_retrain(s))
            counterparts.setdefault(key, s.retrain_counterpart())
        base: dict[str, NDArray[np.float64]] = {}
        for key, cp in counterparts.items():
            t = self._fit(cp, initial)
            base[key] = cp.weights.copy()
            self.retrain_seconds[key] = [t]
            self.log(f"  reference {key[:60]}: fitted in {t:.2f}s")
        for run in runs.values():
            init = base[run.reference_key] if run.strategy.family == "softmax" else None
            run.fit_seconds = self._fit(run.strategy, initial, init)
        refs = {k: cp for k, cp in counterparts.items()}
        # A retrain strategy *is* its own reference: reuse it at evaluation steps instead of
        # retraining the same model twice (its request time is then the retrain time).
        self._alias = {}
        for run in runs.values():
            if _is_retrain(run.strategy) and run.reference_key not in self._alias:
                self._alias[run.reference_key] = run
        if 0 in evals:
            self._evaluate(0, runs, refs, np.flatnonzero(retained), np.flatnonzero(forgotten), None, fresh=False)

        for step, req in enumerate(requests, start=1):
            idx = np.asarray(req.idx, dtype=np.int64)
            if req.op == "delete":
                if not retained[idx].all():
                    raise ValueError(f"request {step} deletes samples that are not retained")
                retained[idx] = False
                forgotten[idx] = True
            else:
                if retained[idx].any():
                    raise ValueError(f"request {step} adds samples that are already retained")
                retained[idx] = True
                forgotten[idx] = False
            for run in runs.values():
                if not run.active:
                    run.request_seconds.append(None)
                    continue
                if run.lazy and step not in evals:
                    run.request_seconds.append(None)
                    continue
                s = run.strategy
                try:
                    t0 = time.perf_counter()
                    if run.lazy:  # retrain strategy evaluated lazily: one retrain on the current set
                        ridx = np.flatnonzero(retained)
                        s.fit(d.F_train[ridx], d.y_train[ridx], ids=ridx, clients=self.clients[ridx],
                              n_classes=d.n_classes)
                    elif req.op == "delete":
                        s.delete(d.F_train[idx], d.y_train[idx], ids=idx, clients=self.clients[idx])
                    else:
                        s.add(d.F_train[idx], d.y_train[idx], ids=idx, clients=self.clients[idx])
                    run.request_seconds.append(time.perf_counter() - t0)
                except UnsupportedOperation:
                    run.status = f"unsupported-{req.op}@{step}"
                    run.request_seconds.append(None)
                except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
                    run.status = f"error@{step}: {type(exc).__name__}: {exc}"[:200]
                    run.request_seconds.append(None)
                    self.log(f"  {run.name} failed at request {step}: {exc}")
            if step in evals:
                self._evaluate(step, runs, refs, np.flatnonzero(retained), np.flatnonzero(forgotten), req)
        return runs

    def _evaluate(self, step: int, runs: dict[str, StrategyRun], refs: dict[str, Strategy],
                  retained: NDArray[np.int64], forgotten: NDArray[np.int64], req: Request | None,
                  fresh: bool = True) -> None:
        ref_out: dict[str, SetOutputs] = {}
        ref_mia: dict[str, float] = {}
        needed = {r.reference_key for r in runs.values() if r.active}
        for key in needed:
            cp = refs[key]
            alias = self._alias.get(key)
            if fresh and alias is not None and alias.active and alias.request_seconds[-1] is not None:
                refs[key] = cp = alias.strategy
                self.retrain_seconds[key].append(alias.request_seconds[-1])
            elif fresh:
                refs[key] = cp = cp.retrain_counterpart()
                t = self._fit(cp, retained)
                self.retrain_seconds[key].append(t)
            ref_out[key] = self._outputs(cp, retained, forgotten)
            if self.with_mia and forgotten.size:
                o = ref_out[key]
                ref_mia[key] = mia_score(o.P_retain, o.y_retain, o.P_test, o.y_test, o.P_forget, o.y_forget,
                                         method=self.mia_method, max_per_class=self.mia_max, seed=self.seed)
        for run in runs.values():
            if not run.active:
                continue
            s, key = run.strategy, run.reference_key
            rec: dict[str, Any] = {"step": step, "op": req.op if req else "fit",
                                   "size": int(req.idx.size) if req else 0,
                                   "n_retained": int(retained.size), "n_forgotten": int(forgotten.size)}
            secs = run.request_seconds[-1] if req is not None else run.fit_seconds
            rec["seconds"] = secs
            known = [x for x in run.request_seconds if x is not None]
            rec["cum_seconds"] = float(sum(known))
            rec["retrain_seconds"] = self.retrain_seconds[key][-1]
            rec["speedup"] = (rec["retrain_seconds"] / secs) if (secs and req is not None) else None
            rec.update(unlearning_metrics(self._outputs(s, retained, forgotten), ref_out[key], s.weights,
                                          refs[key].weights, mia_method=self.mia_method,
                                          mia_max_per_class=self.mia_max, seed=self.seed,
                                          with_mia=self.with_mia and forgotten.size > 0,
                                          reference_mia=ref_mia.get(key)))
            if self.extra is not None:
                rec.update(self.extra(s, retained))
            run.steps.append(rec)


def run_summary(run: StrategyRun) -> dict[str, Any]:
    """Flat summary of a run for the JSON records: final-step metrics, means over steps, timings."""
    out: dict[str, Any] = {
        "strategy": run.name, "family": run.strategy.family, "exactness": run.strategy.exactness,
        "uses_retained_data": run.strategy.uses_retained_data, "params": dict(run.strategy.params()),
        "status": run.status, "fit_seconds": run.fit_seconds,
    }
    times = [t for t in run.request_seconds if t is not None]
    out["requests_timed"] = len(times)
    out["requests_total"] = len(run.request_seconds)
    out["mean_request_seconds"] = float(np.mean(times)) if times else None
    out["time_estimated"] = run.lazy
    out["request_seconds"] = list(run.request_seconds)
    out["cum_seconds"] = (float(np.mean(times)) * len(run.request_seconds) if run.lazy and times
                          else float(sum(times)))
    timed = [s for s in run.steps if s.get("op") != "fit" and s.get("seconds") and s.get("retrain_seconds")]
    out["cum_retrain_seconds"] = float(sum(s["retrain_seconds"] for s in timed)) if timed else None
    out["speedup_over_retrain"] = (out["cum_retrain_seconds"] / sum(s["seconds"] for s in timed)) if timed else None
    if run.steps:
        out["final"] = {k: v for k, v in run.steps[-1].items()}
        numeric = {k for k, v in run.steps[-1].items() if isinstance(v, (int, float)) and v is not None}
        means: dict[str, float] = {}
        for k in sorted(numeric):
            vals = [s[k] for s in run.steps if isinstance(s.get(k), (int, float)) and s.get(k) is not None
                    and np.isfinite(s[k])]
            if vals:
                means[k] = float(np.mean(vals))
        out["mean_over_steps"] = means
    out["steps"] = run.steps
    return out
