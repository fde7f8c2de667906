"""What a delete behind an adds delta waits for in the ledger, with the fast head's factor updated
at once and with its rows waiting for idle time (``UNLEARN_FACTOR_HOLD_ROWS``, issue 29).

    python -m bench.factor_wait_bench [--d 768] [--rows 4000] [--delta 90] [--rounds 30] [--pairs 3]

Pure, no broker, one BLAS thread (the ledger's default). A head of ``--rows`` rows at d, then
rounds of what the ledger worker does under 1,000 adds/s: the fold of an adds delta of ``--delta``
rows (``TrackedHead.apply`` and ``sync``) with a delete of one held row behind it in the same poll
(its receipt waits for both: with a hold, the adds wait outside the factor), the idle work until
none is left (the exact products and the factor's waiting rows, in steps of 64 rows as the worker
takes them), an adds delta alone (nothing waits for it: the factor takes it at once either way)
and its idle work. The hold sizes alternate in ``--pairs`` pairs; medians in ms. Also the whole
stream with no idle time (a worker at full rate), per row. Asserts nothing; the heads are
compared with solve_head at the end.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from unlearn.ledger import ExactLedger, Quantizer, TrackedHead, l2_normalize, relative_deviation, solve_head
from unlearn.ledger.solve import single_threaded_blas

IDLE_STEP = 64  # the worker's IDLE_STEP_ROWS


def _rows(rng: np.random.Generator, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, 10, n)
    F = rng.normal(size=(10, d))[y] + rng.normal(size=(n, d)) * 0.5
    return Quantizer().quantize(l2_normalize(F)), y


def _head(d: int, n: int, hold: int, seed: int) -> tuple[TrackedHead, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Q, y = _rows(rng, n, d)
    ledger = ExactLedger(d, 100)  # an auto-created head's 100 columns, 10 of them with data
    ledger.hold_rows = 256  # the worker's product hold
    head = TrackedHead(ledger, 1.0, reset_every=10**9, drift_threshold=np.inf, drift_check_every=10**9,
                       factor_hold_rows=hold)
    head.apply(Q, y, +1)
    head.sync()
    return head, Q, y


def _idle(head: TrackedHead) -> float:
    t = time.perf_counter()
    while True:
        products = head.ledger.products  # one kind per step, as HeadRuntime.idle_work
        done = 0 if products is None else products.multiply_some(IDLE_STEP)
        if done == 0:
            done = head.fold_waiting(IDLE_STEP)
        if done == 0:
            return time.perf_counter() - t


def rounds(d: int, n: int, delta: int, count: int, hold: int) -> dict[str, list[float]]:
    """``count`` rounds of: an adds delta with a delete behind it in the same poll, idle work, an
    adds delta alone, idle work; seconds of each step."""
    head, _, _ = _head(d, n, hold, 1)
    Q, y = _rows(np.random.default_rng(2), 2 * delta * count, d)
    out: dict[str, list[float]] = {"behind": [], "alone": [], "idle": []}
    for i in range(count):
        j = 2 * i * delta
        t0 = time.perf_counter()
        head.apply(Q[j:j + delta], y[j:j + delta], +1)
        head.apply(Q[j:j + 1], y[j:j + 1], -1)  # the delete's receipt waits for this whole sync
        head.sync()
        out["behind"].append(time.perf_counter() - t0)
        out["idle"].append(_idle(head))
        t0 = time.perf_counter()
        head.apply(Q[j + delta:j + 2 * delta], y[j + delta:j + 2 * delta], +1)
        head.sync()
        out["alone"].append(time.perf_counter() - t0)
        _idle(head)
    out["deviation"] = [relative_deviation(head.weights, solve_head(head.ledger, 1.0))]
    return out


def full_rate(d: int, n: int, delta: int, count: int, hold: int) -> float:
    """Seconds per row of ``count`` adds deltas with no idle time between them."""
    head, _, _ = _head(d, n, hold, 1)
    Q, y = _rows(np.random.default_rng(3), delta * count, d)
    t = time.perf_counter()
    for i in range(count):
        head.apply(Q[i * delta:(i + 1) * delta], y[i * delta:(i + 1) * delta], +1)
        head.sync()
    return (time.perf_counter() - t) / (delta * count)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--delta", type=int, default=90)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--holds", default="0,256")
    a = ap.parse_args(argv)
    holds = [int(h) for h in a.holds.split(",")]
    res: dict[int, dict[str, list[float]]] = {h: {"behind": [], "alone": [], "idle": [], "full": [],
                                                  "deviation": []} for h in holds}
    with single_threaded_blas():
        for _ in range(a.pairs):
            for h in holds:
                for k, v in rounds(a.d, a.rows, a.delta, a.rounds, h).items():
                    res[h][k].extend(v)
                res[h]["full"].append(full_rate(a.d, a.rows, a.delta, a.rounds, h))
    print(f"d={a.d}, head of {a.rows} rows, adds deltas of {a.delta} rows, {a.rounds} rounds x {a.pairs} "
          f"pairs, one BLAS thread; medians, ms")
    print(f"{'factor hold':>12} {'adds + delete':>14} {'adds alone':>11} {'idle work':>10} "
          f"{'full rate us/row':>17} {'max deviation':>14}")
    for h in holds:
        r = res[h]
        print(f"{h:>12} {statistics.median(r['behind']) * 1e3:>14.2f} {statistics.median(r['alone']) * 1e3:>11.2f} "
              f"{statistics.median(r['idle']) * 1e3:>10.2f} {statistics.median(r['full']) * 1e6:>17.1f} "
              f"{max(r['deviation']):>14.2e}")


if __name__ == "__main__":
    main()
