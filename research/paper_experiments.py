"""The seeds' experiments on offline data, as functions returning JSON-ready records (no I/O).

1. Ridge paper: Table 3 (accuracy), Table 4 (deviation vs K clients and precision), Table 5
   (single deletions then add-back), Figure 2 (chunked 20% deletions).
2. ACU: a forgetting pool split into 5 and 25 sequential requests, all metrics per step.
3. SAFE: rounds of random deletions; RA/FA/TA/MIA and time per request.
4. HF-KCU: 10 Dirichlet(0.5) clients, remove client 0; accuracy, CF, MIA, parameter gap, speedup.

Every experiment runs every strategy (``strategy_factories``); where a measurement is undefined
for a method (e.g. add-back for a delete-only method) the record says so instead of a number.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from research.metrics import causal_faithfulness, parameter_gap
from research.strategies import (
    ACU,
    HFKCU,
    SAFE,
    ACURandomProjection,
    CentralTrainer,
    ExactRidgeA,
    ExactRidgeB,
    FedAvgRetrain,
    FedAvgTrainer,
    Finetune,
    Float32RidgeA,
    Float32RidgeB,
    Float64RidgeA,
    Float64RidgeB,
    NegGrad,
    NoUnlearning,
    RidgeRetrain,
    SoftmaxRetrain,
    Strategy,
    Trainer,
    dirichlet_partition,
)
from unlearn.ledger import ExactLedger, centralized_retrain, one_hot, solve_head

from .paper_data import PaperData
from .paper_runner import Request, StrategyFactory, StreamRunner, run_summary

Log = Callable[[str], None]
STRATEGY_ORDER = ("exact-a", "exact-b", "float64-a", "float64-b", "float32-a", "float32-b", "acu", "acu-rp",
                  "hf-kcu", "safe", "neggrad", "finetune", "no-unlearning", "retrain-ridge", "retrain-softmax",
                  "fedavg-retrain")


@dataclass(frozen=True)
class PaperConfig:
    """Sizes and settings; ``quick()`` and ``full()`` are the two presets."""

    quick: bool = False
    dataset: str = "auto"
    n_train: int = 20_000
    n_test: int = 4_000
    seed: int = 0
    gamma: float = 1.0               # ridge regularizer (chosen on Fashion-MNIST features, docs)
    rp_dim: int = 2048               # ACU buffer-layer width
    rp_gamma: float = 1000.0         # ~ gamma * E||h||^2 for the ReLU expansion (docs)
    mia_max_per_class: int = 2_000   # SAFE used 10,000 retained vs 10,000 test; an RBF-SVC on 20k
                                     # points per model per step is too slow on CPU (docs)
    clients: int = 10                # client partition used by federated strategies in every experiment
    alpha: float = 0.5               # Dirichlet non-IID concentration
    t3_clients: int = 100            # ridge paper: 100 clients
    t3_fedavg_rounds: int = 120      # ridge paper A1: 120 rounds, 20 clients per round, full local data
    t3_clients_per_round: int = 20
    t4_clients: tuple[int, ...] = (10, 50, 100)
    t5_steps: int = 200              # ridge paper: 200 single deletions, then add-back
    f2_chunks: int = 4               # 20% of the data per step until 80% is gone
    f2_fraction: float = 0.2
    acu_pool_fraction: float = 0.25  # ACU: 10,000 of 40,000 CL samples
    acu_requests: tuple[int, ...] = (5, 25)
    safe_rounds: int = 20            # SAFE: 20 rounds of 400 random deletions
    safe_per_round: int = 400
    hf_rounds: int = 20              # HF-KCU: FedAvg 20 rounds, 5 local epochs, batch 64
    hf_local_epochs: int = 5
    fedavg_lr: float = 0.5           # paper: 0.01 for CNNs; see docs/strategies.md
    experiments: tuple[str, ...] = ("ridge", "acu", "safe", "hfkcu")
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def full(**kw: Any) -> PaperConfig:
        return replace(PaperConfig(), **kw)

    @staticmethod
    def quick_preset(**kw: Any) -> PaperConfig:
        base = PaperConfig(quick=True, n_train=1200, n_test=400, rp_dim=1024, rp_gamma=500.0, mia_max_per_class=400,
                           t3_fedavg_rounds=30, t5_steps=20, safe_rounds=10, safe_per_round=30)
        return replace(base, **kw)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def central_trainer() -> CentralTrainer:
    return CentralTrainer()


def fedavg_trainer(cfg: PaperConfig, **kw: Any) -> FedAvgTrainer:
    base: dict[str, Any] = {"n_rounds": cfg.hf_rounds, "local_epochs": cfg.hf_local_epochs, "batch_size": 64,
                            "lr": cfg.fedavg_lr, "seed": cfg.seed}
    base.update(kw)
    return FedAvgTrainer(**base)


def strategy_factories(cfg: PaperConfig, trainer: Trainer, horizon: int,
                       fedavg: FedAvgTrainer | None = None) -> dict[str, StrategyFactory]:
    """All strategies of the comparison. ``trainer``: the softmax recipe of the approximate methods'
    base model; ``horizon``: SAFE's T (number of requests in the experiment)."""
    g = cfg.gamma
    fa = fedavg if fedavg is not None else fedavg_trainer(cfg)
    return {
        "exact-a": lambda: ExactRidgeA(g),
        "exact-b": lambda: ExactRidgeB(g),
        "float64-a": lambda: Float64RidgeA(g),
        "float64-b": lambda: Float64RidgeB(g),
        "float32-a": lambda: Float32RidgeA(g),
        "float32-b": lambda: Float32RidgeB(g),
        "acu": lambda: ACU(g),
        "acu-rp": lambda: ACURandomProjection(cfg.rp_gamma, cfg.rp_dim, expansion_seed=cfg.seed),
        "hf-kcu": lambda: HFKCU(trainer),
        "safe": lambda: SAFE(trainer, horizon=max(1, horizon), seed=cfg.seed),
        "neggrad": lambda: NegGrad(trainer, seed=cfg.seed),
        "finetune": lambda: Finetune(trainer, seed=cfg.seed),
        "no-unlearning": lambda: NoUnlearning(trainer),
        "retrain-ridge": lambda: RidgeRetrain(g),
        "retrain-softmax": lambda: SoftmaxRetrain(CentralTrainer()),
        "fedavg-retrain": lambda: FedAvgRetrain(fa),
    }


