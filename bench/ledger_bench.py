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

This module is the CLI (configurations, run, JSON). The sections live by concept: the costs
(0-4, 7, 8) in bench/ledger_costs.py, the drift studies (5, 6) in bench/ledger_drift.py, the
shared timing machinery (machine info, Synth, side_by_side, BLAS threads) in bench/ledger_timing.py,
the markdown report in bench/ledger_report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from bench.ledger_costs import (
    bench_blas_threads,
    bench_delete_vs_retrain,
    bench_fast_heads,
    bench_kernel,
    bench_smw,
    bench_solve,
    bench_updates,
)
from bench.ledger_drift import drift_study, smw_drift
from bench.ledger_report import render
from bench.ledger_timing import Threads, log, machine_info


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


# ------------------------------------------------------------------------------------ main
def run(cfg: Config, command: str = "") -> dict[str, Any]:
    t0 = time.perf_counter()
    results: dict[str, Any] = {"config": asdict(cfg), "command": command,
                               "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                               "machine": machine_info(cfg.threads)}
    log(f"config {cfg.name}: BLAS threads {cfg.threads}, sections {cfg.sections}")
    results["blas_threads"] = bench_blas_threads(cfg.blas_probe_d)
    on = set(cfg.sections)
    with Threads(cfg.threads):
        if 1 in on:
            log("1. update cost")
            results["updates"] = bench_updates(cfg.dims, cfg.c, cfg.ranks, cfg.repeats, cfg.seed)
        if 2 in on:
            log("2. Variant A solve")
            results["solve"] = bench_solve(cfg.dims, cfg.c, cfg.ledger_rows, cfg.repeats, cfg.seed)
        if 3 in on:
            log("3. Variant B update")
            results["smw"] = bench_smw(cfg.dims, cfg.c, cfg.smw_ranks, cfg.ledger_rows, cfg.repeats, cfg.seed)
    if 4 in on:
        log("4. deletion vs retrain (exact ledger build first)")
        results["delete_vs_retrain"] = bench_delete_vs_retrain(
            cfg.retrain_n, cfg.retrain_d, cfg.c, cfg.retrain_repeats, cfg.seed,
            thread_settings=(1, None) if cfg.threads is not None else (None,))
    with Threads(cfg.threads):
        if 5 in on:
            log("5. drift study")
            results["drift"] = drift_study(cfg.drift_d, cfg.c, cfg.drift_bulk, cfg.drift_batch,
                                           cfg.drift_delete_chunk, cfg.drift_retained, cfg.drift_churn, cfg.seed,
                                           cfg.drift_f32)
        if 6 in on:
            log("6. SMW drift")
            results["smw_drift"] = [smw_drift(cfg.smw_d, cfg.c, cfg.smw_n0, cfg.smw_events, cfg.smw_checkpoints,
                                              cfg.seed, gamma=g) for g in cfg.smw_gammas]
        if 7 in on:
            log("7. exact update kernel")
            results["kernel"] = bench_kernel(cfg.kernel_d, cfg.c, cfg.kernel_rows, cfg.kernel_ranks,
                                             cfg.kernel_repeats, cfg.seed)
        if 8 in on:
            log("8. fast head: SMW vs Cholesky factor")
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
