"""Reproduce the seeds' experiments on offline data: ``python -m research.paper [--quick] [--json]``.

Writes markdown tables and PNG plots to ``bench/results/`` (``paper.md`` / ``paper-quick.md`` and
``paper[-quick]_*.png``); with ``--json`` it also writes one record per (experiment, strategy) with
every metric to ``paper[-quick].jsonl`` and prints them to stdout (progress goes to stderr).
``--quick`` runs every strategy through every experiment at reduced size (minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .paper_data import DataUnavailable, load_paper_data
from .paper_experiments import EXPERIMENTS, PaperConfig
from .paper_report import markdown_report, plots

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _jsonable(x: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, NaN to null, +-inf to strings."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        v = float(x)
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    return x


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m research.paper", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="reduced sizes; every strategy, every experiment")
    p.add_argument("--json", action="store_true", help="print and write one JSON record per (experiment, strategy)")
    p.add_argument("--dataset", default="auto", help="auto | fashion-mnist | digits | tweets (default: auto)")
    p.add_argument("--n-train", type=int, default=None, help="training samples (quick 1200, full 20000)")
    p.add_argument("--n-test", type=int, default=None, help="test samples (quick 400, full 4000)")
    p.add_argument("--mia-max", type=int, default=None,
                   help="members and non-members per MIA attack training set (quick 400, full 2000)")
    p.add_argument("--experiments", default="ridge,acu,safe,hfkcu", help="comma-separated subset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="output directory (default bench/results)")
    p.add_argument("--cache-dir", type=Path, default=None, help="feature cache (default $UNLEARN_FEATURE_CACHE)")
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS/torch threads (default 1: the strategies' small matrix loops are fastest, and "
                        "their timings most comparable, single-threaded on a shared 2-core box)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(max(1, args.threads))
    with threadpool_limits(limits=max(1, args.threads)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    exps = tuple(e.strip() for e in args.experiments.split(",") if e.strip())
    unknown = [e for e in exps if e not in EXPERIMENTS]
    if unknown:
        print(f"unknown experiment(s) {unknown}; known: {', '.join(EXPERIMENTS)}", file=sys.stderr)
        return 2
    kw: dict[str, Any] = {"dataset": args.dataset, "seed": args.seed, "experiments": exps}
    if args.n_train is not None:
        kw["n_train"] = args.n_train
    if args.n_test is not None:
        kw["n_test"] = args.n_test
    if args.mia_max is not None:
        kw["mia_max_per_class"] = args.mia_max
    cfg = PaperConfig.quick_preset(**kw) if args.quick else PaperConfig.full(**kw)
    try:
        data = load_paper_data(cfg.dataset, cfg.n_train, cfg.n_test, args.cache_dir, cfg.seed, log=log)
    except DataUnavailable as exc:
        print(f"cannot load data: {exc}", file=sys.stderr)
        return 1
    log(f"data: {data.name}, train {data.F_train.shape}, test {data.F_test.shape}, {data.n_classes} classes")

    records: list[dict[str, Any]] = []
    for name in exps:
        t0 = time.perf_counter()
        recs = EXPERIMENTS[name](cfg, data, log)
        log(f"experiment {name}: {len(recs)} records in {time.perf_counter() - t0:.1f}s")
        records += recs

    wall = time.perf_counter() - t_start
    args.out.mkdir(parents=True, exist_ok=True)
    prefix = "paper-quick" if cfg.quick else "paper"
    header = (f"# Seed experiments on offline data ({'quick' if cfg.quick else 'full'} preset)\n\n"
              f"Dataset: {data.name}, {data.F_train.shape[0]} train / {data.F_test.shape[0]} test samples, "
              f"d = {data.dim} (L2-normalized + intercept, on the 2^-30 grid), {data.n_classes} classes. "
              f"Seed {cfg.seed}. Wall time {wall:.0f} s on {platform.machine()} with {args.threads} BLAS thread(s) "
              f"({platform.python_implementation()} {platform.python_version()}). "
              "Generated by `python -m research.paper" + (" --quick" if cfg.quick else "") + "`; "
              "methods and deviations from the papers: docs/strategies.md.")
    if data.notes:
        header += "\n\n" + "\n".join(f"> note: {n}" for n in data.notes)
    md = markdown_report(records, header)
    (args.out / f"{prefix}.md").write_text(md)
    figs = plots(records, args.out, f"{prefix}_")
    if args.json:
        lines = [json.dumps(_jsonable({**r, "config": cfg.as_dict()}), sort_keys=True) for r in records]
        (args.out / f"{prefix}.jsonl").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    else:
        print(md)
    log(f"wrote {args.out / (prefix + '.md')} and {len(figs)} figures; total {wall:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
