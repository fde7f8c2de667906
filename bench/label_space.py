"""What an unused label space costs a head: the same rows (labels 0..2) under c = 4 and c = 100
columns (UNLEARN_DEFAULT_CLASSES, the auto contract's class count), at the serving dimension.

Prints, per c: the rank-1 add to the exact ledger plus the fast head (median of repeats), the
canonical reset, the fast head update's size and encode time, and the ledger snapshot's size.
docs/registry.md ("Why the auto label space does not follow the labels seen") quotes it.

    python -m bench.label_space [--d 768] [--cs 4,100] [--adds 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from unlearn.ledger import ExactLedger, Quantizer, TrackedHead, l2_normalize
from unlearn.schemas.head import HeadUpdate, encode_head


def measure(d: int, c: int, adds: int, seed: int = 0) -> dict[str, Any]:
    """Costs of one head of d features and c columns holding 1000 rows of labels 0..2."""
    rng = np.random.default_rng(seed)
    n0 = 1000
    Q = Quantizer().quantize(l2_normalize(rng.normal(size=(n0 + adds, d))))
    y = rng.integers(0, 3, n0 + adds)
    led = ExactLedger(d, c)
    led.add(Q[:n0], y[:n0])
    head = TrackedHead(led, 1.0, reset_every=10**9, drift_threshold=1.0)
    times = []
    for i in range(n0, n0 + adds):
        t = time.perf_counter()
        head.add(Q[i:i + 1], y[i:i + 1])
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    head.reset("bench")
    reset = time.perf_counter() - t
    update = HeadUpdate("h", 1, "fast", None, led.count, led.count, ((0, 1),), 0.0, 1.0, time.time(), head.weights)
    t = time.perf_counter()
    raw = encode_head(update)
    encode = time.perf_counter() - t
    return {"d": d, "c": c, "add_ms": 1e3 * statistics.median(times), "reset_ms": 1e3 * reset,
            "update_kb": len(raw) / 1e3, "encode_ms": 1e3 * encode, "snapshot_mb": len(led.to_bytes()) / 1e6}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--cs", default="4,100", help="column counts to compare")
    ap.add_argument("--adds", type=int, default=200, help="rank-1 adds timed per column count")
    args = ap.parse_args(argv)
    for c in (int(x) for x in args.cs.split(",")):
        r = measure(args.d, c, args.adds)
        print(f"d={r['d']} c={r['c']:>4}: rank-1 add (ledger + fast head) {r['add_ms']:.2f} ms, reset "
              f"{r['reset_ms']:.1f} ms, fast head update {r['update_kb']:.0f} KB (encode {r['encode_ms']:.2f} ms), "
              f"ledger snapshot {r['snapshot_mb']:.2f} MB")


if __name__ == "__main__":
    main()
