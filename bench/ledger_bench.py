"""Ledger benchmark: the price of exactness, and what it buys.

Prints (never asserts) medians of several repeats, measured side by side in one run:

1. per-event update cost, ``ExactLedger.add`` vs ``FloatLedger.add`` (float64) at rank 1/64/1024;
2. Variant A solve (``solve_head``) and its parts;
3. Variant B rank-r SMW update (``SMWTracker.add`` / ``.delete``);
4. one deletion (exact ledger delete + Variant A solve, or + a rank-1 downdate of the fast head:
   SMW, or the Cholesky factor with the default kernel) vs a centralized retrain from scratch
   (float64 S, G build + solve; scikit-learn Ridge);
5. the drift study: float64 / float32 ledgers vs the exact ledger over a long add/churn/delete
   stream, against a from-scratch retrain on what is retained, plus digest equality;
6. Variant B drift on a rank-1 churn stream: TrackedHead without resets vs with periodic resets
   (SMW tracker, and the Cholesky-factor tracker without resets);
7. the exact update kernel: float64 X^T X of a batch vs ExactLedger.add of the same batch (rows/s,
   ratio), and the per-event exact update at ranks 1/8/32 (add, delete, and the fold a reader pays);
8. the fast head's forms side by side: SMWTracker vs CholeskyTracker with each factor kernel
   (the blocked numpy update, the compiled hyhound one where installed), ranks 1/8/64, add and delete.

Features are synthetic (class means plus power-law noise, L2-normalized, quantized at k=30), not
backbone features: the costs depend on d, c, r and n only, and the drift depends on the arithmetic.

    python -m bench.ledger_bench [--quick] [--json PATH] [--threads N|all] [--sections 4,8]

BLAS threads default to 1 (see the "BLAS threading" table the run prints: on a shared 2-core
machine a 2-thread OpenBLAS call on a small operand can wait a scheduler tick for the busy core).
Section 4 is measured with 1 thread and with all cores.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from unlearn.ledger import (
    CholeskyTracker,
    ExactLedger,
    FloatLedger,
    LedgerError,
    Quantizer,
    SMWTracker,
    TrackedHead,
    centralized_retrain,
    cholesky_tracker,
    l2_normalize,
    one_hot,
    relative_deviation,
    solve_head,
)

GAMMA = 1.0
QUANTIZER = Quantizer(frac_bits=30)


# ---------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class Config:
    name: str
    threads: int | None = 1  # BLAS threads for sections 1-3, 5, 6 (None = library default)
    seed: int = 20240611
    c: int = 10
    dims: tuple[int, ...] = (768, 1536)
    ranks: tuple[int, ...] = (1, 64, 1024)
    smw_ranks: tuple[int, ...] = (1, 64)
    repeats: int = 7
    ledger_rows: int = 4096  # rows in the ledger that sections 2-3 solve/track
    retrain_n: int = 60_000
    retrain_d: int = 768
    retrain_repeats: int = 7
    drift_d: int = 128
    drift_bulk: int = 1_000_000
    drift_batch: int = 1024
    drift_delete_chunk: int = 512
    drift_retained: int = 1000
    drift_churn: int = 50_000
    drift_f32: bool = True
    smw_d: int = 128
    smw_n0: int = 2000
    smw_events: int = 50_000
    smw_checkpoints: int = 10
    smw_gammas: tuple[float, ...] = (1.0, 1e-3)
    blas_probe_d: int = 768
    kernel_d: int = 768  # section 7
    kernel_rows: int = 4096
    kernel_ranks: tuple[int, ...] = (1, 8, 32)
    kernel_repeats: int = 9
    head_d: int = 768  # section 8
    head_ranks: tuple[int, ...] = (1, 8, 64)
    head_repeats: int = 15
    sections: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)


FULL = Config("full")
QUICK = Config("quick", repeats=3, ledger_rows=2048, retrain_n=60_000, retrain_repeats=3,
               drift_d=64, drift_bulk=100_000, drift_churn=2000, smw_d=64, smw_n0=500,
               smw_events=3000, smw_checkpoints=3, kernel_repeats=5, head_repeats=7)
#: For the smoke test: every section, seconds in all.
TINY = Config("tiny", dims=(24,), ranks=(1, 16), smw_ranks=(1, 4), repeats=2, ledger_rows=64,
              retrain_n=300, retrain_d=16, retrain_repeats=2, drift_d=8, drift_bulk=4000,
              drift_batch=256, drift_delete_chunk=100, drift_retained=40, drift_churn=300,
              smw_d=8, smw_n0=40, smw_events=300, smw_checkpoints=2, blas_probe_d=32,
              kernel_d=24, kernel_rows=300, kernel_repeats=2, head_d=24, head_ranks=(1, 4), head_repeats=2)


def _log(msg: str) -> None:
    print(f"[ledger_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- machine info
def machine_info(threads: int | None) -> dict[str, Any]:
    """What the numbers depend on: CPU, BLAS, versions, load."""
    import scipy
    import sklearn
    from threadpoolctl import threadpool_info

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    blas: dict[str, Any] = {}
    try:
        cfg = np.show_config(mode="dicts")  # numpy >= 2
        b = cfg.get("Build Dependencies", {}).get("blas", {})
        blas = {"numpy_blas": b.get("name"), "numpy_blas_version": b.get("version"),
                "numpy_blas_config": b.get("openblas configuration", "")}
        simd = cfg.get("SIMD Extensions", {})
        blas["numpy_simd_found"] = simd.get("found")
    except Exception as exc:  # pragma: no cover - older numpy
        blas = {"numpy_blas": f"unavailable ({exc})"}
    pools = [{k: p.get(k) for k in ("user_api", "internal_api", "prefix", "version", "num_threads",
                                     "threading_layer", "architecture")} for p in threadpool_info()]
    return {
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "sklearn": sklearn.__version__,
        **blas,
        "threadpools": pools,
        "bench_blas_threads": "all (library default)" if threads is None else threads,
        "loadavg_start": list(os.getloadavg()),
    }


# ----------------------------------------------------------------------------------- features
class Synth:
    """Synthetic features: class means + power-law noise, L2-normalized, quantized (k=30).

    ``batch(key, n)`` is a pure function of (seed, d, c, key, n), so a stream can regenerate any
    batch instead of keeping a million rows in memory.
    """

    def __init__(self, d: int, c: int, seed: int) -> None:
        self.d, self.c, self.seed = int(d), int(c), int(seed)
        rng = np.random.default_rng([self.seed, self.d, self.c, 0])
        self.mu = rng.standard_normal((self.c, self.d))
        # Power-law noise spectrum (std 2/(1 + j/2)), like backbone embeddings: S is far from
        # isotropic (eigenvalues of the Gram span ~4 decades at d=128), so conditioning matters.
        self.noise = 2.0 / (1.0 + np.arange(self.d) / 2.0)

    def batch(self, key: Iterable[int], n: int) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]:
        """(Q int64 (n, d), class labels (n,), dequantized float64 features (n, d))."""
        rng = np.random.default_rng([self.seed, self.d, self.c, *map(int, key)])
        y = rng.integers(0, self.c, n)
        F = self.mu[y] + rng.standard_normal((n, self.d)) * self.noise
        Q = QUANTIZER.quantize(l2_normalize(F))
        return Q, y, QUANTIZER.dequantize(Q)


# Keys of the Synth streams (one namespace per use).
K_UPD, K_BASE, K_EXTRA, K_RETRAIN, K_R, K_BULK, K_CHURN, K_SMW0, K_SMW, K_KERNEL = range(1, 11)


# ------------------------------------------------------------------------------------- timing
Case = Callable[[], Any] | tuple[Callable[[], Any], Callable[[], Any]]


def side_by_side(cases: dict[str, Case], repeats: int, warmup: int = 1,
                 alternate: bool = True) -> dict[str, dict[str, Any]]:
    """Time each case once per round, all cases in every round (order reversed on odd rounds when
    ``alternate``) so that load changes on a shared machine hit every case alike.

    A case is ``fn`` or ``(fn, cleanup)``; only ``fn`` is timed. Returns per case the median,
    min and max in seconds and the raw samples.
    """
    norm = {k: (v if isinstance(v, tuple) else (v, None)) for k, v in cases.items()}
    for _ in range(warmup):
        for fn, cleanup in norm.values():
            fn()
            if cleanup is not None:
                cleanup()
    samples: dict[str, list[float]] = {k: [] for k in norm}
    names = list(norm)
    gc.collect()
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for i in range(repeats):
            for k in (reversed(names) if alternate and i % 2 else names):
                fn, cleanup = norm[k]
                t0 = time.perf_counter()
                fn()
                samples[k].append(time.perf_counter() - t0)
                if cleanup is not None:
                    cleanup()
    finally:
        if gc_was:
            gc.enable()
    return {k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "samples_s": v}
            for k, v in samples.items()}


class _Threads:
    """threadpoolctl limit (None = leave the library default)."""

    def __init__(self, n: int | None) -> None:
        self.n = n
        self._ctx: Any = None

    def __enter__(self) -> _Threads:
        if self.n is not None:
            from threadpoolctl import threadpool_limits
            self._ctx = threadpool_limits(limits=self.n)
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def _med(res: dict[str, dict[str, Any]], k: str) -> float:
    return float(res[k]["median_s"])


# ------------------------------------------------------------------------- 0. BLAS threading
def bench_blas_threads(d: int, repeats: int = 15) -> list[dict[str, Any]]:
    """A d x d matrix-vector product and a d x d x 10 GEMM with 1 BLAS thread vs all."""
    rng = np.random.default_rng(0)
    T = rng.standard_normal((d, d))
    u = rng.standard_normal((d, 1))
    G = rng.standard_normal((d, 10))
    rows = []
    for label, n in (("1", 1), ("all", None)):
        with _Threads(n):
            res = side_by_side({"T@u": lambda: T @ u, "T@G": lambda: T @ G}, max(repeats, 3))
        rows.append({"threads": label, "d": d, "matvec_us": _med(res, "T@u") * 1e6,
                     "gemm_d_d_10_us": _med(res, "T@G") * 1e6})
    return rows


# ------------------------------------------------------------------------- 1. update cost
def bench_updates(dims: Iterable[int], c: int, ranks: Iterable[int], repeats: int, seed: int) -> list[dict[str, Any]]:
    """ExactLedger.add vs FloatLedger.add (float64), same rows, same ranks; plus the quantize cost
    the featurizer pays once per row (not part of either update)."""
    rows = []
    ranks = tuple(ranks)
    for d in dims:
        syn = Synth(d, c, seed)
        Q, y, F = syn.batch((K_UPD,), max(ranks))
        raw = l2_normalize(F)
        ex, fl = ExactLedger(d, c), FloatLedger(d, c)
        for r in ranks:
            Qr, yr, Fr, Rr = Q[:r], y[:r], F[:r], raw[:r]
            res = side_by_side({
                "exact": lambda: ex.add(Qr, yr),
                "float64": lambda: fl.add(Fr, yr),
                "quantize": lambda: QUANTIZER.quantize(Rr),
            }, repeats)
            te, tf = _med(res, "exact"), _med(res, "float64")
            rows.append({"d": d, "c": c, "r": r, "exact_us": te * 1e6, "float64_us": tf * 1e6,
                         "exact_us_per_row": te * 1e6 / r, "float64_us_per_row": tf * 1e6 / r,
                         "exact_over_float": te / tf, "quantize_us": _med(res, "quantize") * 1e6,
                         "repeats": repeats})
    return rows


def _ledgers(d: int, c: int, n: int, seed: int) -> tuple[ExactLedger, FloatLedger]:
    syn = Synth(d, c, seed)
    Q, y, F = syn.batch((K_BASE,), n)
    ex = ExactLedger(d, c)
    ex.add(Q, y)
    fl = FloatLedger(d, c)
    fl.add(F, y)
    return ex, fl


# ------------------------------------------------------------------------- 2. Variant A solve
def bench_solve(dims: Iterable[int], c: int, n_rows: int, repeats: int, seed: int) -> list[dict[str, Any]]:
    """solve_head from the exact ledger and from a float64 ledger, and the parts of the exact one."""
    import scipy.linalg as sla

    rows = []
    for d in dims:
        ex, fl = _ledgers(d, c, n_rows, seed)
        H = ex.gram()
        H[np.diag_indices_from(H)] += GAMMA
        tracker = SMWTracker.from_ledger(ex, GAMMA)
        res = side_by_side({
            "solve_exact": lambda: solve_head(ex, GAMMA),
            "solve_float64": lambda: solve_head(fl, GAMMA),
            "gram_moments": lambda: (ex.gram(), ex.moments()),
            "cholesky": lambda: sla.cholesky(H, lower=True, check_finite=False),
            "digest": lambda: ex.digest(),
            "smw_reset": lambda: tracker.reset(ex),
        }, repeats)
        rows.append({"d": d, "c": c, "n": n_rows, **{f"{k}_ms": _med(res, k) * 1e3 for k in res}, "repeats": repeats})
    return rows


# ------------------------------------------------------------------------- 3. Variant B update
def bench_smw(dims: Iterable[int], c: int, ranks: Iterable[int], n_rows: int, repeats: int,
              seed: int) -> list[dict[str, Any]]:
    """SMWTracker.add then .delete of the same r rows (each timed), on a tracker of n_rows rows."""
    rows = []
    ranks = tuple(ranks)
    for d in dims:
        ex, _ = _ledgers(d, c, n_rows, seed)
        tracker = SMWTracker.from_ledger(ex, GAMMA)
        _, y, F = Synth(d, c, seed).batch((K_EXTRA,), max(ranks))
        t_solve = _med(side_by_side({"solve": lambda: solve_head(ex, GAMMA)}, repeats), "solve")
        for r in ranks:
            U = F[:r]
            dG = U.T @ one_hot(y[:r], c)
            feasible: list[bool] = []
            res = side_by_side({
                "add": lambda: tracker.add(U, dG),
                "delete": lambda: feasible.append(tracker.delete(U, dG).feasible),
            }, repeats, alternate=False)
            ta, td = _med(res, "add"), _med(res, "delete")
            rows.append({"d": d, "c": c, "r": r, "n": n_rows, "add_us": ta * 1e6, "delete_us": td * 1e6,
                         "add_us_per_row": ta * 1e6 / r, "delete_us_per_row": td * 1e6 / r,
                         "solve_over_delete": t_solve / td, "all_deletes_feasible": all(feasible),
                         "repeats": repeats})
    return rows


# ------------------------------------------------------------------ 4. deletion vs retrain
def bench_delete_vs_retrain(n: int, d: int, c: int, repeats: int, seed: int,
                            thread_settings: Iterable[int | None] = (1, None)) -> dict[str, Any]:
    """One deletion from a ledger of n+1 samples vs a centralized retrain on the n retained."""
    syn = Synth(d, c, seed)
    Q, y, F = syn.batch((K_RETRAIN,), n + 1)
    q0, y0 = Q[:1], y[:1]
    U0 = F[:1]
    Y0 = one_hot(y0, c)  # the trackers get the rows' labels, as TrackedHead passes them
    dG0 = U0.T @ Y0
    Fr, yr = F[1:], y[1:]  # the retained rows after deleting row 0
    Yr = one_hot(yr, c)

    t0 = time.perf_counter()
    ex = ExactLedger(d, c)
    ex.add(Q, y)
    build_exact_s = time.perf_counter() - t0
    tracker = SMWTracker.from_ledger(ex, GAMMA)
    factor = CholeskyTracker.from_ledger(ex, GAMMA)  # the default factor kernel (hyhound where installed)

    def retrain_float64() -> NDArray[np.float64]:
        fl = FloatLedger(d, c)
        fl.add(Fr, yr)
        return solve_head(fl, GAMMA)

    # Correctness of what is being timed: the deletion heads vs the retrain heads.
    ex.delete(q0, y0)
    W_a = solve_head(ex, GAMMA)
    chk = tracker.delete(U0, dG0, Y0)
    W_b = tracker.W.copy()
    chk_f = factor.delete(U0, dG0, Y0)
    W_bf = factor.W.copy()
    W_f = retrain_float64()
    W_sk = centralized_retrain(Fr, Yr, GAMMA)
    sanity = {
        "dev_A_vs_float64_retrain": relative_deviation(W_a, W_f),
        "dev_B_vs_float64_retrain": relative_deviation(W_b, W_f),
        "dev_B_factor_vs_float64_retrain": relative_deviation(W_bf, W_f),
        "dev_sklearn_vs_float64_retrain": relative_deviation(W_sk, W_f),
        "smw_downdate_feasible": chk.feasible,
        "factor_downdate_feasible": chk_f.feasible,
        "factor_kernel": factor.kernel,
    }
    ex.add(q0, y0)
    tracker.add(U0, dG0, Y0)
    factor.add(U0, dG0, Y0)

    def restore_ex() -> None:
        ex.add(q0, y0)

    def restore_both() -> None:
        ex.add(q0, y0)
        tracker.add(U0, dG0, Y0)

    def del_a() -> None:
        ex.delete(q0, y0)
        solve_head(ex, GAMMA)

    def del_b() -> None:
        ex.delete(q0, y0)
        tracker.delete(U0, dG0, Y0)

    def restore_factor() -> None:
        ex.add(q0, y0)
        factor.add(U0, dG0, Y0)

    def del_b_factor() -> None:
        ex.delete(q0, y0)
        factor.delete(U0, dG0, Y0)

    settings = []
    for th in thread_settings:
        with _Threads(th):
            res = side_by_side({
                "ledger_delete_1row": (lambda: ex.delete(q0, y0), restore_ex),
                "solve_head": lambda: solve_head(ex, GAMMA),
                "smw_downdate_r1": (lambda: tracker.delete(U0, dG0, Y0), lambda: tracker.add(U0, dG0, Y0)),
                "deletion_A": (del_a, restore_ex),
                "deletion_B": (del_b, restore_both),
                "factor_downdate_r1": (lambda: factor.delete(U0, dG0, Y0), lambda: factor.add(U0, dG0, Y0)),
                "deletion_B_factor": (del_b_factor, restore_factor),
                "retrain_float64": retrain_float64,
                "retrain_sklearn": lambda: centralized_retrain(Fr, Yr, GAMMA),
                "digest": lambda: ex.digest(),
            }, repeats)
        med = {k: _med(res, k) for k in res}
        settings.append({
            "threads": "all" if th is None else th,
            "median_s": med,
            "spread_s": {k: [res[k]["min_s"], res[k]["max_s"]] for k in res},
            "speedup_float64_over_A": med["retrain_float64"] / med["deletion_A"],
            "speedup_float64_over_B": med["retrain_float64"] / med["deletion_B"],
            "speedup_sklearn_over_A": med["retrain_sklearn"] / med["deletion_A"],
            "speedup_sklearn_over_B": med["retrain_sklearn"] / med["deletion_B"],
            "speedup_float64_over_B_factor": med["retrain_float64"] / med["deletion_B_factor"],
            "speedup_float64_over_B_with_digest": med["retrain_float64"] / (med["deletion_B"] + med["digest"]),
        })
    return {"n_retained": n, "d": d, "c": c, "gamma": GAMMA, "repeats": repeats,
            "exact_ledger_build_s": build_exact_s, "sanity": sanity, "settings": settings}


# ------------------------------------------------------------------------- 5. drift study
def _safe_solve(stats: Any, gamma: float = GAMMA) -> NDArray[np.float64] | None:
    try:
        return solve_head(stats, gamma)
    except LedgerError:  # S + gamma I lost positive definiteness (float32 residue)
        return None


def _dev(W: NDArray[np.float64] | None, W_ref: NDArray[np.float64]) -> float:
    return float("nan") if W is None else relative_deviation(W, W_ref)


def drift_study(d: int, c: int, n_bulk: int, batch: int, delete_chunk: int, n_retained: int, n_churn: int,
                seed: int, with_f32: bool = True, scratch_chunk: int = 8192) -> dict[str, Any]:
    """A long stream fed to an exact, a float64 and a float32 ledger; at checkpoints, each ledger's
    head vs a from-scratch float64 retrain on the retained set, and exact vs from-scratch digests.

    Stream: add the retained set R (n_retained) -> add n_bulk rows in rank-``batch`` batches ->
    n_churn rank-1 events (add a fresh sample, or delete a random churn sample present) -> delete
    the bulk in a random batch order in rank-``delete_chunk`` pieces -> delete the remaining churn
    samples one by one. What is retained at the end is R.
    """
    syn = Synth(d, c, seed)
    QR, yR, FR = syn.batch((K_R,), n_retained)
    sizes = [min(batch, n_bulk - s) for s in range(0, n_bulk, batch)]

    def bulk(b: int) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]:
        return syn.batch((K_BULK, b), sizes[b])

    ex = ExactLedger(d, c)
    f64 = FloatLedger(d, c)
    f32 = FloatLedger(d, c, np.float32) if with_f32 else None
    stats = {"rows_added": 0, "rows_deleted": 0, "update_calls": 0}

    def apply(sign: int, Q: NDArray[np.int64], y: NDArray[np.int64], F: NDArray[np.float64]) -> None:
        for led, x in ((ex, Q), (f64, F), (f32, F)):
            if led is not None:
                (led.add if sign > 0 else led.delete)(x, y)
        stats["rows_added" if sign > 0 else "rows_deleted"] += Q.shape[0]
        stats["update_calls"] += 1

    present_bulk: set[int] = set()
    churn_rows: dict[int, tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]] = {}
    churn_ids: list[int] = []  # present churn ids (swap-remove)
    checkpoints: list[dict[str, Any]] = []

    def retained_parts() -> Iterator[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]]:
        yield QR, yR, FR
        for b in sorted(present_bulk):
            yield bulk(b)
        if churn_ids:
            ids = sorted(churn_ids)
            yield (np.vstack([churn_rows[i][0] for i in ids]), np.concatenate([churn_rows[i][1] for i in ids]),
                   np.vstack([churn_rows[i][2] for i in ids]))

    def checkpoint(name: str) -> None:
        t0 = time.perf_counter()
        sx, s64 = ExactLedger(d, c), FloatLedger(d, c)
        s32 = FloatLedger(d, c, np.float32) if with_f32 else None
        buf: list[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]] = []

        def flush() -> None:
            if buf:
                Q = np.vstack([p[0] for p in buf])
                y = np.concatenate([p[1] for p in buf])
                F = np.vstack([p[2] for p in buf])
                sx.add(Q, y)
                s64.add(F, y)
                if s32 is not None:
                    s32.add(F, y)
                buf.clear()

        rows_in_buf = 0
        for part in retained_parts():  # from scratch, regrouped into chunks of ~scratch_chunk rows
            buf.append(part)
            rows_in_buf += part[0].shape[0]
            if rows_in_buf >= scratch_chunk:
                flush()
                rows_in_buf = 0
        flush()
        W_ref = solve_head(s64, GAMMA)
        W_ex, W_sx = solve_head(ex, GAMMA), solve_head(sx, GAMMA)
        row = {
            "checkpoint": name,
            "rows_added": stats["rows_added"], "rows_deleted": stats["rows_deleted"],
            "update_calls": stats["update_calls"],
            "n_retained": ex.count, "scratch_n": sx.count,
            "float64_dev": _dev(_safe_solve(f64), W_ref),
            "float32_dev": _dev(_safe_solve(f32), W_ref) if f32 is not None else float("nan"),
            "float32_scratch_dev": _dev(_safe_solve(s32), W_ref) if s32 is not None else float("nan"),
            "exact_dev": relative_deviation(W_ex, W_ref),
            "exact_digest_equal": ex.digest() == sx.digest(),
            "exact_head_bits_equal": bool(np.array_equal(W_ex, W_sx)),
            "checkpoint_s": time.perf_counter() - t0,
        }
        checkpoints.append(row)
        _log(f"drift checkpoint {name}: n={row['n_retained']} f64 dev={row['float64_dev']:.3g} "
             f"exact dev={row['exact_dev']:.3g} digest equal={row['exact_digest_equal']}")

    t_start = time.perf_counter()
    apply(+1, QR, yR, FR)
    checkpoint("R added")
    for b in range(len(sizes)):
        apply(+1, *bulk(b))
        present_bulk.add(b)
    checkpoint(f"bulk added (rank-{batch})")

    rng = np.random.default_rng([seed, d, c, 99])
    next_id = 0
    for _ in range(n_churn):
        if not churn_ids or rng.random() < 0.5:
            row = syn.batch((K_CHURN, next_id), 1)
            churn_rows[next_id] = row
            churn_ids.append(next_id)
            next_id += 1
            apply(+1, *row)
        else:
            j = int(rng.integers(len(churn_ids)))
            cid = churn_ids[j]
            churn_ids[j] = churn_ids[-1]
            churn_ids.pop()
            apply(-1, *churn_rows.pop(cid))
    checkpoint("rank-1 churn")

    order = rng.permutation(len(sizes))
    for j, b in enumerate(order):
        Q, y, F = bulk(int(b))
        for s in range(0, Q.shape[0], delete_chunk):
            apply(-1, Q[s:s + delete_chunk], y[s:s + delete_chunk], F[s:s + delete_chunk])
        present_bulk.discard(int(b))
        if j + 1 == len(order) // 2:
            checkpoint("half of bulk deleted")
    checkpoint(f"bulk deleted (rank-{delete_chunk})")

    for cid in rng.permutation(sorted(churn_ids)):
        apply(-1, *churn_rows.pop(int(cid)))
    churn_ids.clear()
    checkpoint("churn deleted (rank-1): back to R")
    return {"d": d, "c": c, "gamma": GAMMA, "n_bulk": n_bulk, "batch": batch, "delete_chunk": delete_chunk,
            "n_retained_final": n_retained, "n_churn_events": n_churn, "scratch_chunk": scratch_chunk,
            "total_s": time.perf_counter() - t_start, "checkpoints": checkpoints}


# ------------------------------------------------------------------------- 6. SMW drift
_NO_RESETS: dict[str, Any] = {"reset_every": 10**12, "drift_threshold": float("inf"), "drift_check_every": 10**12}
SMW_POLICIES: dict[str, dict[str, Any]] = {
    "no resets": {**_NO_RESETS, "tracker": "smw"},
    "periodic /1000": {"reset_every": 1000, "drift_threshold": float("inf"), "drift_check_every": 10**12,
                       "tracker": "smw"},
    "default policy": {"tracker": "smw"},  # reset every 1000, drift estimate > 1e-9 checked every 64
    "cholesky, no resets": {**_NO_RESETS, "tracker": "cholesky"},
}


def smw_drift(d: int, c: int, n0: int, n_events: int, n_checkpoints: int, seed: int,
              policies: dict[str, dict[str, Any]] | None = None, gamma: float = GAMMA) -> dict[str, Any]:
    """Rank-1 churn on TrackedHeads with different reset policies; at checkpoints, each served head
    vs the canonical head of the (exact, shared-content) ledger, and a float64 ledger's head too."""
    policies = SMW_POLICIES if policies is None else policies
    syn = Synth(d, c, seed)
    Q0, y0, F0 = syn.batch((K_SMW0,), n0)
    base = ExactLedger(d, c)
    base.add(Q0, y0)
    heads = {name: TrackedHead(base.copy(), gamma, **kw) for name, kw in policies.items()}
    f64 = FloatLedger(d, c)
    f64.add(F0, y0)
    rows: dict[int, tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]] = {
        i: (Q0[i:i + 1], y0[i:i + 1], F0[i:i + 1]) for i in range(n0)}
    ids = list(range(n0))
    next_id = n0
    max_reset_drift = {k: 0.0 for k in heads}
    forced = {k: 0 for k in heads}  # resets forced by a refused downdate
    rng = np.random.default_rng([seed, d, c, 7])
    # One event before each round mark, so that a periodic reset (every 1000) has not just run.
    marks = {round(n_events * (i + 1) / n_checkpoints) - 1 for i in range(n_checkpoints)}
    out = []
    t0 = time.perf_counter()
    for e in range(1, n_events + 1):
        if rng.random() < 0.5 or len(ids) <= n0 // 2:
            row = syn.batch((K_SMW, next_id), 1)
            rows[next_id] = row
            ids.append(next_id)
            next_id += 1
            sign = +1
        else:
            j = int(rng.integers(len(ids)))
            row = rows.pop(ids[j])
            ids[j] = ids[-1]
            ids.pop()
            sign = -1
        Q, y, F = row
        for name, h in heads.items():
            rep = (h.add if sign > 0 else h.delete)(Q, y)
            if rep.reset_reason:
                max_reset_drift[name] = max(max_reset_drift[name], rep.drift)
                forced[name] += rep.reset_reason.startswith("downdate")
        (f64.add if sign > 0 else f64.delete)(F, y)
        if e in marks:
            ref_head = next(iter(heads.values()))
            W_canon = solve_head(ref_head.ledger, gamma)
            digests = {h.ledger.digest() for h in heads.values()}
            rec: dict[str, Any] = {"events": e, "n_retained": ref_head.ledger.count,
                                   "ledgers_identical": len(digests) == 1,
                                   "float64_ledger_dev": _dev(_safe_solve(f64, gamma), W_canon)}
            for name, h in heads.items():
                rec[name] = {"dev": relative_deviation(h.weights, W_canon), "resets": h.resets,
                             "forced_resets": forced[name], "max_drift_at_reset": max_reset_drift[name]}
            out.append(rec)
            _log(f"smw drift gamma={gamma} @{e}: " + ", ".join(f"{k}: {rec[k]['dev']:.3g}" for k in heads))
    return {"d": d, "c": c, "gamma": gamma, "n0": n0, "n_events": n_events,
            "policies": {k: (v if set(v) - {"tracker"} else
                             f"TrackedHead defaults (reset_every=1000, drift_threshold=1e-9, drift_check_every=64), "
                             f"tracker={v.get('tracker', 'default')}")
                         for k, v in policies.items()},
            "total_s": time.perf_counter() - t0, "checkpoints": out}