def exact_checks(data: PaperData) -> Callable[[Strategy, NDArray[np.int64]], dict[str, Any]]:
    """For the exact-ledger strategies: is the ledger bit-identical to the from-scratch ledger of
    the retained set, and is the head bit-identical to the from-scratch head (Variant A always;
    Variant B right after a reset)? The from-scratch ledger is built once per retained set."""
    cache: dict[tuple[bytes, float, int], tuple[str, NDArray[np.float64]]] = {}

    def check(s: Strategy, retained: NDArray[np.int64]) -> dict[str, Any]:
        if not isinstance(s, ExactRidgeA):
            return {}
        q = s.quantizer
        key = (retained.tobytes(), s.gamma, q.frac_bits)
        if key not in cache:
            cache.clear()
            fresh = ExactLedger.from_rows(q.quantize(data.F_train[retained]), data.y_train[retained],
                                          data.n_classes, q.frac_bits)
            cache[key] = (fresh.digest(), solve_head(fresh, s.gamma))
        digest, canonical = cache[key]
        out: dict[str, Any] = {"ledger_bit_identical": digest == s.ledger.digest(),
                               "head_bit_identical": bool(np.array_equal(canonical, s.weights))}
        if isinstance(s, ExactRidgeB):
            out["mode"] = s.mode
        return out

    return check


def _records(experiment: str, data: PaperData, runs: Mapping[str, Any], **meta: Any) -> list[dict[str, Any]]:
    out = []
    for name in STRATEGY_ORDER:
        if name in runs:
            rec = {"experiment": experiment, "dataset": data.name, **meta, **run_summary(runs[name])}
            out.append(rec)
    return out


def _rng(cfg: PaperConfig, salt: int) -> np.random.Generator:
    return np.random.default_rng([cfg.seed, salt])


