"""Ledger benchmark, the shared machinery: what every section measures with and on.

The machine description (the numbers depend on it), the synthetic features (a pure function of
their key, so long streams regenerate rows instead of holding them), side-by-side timing (load
changes on a shared machine hit every case alike) and the BLAS thread limit.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from unlearn.ledger import Quantizer, l2_normalize

# The ridge gamma of every section (section 6 adds others) and the featurizer's quantizer (k = 30).
GAMMA = 1.0
QUANTIZER = Quantizer(frac_bits=30)


def log(msg: str) -> None:
    """Progress on stderr, so that stdout stays the report."""
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


class Threads:
    """threadpoolctl limit (None = leave the library default)."""

    def __init__(self, n: int | None) -> None:
        self.n = n
        self._ctx: Any = None

    def __enter__(self) -> Threads:
        if self.n is not None:
            from threadpoolctl import threadpool_limits
            self._ctx = threadpool_limits(limits=self.n)
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def med(res: dict[str, dict[str, Any]], k: str) -> float:
    """The median of case ``k`` of a side_by_side result: the number every table reports."""
    return float(res[k]["median_s"])