# ------------------------------------------------------------------------- 7. exact kernel
def bench_kernel(d: int, c: int, n_rows: int, ranks: Iterable[int], repeats: int, seed: int) -> dict[str, Any]:
    """ExactLedger.add of a batch vs the float64 X^T X of the same (dequantized) batch, and the
    per-event exact update at small ranks. ``add`` leaves its products pending in float64; ``fold``
    is what the next reader (digest, gram, blob) pays once to move them into the int64 limbs, so
    ``add + fold`` is the cost of an update that is read right away (the ledger processor's case)."""
    syn = Synth(d, c, seed)
    Q, y, F = syn.batch((K_KERNEL,), n_rows)
    ex = ExactLedger(d, c)
    ex.add(Q, y)
    ex.fold()

    def add_fold(Qr: NDArray[np.int64], yr: NDArray[np.int64]) -> None:
        ex.add(Qr, yr)
        ex.fold()

    res = side_by_side({
        "gemm": lambda: F.T @ F,
        "exact_add": lambda: ex.add(Q, y),
        "exact_add_fold": lambda: add_fold(Q, y),
    }, repeats)
    tg, ta, taf = _med(res, "gemm"), _med(res, "exact_add"), _med(res, "exact_add_fold")
    batch = {"d": d, "c": c, "rows": n_rows, "gemm_ms": tg * 1e3, "exact_add_ms": ta * 1e3,
             "exact_add_fold_ms": taf * 1e3, "gemm_rows_per_s": n_rows / tg, "exact_rows_per_s": n_rows / ta,
             "exact_fold_rows_per_s": n_rows / taf, "ratio": ta / tg, "ratio_fold": taf / tg, "repeats": repeats}
    small = []
    for r in ranks:
        Qr, yr, Fr = Q[:r], y[:r], F[:r]
        ex.fold()
        res = side_by_side({
            "gemm": lambda: Fr.T @ Fr,
            "add": (lambda: ex.add(Qr, yr), lambda: ex.delete(Qr, yr)),
            "delete": (lambda: ex.delete(Qr, yr), lambda: ex.add(Qr, yr)),
            "add_fold": (lambda: add_fold(Qr, yr), lambda: ex.delete(Qr, yr)),
            "fold": (ex.fold, lambda: ex.add(Qr, yr)),
        }, repeats)
        small.append({"r": r, **{f"{k}_us": _med(res, k) * 1e6 for k in res}, "repeats": repeats})
    return {"batch": batch, "ranks": small}