# ---------------------------------------------------------------------------------------- ridge paper
def ridge_paper(cfg: PaperConfig, data: PaperData, log: Log) -> list[dict[str, Any]]:
    """Table 3, Table 4, Table 5 and Figure 2 of the exact federated continual unlearning paper."""
    recs: list[dict[str, Any]] = []
    n = data.F_train.shape[0]
    all_idx = np.arange(n, dtype=np.int64)
    extra = exact_checks(data)

    # Table 3: accuracy after the initial (federated) fit with 100 clients.
    log("ridge / table 3: accuracy with 100 clients")
    cl100 = dirichlet_partition(data.y_train, cfg.t3_clients, cfg.alpha, seed=cfg.seed)
    fa3 = fedavg_trainer(cfg, n_rounds=cfg.t3_fedavg_rounds, clients_per_round=cfg.t3_clients_per_round,
                         local_epochs=1)
    runner = StreamRunner(data, cl100, strategy_factories(cfg, central_trainer(), 1, fa3), with_mia=False,
                          seed=cfg.seed, extra=extra, log=log)
    recs += _records("ridge.table3", data, runner.run(all_idx, [], eval_steps=[], eval_initial=True),
                     clients=cfg.t3_clients)

    # Table 4: deviation from the central retrain for K clients and each precision.
    log("ridge / table 4: deviation vs clients and precision")
    W_ridge = centralized_retrain(data.F_train, one_hot(data.y_train, data.n_classes), cfg.gamma)
    facts = strategy_factories(cfg, central_trainer(), 1)
    names4 = ("exact-a", "exact-b", "float64-a", "float64-b", "float32-a", "float32-b", "acu", "acu-rp",
              "retrain-ridge", "retrain-softmax", "fedavg-retrain")
    central_softmax = CentralTrainer().train(data.F_train, data.y_train, np.zeros(n, np.int64), data.n_classes)
    rp = ACURandomProjection(cfg.rp_gamma, cfg.rp_dim, expansion_seed=cfg.seed).retrain_counterpart()
    W_rp = rp.fit(data.F_train, data.y_train, n_classes=data.n_classes).weights
    by_name: dict[str, dict[str, Any]] = {k: {"deviation": {}, "digest": {}, "fit_seconds": {}} for k in names4}
    for K in cfg.t4_clients:
        clK = dirichlet_partition(data.y_train, K, cfg.alpha, seed=cfg.seed + K)
        for name in names4:
            s = facts[name]()
            if name == "fedavg-retrain":
                s = FedAvgRetrain(fedavg_trainer(cfg, n_rounds=cfg.t3_fedavg_rounds,
                                                 clients_per_round=min(cfg.t3_clients_per_round, K), local_epochs=1))
            t0 = time.perf_counter()
            s.fit(data.F_train, data.y_train, clients=clK, n_classes=data.n_classes)
            by_name[name]["fit_seconds"][K] = time.perf_counter() - t0
            ref = W_rp if name == "acu-rp" else (W_ridge if s.family == "ridge" else central_softmax)
            by_name[name]["deviation"][K] = parameter_gap(s.weights, ref)
            if isinstance(s, ExactRidgeA):
                by_name[name]["digest"][K] = s.ledger.digest()
    for name in names4:
        r = by_name[name]
        rec: dict[str, Any] = {"experiment": "ridge.table4", "dataset": data.name, "strategy": name,
               "deviation_by_clients": {str(k): v for k, v in r["deviation"].items()},
               "fit_seconds_by_clients": {str(k): v for k, v in r["fit_seconds"].items()}}
        if r["digest"]:
            rec["ledger_identical_across_clients"] = len(set(r["digest"].values())) == 1
        if name in ("fedavg-retrain", "retrain-softmax"):
            rec["reference"] = "central softmax optimum (L-BFGS)"
        else:
            suffix = " on the same expansion" if name == "acu-rp" else ""
            rec["reference"] = "central ridge retrain (scikit-learn)" + suffix
        recs.append(rec)

    # Table 5: single deletions, then add-back in the same order.
    m = cfg.t5_steps
    log(f"ridge / table 5: {m} single deletions, then add-back")
    clients = dirichlet_partition(data.y_train, cfg.clients, cfg.alpha, seed=cfg.seed)
    order = _rng(cfg, 5).choice(n, m, replace=False)
    reqs = [Request("delete", np.array([i])) for i in order] + [Request("add", np.array([i])) for i in order]
    evals = sorted({m // 2, m, m + m // 2, 2 * m})
    runner = StreamRunner(data, clients, strategy_factories(cfg, central_trainer(), m), with_mia=False, seed=cfg.seed,
                          lazy_retrain=True, extra=extra, log=log)
    recs += _records("ridge.table5", data, runner.run(all_idx, reqs, eval_steps=evals), single_deletions=m,
                     eval_steps=evals)

    # Figure 2: chunked deletions of 20% of the data per step.
    log(f"ridge / figure 2: {cfg.f2_chunks} chunked deletions of {cfg.f2_fraction:.0%}")
    chunk = round(cfg.f2_fraction * n)
    perm = _rng(cfg, 2).permutation(n)
    reqs = [Request("delete", np.sort(perm[i * chunk:(i + 1) * chunk])) for i in range(cfg.f2_chunks)]
    runner = StreamRunner(data, clients, strategy_factories(cfg, central_trainer(), cfg.f2_chunks),
                          mia_max_per_class=cfg.mia_max_per_class, seed=cfg.seed, extra=extra, log=log)
    recs += _records("ridge.figure2", data, runner.run(all_idx, reqs, eval_initial=True),
                     chunk_fraction=cfg.f2_fraction)
    return recs


# ---------------------------------------------------------------------------------------- ACU
def acu_protocol(cfg: PaperConfig, data: PaperData, log: Log) -> list[dict[str, Any]]:
    """A forgetting pool (25% of the training set) split into 5 and 25 sequential requests."""
    recs: list[dict[str, Any]] = []
    n = data.F_train.shape[0]
    pool = _rng(cfg, 3).choice(n, round(cfg.acu_pool_fraction * n), replace=False)
    clients = dirichlet_partition(data.y_train, cfg.clients, cfg.alpha, seed=cfg.seed)
    for R in cfg.acu_requests:
        log(f"acu: forgetting pool of {pool.size} in {R} requests")
        reqs = [Request("delete", np.sort(part)) for part in np.array_split(pool, R)]
        runner = StreamRunner(data, clients, strategy_factories(cfg, central_trainer(), R),
                              mia_max_per_class=cfg.mia_max_per_class, seed=cfg.seed,
                              extra=exact_checks(data), log=log)
        recs += _records(f"acu.requests{R}", data, runner.run(np.arange(n), reqs), requests=R, pool=int(pool.size))
    return recs


# ---------------------------------------------------------------------------------------- SAFE
def safe_protocol(cfg: PaperConfig, data: PaperData, log: Log) -> list[dict[str, Any]]:
    """``safe_rounds`` rounds of ``safe_per_round`` random deletions; metrics averaged over rounds."""
    n = data.F_train.shape[0]
    total = cfg.safe_rounds * cfg.safe_per_round
    if total >= n:
        raise ValueError(f"SAFE protocol deletes {total} samples but the training set has {n}")
    log(f"safe: {cfg.safe_rounds} rounds of {cfg.safe_per_round} random deletions")
    order = _rng(cfg, 4).choice(n, total, replace=False)
    reqs = [Request("delete", np.sort(order[i * cfg.safe_per_round:(i + 1) * cfg.safe_per_round]))
            for i in range(cfg.safe_rounds)]
    clients = dirichlet_partition(data.y_train, cfg.clients, cfg.alpha, seed=cfg.seed)
    runner = StreamRunner(data, clients, strategy_factories(cfg, central_trainer(), cfg.safe_rounds),
                          mia_max_per_class=cfg.mia_max_per_class, seed=cfg.seed, log=log)
    return _records("safe.random_subsets", data, runner.run(np.arange(n), reqs), rounds=cfg.safe_rounds,
                    per_round=cfg.safe_per_round)


# ---------------------------------------------------------------------------------------- HF-KCU
def hfkcu_protocol(cfg: PaperConfig, data: PaperData, log: Log) -> list[dict[str, Any]]:
    """10 clients (Dirichlet 0.5), FedAvg base model, remove client 0 in one request."""
    n = data.F_train.shape[0]
    log(f"hf-kcu: {cfg.clients} Dirichlet({cfg.alpha}) clients, remove client 0")
    clients = dirichlet_partition(data.y_train, cfg.clients, cfg.alpha, seed=cfg.seed)
    fa = fedavg_trainer(cfg)
    victim = np.flatnonzero(clients == 0)
    runner = StreamRunner(data, clients, strategy_factories(cfg, fa, 1, fa), mia_max_per_class=cfg.mia_max_per_class,
                          seed=cfg.seed, extra=exact_checks(data), log=log)
    runs = runner.run(np.arange(n), [Request("delete", victim)], eval_initial=True)
    recs = _records("hfkcu.remove_client", data, runs, clients=cfg.clients, removed=int(victim.size))
    for rec in recs:
        steps = rec["steps"]
        if len(steps) == 2:
            before, after = steps
            rec["acc_trained"] = before["ta"]
            rec["cf"] = causal_faithfulness(after["ta"], after["ta_retrain"], before["ta"])
    return recs


EXPERIMENTS: dict[str, Callable[[PaperConfig, PaperData, Log], list[dict[str, Any]]]] = {
    "ridge": ridge_paper, "acu": acu_protocol, "safe": safe_protocol, "hfkcu": hfkcu_protocol,
}
