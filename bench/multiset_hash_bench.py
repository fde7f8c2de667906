"""Multiset hash benchmark: what a receipt commitment costs per event (docs/design.md section 6).

Prints (never asserts) medians of repeated timings, at each d (default 768), c = 10:

- the multiset hash per row: ``MultisetHash.add`` of one row, and per row in a batch of 256
  (one SHAKE-128 call per row, then a numpy sum), plus the 32-byte fingerprint of the state;
- the SHA-256 ledger digest (``ExactLedger.digest``, O(d^2)) of a ledger just changed by one row,
  which is what a per-event receipt costs today;
- ``ExactLedger.add`` of one row, for scale.

BLAS runs with one thread, as in the ledger worker.

    python -m bench.multiset_hash_bench [--dims 768,...] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from unlearn.ledger import ExactLedger, MultisetHash, Quantizer, l2_normalize


def _median_s(fn: Callable[[], object], repeats: int, setup: Callable[[], object] | None = None) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs (``setup`` runs untimed before each)."""
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(d: int, c: int, repeats: int, seed: int = 0) -> dict[str, float]:
    """Microseconds per operation at dimension ``d`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    Q = Quantizer().quantize(l2_normalize(rng.normal(size=(1024, d))))
    y = rng.integers(0, c, len(Q))
    led = ExactLedger.from_rows(Q[:512], y[:512], n_outputs=c)
    mset = MultisetHash.of_rows(Q[:512], y[:512])
    row, lab = Q[512:513], y[512:513]
    batch, blab = Q[512:768], y[512:768]
    state = {"i": 0}

    def touch() -> None:  # a one-row change, so the digest is recomputed, not cached
        i = state["i"] = (state["i"] + 1) % 256
        led.add(Q[768 + i:769 + i], y[768 + i:769 + i])

    return {
        "mset_row_us": 1e6 * _median_s(lambda: mset.add(row, lab), repeats),
        "mset_batch256_per_row_us": 1e6 * _median_s(lambda: mset.add(batch, blab), max(3, repeats // 10)) / 256,
        "fingerprint_us": 1e6 * _median_s(mset.fingerprint, repeats),
        "ledger_digest_us": 1e6 * _median_s(led.digest, max(3, repeats // 10), setup=touch),
        "ledger_add_row_us": 1e6 * _median_s(lambda: led.add(row, lab), repeats),
    }


def render(d: int, r: dict[str, float]) -> str:
    per_event = r["mset_row_us"] + r["fingerprint_us"]
    return "\n".join([
        f"d = {d}, c = 10 (median microseconds)",
        f"  multiset hash, add 1 row            {r['mset_row_us']:10.1f}",
        f"  multiset hash, per row of 256       {r['mset_batch256_per_row_us']:10.1f}",
        f"  fingerprint (SHA-256 of 4 KiB)      {r['fingerprint_us']:10.1f}",
        f"  SHA-256 ledger digest               {r['ledger_digest_us']:10.1f}",
        f"  ExactLedger.add 1 row (for scale)   {r['ledger_add_row_us']:10.1f}",
        f"  per-event commitment: multiset hash + fingerprint {per_event:.1f} us vs digest "
        f"{r['ledger_digest_us']:.1f} us ({r['ledger_digest_us'] / per_event:.0f}x)",
    ])


def main(argv: list[str] | None = None) -> dict[int, dict[str, float]]:
    ap = argparse.ArgumentParser(prog="python -m bench.multiset_hash_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="768", help="comma-separated feature dimensions (default 768)")
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")  # as the ledger worker runs (UNLEARN_LEDGER_BLAS_THREADS)
    print(f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, "
          f"numpy {np.__version__}")
    out = {}
    for d in (int(x) for x in args.dims.split(",")):
        out[d] = measure(d, 10, args.repeats)
        print(render(d, out[d]), flush=True)
    return out


if __name__ == "__main__":
    main()