# ---------------------------------------------------------------- 8. fast head: SMW vs factor
def bench_fast_heads(d: int, c: int, ranks: Iterable[int], n_rows: int, repeats: int, seed: int) -> dict[str, Any]:
    """SMWTracker vs CholeskyTracker on one ledger of n_rows rows: rank-r add (cleanup: delete) and
    delete (cleanup: add) of rows both trackers already hold, each given the labels as TrackedHead
    gives them; plus a reset of each and a plain Cholesky of S + gamma I for scale."""
    import scipy.linalg as sla

    ex, _ = _ledgers(d, c, n_rows, seed)
    ranks = tuple(ranks)
    Qx, yx, Fx = Synth(d, c, seed).batch((K_EXTRA,), max(ranks))
    Yx = one_hot(yx, c)
    ex.add(Qx, yx)  # the trackers hold these rows too, so a delete removes a member
    smw = SMWTracker.from_ledger(ex, GAMMA)
    chol = CholeskyTracker.from_ledger(ex, GAMMA, kernel="blocked")
    hyh = CholeskyTracker.from_ledger(ex, GAMMA, kernel="hyhound") if cholesky_tracker.hyhound is not None else None
    H = ex.gram()
    H[np.diag_indices_from(H)] += GAMMA
    rows = []
    for r in ranks:
        U, Y = Fx[:r], Yx[:r]
        dG = U.T @ Y
        cases: dict[str, Case] = {
            "smw_add": (lambda: smw.add(U, dG, Y), lambda: smw.delete(U, dG, Y)),
            "chol_add": (lambda: chol.add(U, dG, Y), lambda: chol.delete(U, dG, Y)),
            "smw_delete": (lambda: smw.delete(U, dG, Y), lambda: smw.add(U, dG, Y)),
            "chol_delete": (lambda: chol.delete(U, dG, Y), lambda: chol.add(U, dG, Y)),
        }
        if hyh is not None:
            cases["hyh_add"] = (lambda: hyh.add(U, dG, Y), lambda: hyh.delete(U, dG, Y))
            cases["hyh_delete"] = (lambda: hyh.delete(U, dG, Y), lambda: hyh.add(U, dG, Y))
        res = side_by_side(cases, repeats)
        row = {"r": r, **{f"{k}_us": _med(res, k) * 1e6 for k in res},
               "add_smw_over_chol": _med(res, "smw_add") / _med(res, "chol_add"),
               "delete_smw_over_chol": _med(res, "smw_delete") / _med(res, "chol_delete")}
        if hyh is not None:
            row["add_smw_over_hyh"] = _med(res, "smw_add") / _med(res, "hyh_add")
            row["delete_smw_over_hyh"] = _med(res, "smw_delete") / _med(res, "hyh_delete")
        rows.append(row)
    W_ref = solve_head(ex, GAMMA)
    sanity = {"smw_dev": relative_deviation(smw.W, W_ref), "chol_dev": relative_deviation(chol.W, W_ref),
              "hyh_dev": relative_deviation(hyh.W, W_ref) if hyh is not None else None,
              "updates_each": smw.updates_since_reset}
    res = side_by_side({
        "cholesky": lambda: sla.cholesky(H, lower=True, check_finite=False),
        "smw_reset": lambda: smw.reset(ex),
        "chol_reset": lambda: chol.reset(ex),
    }, max(3, repeats // 3))
    return {"d": d, "c": c, "n": n_rows + max(ranks), "repeats": repeats, "ranks": rows, "sanity": sanity,
            **{f"{k}_ms": _med(res, k) * 1e3 for k in res}}


# ------------------------------------------------------------------------------- reporting
def _g(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{digits}g}"


def _t(x: float) -> str:
    """A duration given in the unit of its column, 4 significant digits, no exponent."""
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def _x(ratio: float) -> str:
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x"


def _policy(kw: Any) -> str:
    if not isinstance(kw, dict):
        return str(kw)
    big = 10**9
    return ", ".join(f"{k}={'never' if (isinstance(v, (int, float)) and (v >= big)) else v}" for k, v in kw.items())


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def render(results: dict[str, Any]) -> str:
    cfg = results["config"]
    m = results["machine"]
    out = [f"# Ledger benchmark ({cfg['name']} run)", ""]
    out.append(f"Command: `{results['command']}`  ")
    out.append(f"Started {results['started']}, wall time {results['wall_s']:.0f} s.")
    out.append("")
    out.append("## Machine and configuration")
    out.append("")
    out.append(f"- CPU: {m['cpu_model']}; os.cpu_count()={m['cpu_count']}, usable={m['cpu_affinity']}; {m['platform']}")
    out.append(f"- python {m['python']}, numpy {m['numpy']}, scipy {m['scipy']}, scikit-learn {m['sklearn']}")
    out.append(f"- numpy BLAS: {m.get('numpy_blas')} {m.get('numpy_blas_version')} "
               f"({m.get('numpy_blas_config', '').strip()}); SIMD found: {m.get('numpy_simd_found')}")
    for p in m["threadpools"]:
        out.append(f"- threadpool: {p['internal_api']} {p['version'] or ''} ({p['prefix']}, {p['user_api']}), "
                   f"default threads {p['num_threads']}, arch {p['architecture']}")
    out.append(f"- BLAS threads used: {m['bench_blas_threads']} (sections 1-3, 5-8); section 4 shows 1 and all")
    out.append(f"- load average at start {', '.join(f'{x:.2f}' for x in m['loadavg_start'])}; "
               f"at end {', '.join(f'{x:.2f}' for x in results['loadavg_end'])} (shared machine)")
    other_gammas = ", ".join(str(g) for g in cfg["smw_gammas"] if g != GAMMA)
    out.append(f"- gamma = {GAMMA} (section 6 also {other_gammas}); c = {cfg['c']} classes; k = 30 frac bits; "
               "medians of `repeats` side-by-side rounds "
               "(cases interleaved, order reversed every other round, one warm-up round)")
    out.append("- features: synthetic (class means + Gaussian noise with a power-law spectrum, std 2/(1+j/2) on "
               "coordinate j; L2-normalized, quantized at k=30; "
               "the float ledgers and retrains get the dequantized q * 2^-30, i.e. the same model), "
               "not backbone features")
    out.append("")

    if "blas_threads" in results:
        out.append("## 0. BLAS threading on this machine")
        out.append("")
        out.append(_table(["BLAS threads", "d", "T@u (d x d matvec) µs", "T@G (d x d x 10) µs"],
                          [[r["threads"], r["d"], _t(r["matvec_us"]), _t(r["gemm_d_d_10_us"])]
                           for r in results["blas_threads"]]))
        out.append("")

    if "updates" in results:
        rows = results["updates"]
        out.append(f"## 1. Per-event update cost: ExactLedger.add vs FloatLedger.add (float64), c = {cfg['c']}")
        out.append("")
        out.append(f"Median of {rows[0]['repeats']} repeats. Quantize = Quantizer.quantize of the same r rows "
                   "(paid once per sample at the featurizer, in neither update). The exact add leaves its products "
                   "pending in float64; the fold into int64 that the next read pays is timed in section 7.")
        out.append("")
        out.append(_table(["d", "rank r", "exact µs/call", "float64 µs/call", "exact µs/row", "float64 µs/row",
                           "exact/float64", "quantize µs/call"],
                          [[r["d"], r["r"], _t(r["exact_us"]), _t(r["float64_us"]), _t(r["exact_us_per_row"]),
                            _t(r["float64_us_per_row"]), _x(r['exact_over_float']), _t(r["quantize_us"])]
                           for r in rows]))
        out.append("")

    if "solve" in results:
        rows = results["solve"]
        out.append("## 2. Variant A: solve_head (Cholesky of S + gamma I, two triangular solves)")
        out.append("")
        out.append(f"Ledger of n rows; median of {rows[0]['repeats']} repeats, ms. "
                   "solve_head(exact) = gram()+moments() (128-bit limbs -> float64) + Cholesky + solves. "
                   "SMW reset = SMWTracker.reset (solve + explicit inverse T).")
        out.append("")
        out.append(_table(["d", "n", "solve_head(exact) ms", "solve_head(float64) ms", "exact gram()+moments() ms",
                           "Cholesky alone ms", "digest ms", "SMW reset ms"],
                          [[r["d"], r["n"], _t(r["solve_exact_ms"]), _t(r["solve_float64_ms"]),
                            _t(r["gram_moments_ms"]), _t(r["cholesky_ms"]), _t(r["digest_ms"]), _t(r["smw_reset_ms"])]
                           for r in rows]))
        out.append("")

    if "smw" in results:
        rows = results["smw"]
        out.append("## 3. Variant B: SMWTracker rank-r update")
        out.append("")
        out.append(f"Tracker of n rows; add then delete of the same r rows, median of {rows[0]['repeats']} repeats. "
                   "Float SMW only (no ledger update; see section 1 for that part).")
        out.append("")
        out.append(_table(["d", "rank r", "add µs", "delete µs", "add µs/row", "delete µs/row",
                           "solve_head / delete", "deletes feasible"],
                          [[r["d"], r["r"], _t(r["add_us"]), _t(r["delete_us"]), _t(r["add_us_per_row"]),
                            _t(r["delete_us_per_row"]), _x(r['solve_over_delete']), r["all_deletes_feasible"]]
                           for r in rows]))
        out.append("")

    if "delete_vs_retrain" in results:
        dv = results["delete_vs_retrain"]
        out.append(f"## 4. One deletion vs a centralized retrain (n = {dv['n_retained']:,} retained, d = {dv['d']}, "
                   f"c = {dv['c']}, gamma = {dv['gamma']})")
        out.append("")
        out.append(f"Median of {dv['repeats']} repeats, ms (min-max in brackets). One-off exact ledger build from the "
                   f"{dv['n_retained'] + 1:,} rows: {dv['exact_ledger_build_s']:.2f} s (first run, BLAS threads "
                   f"{m['bench_blas_threads']}).")
        out.append("")
        labels = [
            ("ledger_delete_1row", "ExactLedger.delete (1 row)"),
            ("solve_head", "Variant A solve_head"),
            ("smw_downdate_r1", "SMWTracker.delete (rank 1)"),
            ("deletion_A", "**deletion A** = ledger delete + solve_head"),
            ("deletion_B", "**deletion B** = ledger delete + SMW rank-1 downdate"),
            ("factor_downdate_r1", f"CholeskyTracker.delete (rank 1, kernel {dv['sanity']['factor_kernel']})"),
            ("deletion_B_factor", "**deletion B, factor** = ledger delete + Cholesky-factor rank-1 downdate"),
            ("retrain_float64", "**retrain float64** = S, G from the retained rows + solve_head"),
            ("retrain_sklearn", "**retrain sklearn** Ridge(solver=cholesky).fit"),
            ("digest", "ExactLedger.digest (what a receipt carries; not in deletion A/B)"),
        ]
        out.append("BLAS threads 'all' = OpenBLAS default (2 here). On a shared machine a multi-threaded BLAS call can "
                   "stall while another process holds a core (section 0 probes this); "
                   "the 1-thread column is the reference.")
        out.append("")
        header = ["operation"] + [f"BLAS threads {s['threads']}: ms" for s in dv["settings"]]
        body = []
        for key, label in labels:
            body.append([label] + [f"{_t(s['median_s'][key] * 1e3)} [{_t(s['spread_s'][key][0] * 1e3)}-"
                                   f"{_t(s['spread_s'][key][1] * 1e3)}]" for s in dv["settings"]])
        for key, label in (("speedup_float64_over_A", "speedup: retrain float64 / deletion A"),
                           ("speedup_float64_over_B", "speedup: retrain float64 / deletion B"),
                           ("speedup_sklearn_over_A", "speedup: retrain sklearn / deletion A"),
                           ("speedup_sklearn_over_B", "speedup: retrain sklearn / deletion B"),
                           ("speedup_float64_over_B_factor", "speedup: retrain float64 / deletion B, factor"),
                           ("speedup_float64_over_B_with_digest", "speedup: retrain float64 / (deletion B + digest)")):
            body.append([label] + [_x(s[key]) for s in dv["settings"]])
        out.append(_table(header, body))
        sa = dv["sanity"]
        out.append("")
        out.append(f"Sanity (what is timed gives the right head): relative deviation from the float64 retrain: "
                   f"deletion A {_g(sa['dev_A_vs_float64_retrain'])}, deletion B {_g(sa['dev_B_vs_float64_retrain'])}, "
                   f"deletion B factor {_g(sa['dev_B_factor_vs_float64_retrain'])}, "
                   f"sklearn {_g(sa['dev_sklearn_vs_float64_retrain'])}; "
                   f"downdates feasible: SMW {sa['smw_downdate_feasible']}, factor {sa['factor_downdate_feasible']}.")
        out.append("")

    if "drift" in results:
        dr = results["drift"]
        out.append(f"## 5. Drift study: float ledgers vs the exact ledger "
                   f"(d = {dr['d']}, c = {dr['c']}, gamma = {dr['gamma']})")
        out.append("")
        out.append(f"Stream: add R ({dr['n_retained_final']:,} samples) -> add {dr['n_bulk']:,} samples "
                   f"in rank-{dr['batch']} batches -> {dr['n_churn_events']:,} rank-1 churn events "
                   "(add a fresh sample / delete a random churn "
                   f"sample) -> delete the bulk in random batch order, rank-{dr['delete_chunk']} pieces -> delete the "
                   f"remaining churn samples one by one (back to R). Total {dr['total_s']:.0f} s.")
        out.append("")
        out.append("dev = ||W - W_ref||_F / ||W_ref||_F, W_ref = solve_head of a float64 S, G built from scratch "
                   f"from the dequantized retained rows (regrouped into {dr['scratch_chunk']}-row chunks). "
                   "float32 scratch = the same "
                   "from-scratch build in float32: the floor a float32 ledger could reach with no stream residue. "
                   "digest equal: exact ledger digest == digest of an ExactLedger built from scratch on the retained "
                   "rows; head bits equal: solve_head of both is bit-identical. "
                   "So `exact dev` is the distance between two from-scratch "
                   "computations (exactly rounded S vs a float64 GEMM sum): the float64 reference's own rounding, not "
                   "drift; the float columns are that plus the stream's residue.")
        out.append("")
        out.append(_table(["checkpoint", "rows added", "rows deleted", "n retained", "float64 dev", "float32 dev",
                           "float32 scratch dev", "exact dev", "exact digest equal", "exact head bits equal"],
                          [[r["checkpoint"], f"{r['rows_added']:,}", f"{r['rows_deleted']:,}", f"{r['n_retained']:,}",
                            _g(r["float64_dev"]), _g(r["float32_dev"]), _g(r["float32_scratch_dev"]),
                            _g(r["exact_dev"]), r["exact_digest_equal"], r["exact_head_bits_equal"]]
                           for r in dr["checkpoints"]]))
        out.append("")

    for i, sd in enumerate(results.get("smw_drift", [])):
        names = list(sd["policies"])
        out.append(f"## 6{'abcdefgh'[i]}. Variant B drift: TrackedHead on a rank-1 churn stream "
                   f"(d = {sd['d']}, c = {sd['c']}, gamma = {sd['gamma']})")
        out.append("")
        out.append(f"Start from {sd['n0']:,} samples; {sd['n_events']:,} rank-1 events (add a fresh sample or delete a "
                   "random present one, 50/50); checkpoints one event before round marks. "
                   "dev = served head vs the canonical head solve_head(ledger) (= the "
                   "from-scratch retrain, by section 5). Policies: "
                   + "; ".join(f"{k}: {_policy(v)}" for k, v in sd["policies"].items())
                   + ". max@reset = largest drift the tracker reported at a reset so far. "
                   + f"Total {sd['total_s']:.0f} s.")
        out.append("")
        header = ["events", "n retained"]
        for k in names:
            header += [f"{k}: dev", f"{k}: resets (forced)", f"{k}: max@reset"]
        header += ["float64 ledger dev", "ledgers identical"]
        body = []
        for r in sd["checkpoints"]:
            line = [f"{r['events']:,}", f"{r['n_retained']:,}"]
            for k in names:
                line += [_g(r[k]["dev"]), f"{r[k]['resets']} ({r[k]['forced_resets']})", _g(r[k]["max_drift_at_reset"])]
            line += [_g(r["float64_ledger_dev"]), r["ledgers_identical"]]
            body.append(line)
        out.append(_table(header, body))
        out.append("")

    if "kernel" in results:
        kb, kr = results["kernel"]["batch"], results["kernel"]["ranks"]
        out.append(f"## 7. Exact update kernel vs float64 X^T X (d = {kb['d']}, c = {kb['c']}, "
                   f"BLAS threads {m['bench_blas_threads']})")
        out.append("")
        out.append(f"Median of {kb['repeats']} side-by-side rounds. X^T X = numpy `F.T @ F` (a `dsyrk`) of the "
                   "dequantized batch; exact add = `ExactLedger.add` of the same quantized rows and class labels "
                   "(validation, S and G limbs); + fold = the same followed by `ExactLedger.fold()`, the "
                   "float64 -> int64 move that the next digest/gram/blob read would otherwise pay.")
        out.append("")
        out.append(_table(["operation", f"{kb['rows']} rows: ms", "rows/s", "/ X^T X"],
                          [["float64 X^T X", _t(kb["gemm_ms"]), f"{kb['gemm_rows_per_s']:,.0f}", "1x"],
                           ["ExactLedger.add", _t(kb["exact_add_ms"]), f"{kb['exact_rows_per_s']:,.0f}",
                            _x(kb["ratio"])],
                           ["ExactLedger.add + fold", _t(kb["exact_add_fold_ms"]),
                            f"{kb['exact_fold_rows_per_s']:,.0f}", _x(kb["ratio_fold"])]]))
        out.append("")
        out.append("Per-event exact update at small ranks (same ledger; delete = of rows it holds):")
        out.append("")
        out.append(_table(["rank r", "add µs", "delete µs", "add + fold µs", "fold alone µs", "float64 X^T X µs"],
                          [[r["r"], _t(r["add_us"]), _t(r["delete_us"]), _t(r["add_fold_us"]), _t(r["fold_us"]),
                            _t(r["gemm_us"])] for r in kr]))
        out.append("")

    if "fast_heads" in results:
        fh = results["fast_heads"]
        out.append(f"## 8. Fast head: SMWTracker vs CholeskyTracker (d = {fh['d']}, c = {fh['c']}, n = {fh['n']:,}, "
                   f"BLAS threads {m['bench_blas_threads']})")
        out.append("")
        out.append(f"Median of {fh['repeats']} side-by-side rounds, µs; each update gets the rows' labels, as "
                   "TrackedHead passes them. SMW: inverse T, Sherman-Morrison-Woodbury. Cholesky: factor L, "
                   "rank-r update/downdate (ledger/cholesky_tracker.py) with the blocked numpy kernel, and with the "
                   "compiled hyhound kernel where installed. Ratio > 1: the factor is faster.")
        out.append("")
        hy = "hyh_add_us" in fh["ranks"][0]
        header = ["rank r", "SMW add", "Cholesky blocked add", "Cholesky hyhound add", "SMW delete",
                  "Cholesky blocked delete", "Cholesky hyhound delete", "SMW / hyhound (add, delete)"]
        out.append(_table(header if hy else header[:3] + header[4:6] + ["SMW / blocked (add, delete)"],
                          [[r["r"], _t(r["smw_add_us"]), _t(r["chol_add_us"])]
                           + ([_t(r["hyh_add_us"])] if hy else [])
                           + [_t(r["smw_delete_us"]), _t(r["chol_delete_us"])]
                           + ([_t(r["hyh_delete_us"])] if hy else [])
                           + [f"{_x(r['add_smw_over_hyh'])}, {_x(r['delete_smw_over_hyh'])}" if hy else
                              f"{_x(r['add_smw_over_chol'])}, {_x(r['delete_smw_over_chol'])}"]
                           for r in fh["ranks"]]))
        sa = fh["sanity"]
        out.append("")
        out.append(f"Resets (ms): SMW {_t(fh['smw_reset_ms'])} (Cholesky + explicit inverse), Cholesky tracker "
                   f"{_t(fh['chol_reset_ms'])} (Cholesky + two solves); a plain Cholesky of S + gamma I: "
                   f"{_t(fh['cholesky_ms'])}. After the timed updates ({sa['updates_each']} per tracker), "
                   f"deviation from solve_head: SMW {_g(sa['smw_dev'])}, Cholesky blocked {_g(sa['chol_dev'])}"
                   + (f", Cholesky hyhound {_g(sa['hyh_dev'])}" if sa.get("hyh_dev") is not None else "") + ".")
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------------------------ main
def run(cfg: Config, command: str = "") -> dict[str, Any]:
    t0 = time.perf_counter()
    results: dict[str, Any] = {"config": asdict(cfg), "command": command,
                               "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                               "machine": machine_info(cfg.threads)}
    _log(f"config {cfg.name}: BLAS threads {cfg.threads}, sections {cfg.sections}")
    results["blas_threads"] = bench_blas_threads(cfg.blas_probe_d)
    on = set(cfg.sections)
    with _Threads(cfg.threads):
        if 1 in on:
            _log("1. update cost")
            results["updates"] = bench_updates(cfg.dims, cfg.c, cfg.ranks, cfg.repeats, cfg.seed)
        if 2 in on:
            _log("2. Variant A solve")
            results["solve"] = bench_solve(cfg.dims, cfg.c, cfg.ledger_rows, cfg.repeats, cfg.seed)
        if 3 in on:
            _log("3. Variant B update")
            results["smw"] = bench_smw(cfg.dims, cfg.c, cfg.smw_ranks, cfg.ledger_rows, cfg.repeats, cfg.seed)
    if 4 in on:
        _log("4. deletion vs retrain (exact ledger build first)")
        results["delete_vs_retrain"] = bench_delete_vs_retrain(
            cfg.retrain_n, cfg.retrain_d, cfg.c, cfg.retrain_repeats, cfg.seed,
            thread_settings=(1, None) if cfg.threads is not None else (None,))
    with _Threads(cfg.threads):
        if 5 in on:
            _log("5. drift study")
            results["drift"] = drift_study(cfg.drift_d, cfg.c, cfg.drift_bulk, cfg.drift_batch,
                                           cfg.drift_delete_chunk, cfg.drift_retained, cfg.drift_churn, cfg.seed,
                                           cfg.drift_f32)
        if 6 in on:
            _log("6. SMW drift")
            results["smw_drift"] = [smw_drift(cfg.smw_d, cfg.c, cfg.smw_n0, cfg.smw_events, cfg.smw_checkpoints,
                                              cfg.seed, gamma=g) for g in cfg.smw_gammas]
        if 7 in on:
            _log("7. exact update kernel")
            results["kernel"] = bench_kernel(cfg.kernel_d, cfg.c, cfg.kernel_rows, cfg.kernel_ranks,
                                             cfg.kernel_repeats, cfg.seed)
        if 8 in on:
            _log("8. fast head: SMW vs Cholesky factor")
            results["fast_heads"] = bench_fast_heads(cfg.head_d, cfg.c, cfg.head_ranks, cfg.ledger_rows,
                                                     cfg.head_repeats, cfg.seed)
    results["loadavg_end"] = list(os.getloadavg())
    results["wall_s"] = time.perf_counter() - t0
    return results


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.ledger_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller n, fewer repeats (about 3 minutes on 2 cores)")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # smoke test sizes
    ap.add_argument("--json", metavar="PATH", help="also write all numbers (raw samples included) as JSON")
    ap.add_argument("--threads", default="1",
                    help="BLAS threads for the timing sections: a number or 'all' (default 1)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--sections", default=None, help="comma-separated section numbers to run (default: all)")
    args = ap.parse_args(argv)
    cfg = TINY if args.tiny else QUICK if args.quick else FULL
    cfg = replace(cfg, threads=None if args.threads == "all" else int(args.threads))
    if args.seed is not None:
        cfg = replace(cfg, seed=args.seed)
    if args.sections:
        cfg = replace(cfg, sections=tuple(sorted({int(x) for x in args.sections.split(",")})))
    command = "python -m bench.ledger_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    results = run(cfg, command.strip())
    print(render(results), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=_json_default, allow_nan=True)
    return results


if __name__ == "__main__":
    main()
