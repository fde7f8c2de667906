"""Ledger benchmark, the drift studies: what exactness buys (sections 5 and 6 of
bench/ledger_bench.py).

5. float64 / float32 ledgers vs the exact ledger over a long add/churn/delete stream, against a
from-scratch retrain on what is retained, plus digest equality; 6. Variant B drift: TrackedHead
with and without resets on a rank-1 churn stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.ledger_timing import GAMMA, K_BULK, K_CHURN, K_R, K_SMW, K_SMW0, Synth, log
from unlearn.ledger import (
    ExactLedger,
    FloatLedger,
    LedgerError,
    TrackedHead,
    relative_deviation,
    solve_head,
)


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
        log(f"drift checkpoint {name}: n={row['n_retained']} f64 dev={row['float64_dev']:.3g} "
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
            log(f"smw drift gamma={gamma} @{e}: " + ", ".join(f"{k}: {rec[k]['dev']:.3g}" for k in heads))
    return {"d": d, "c": c, "gamma": gamma, "n0": n0, "n_events": n_events,
            "policies": {k: (v if set(v) - {"tracker"} else
                             f"TrackedHead defaults (reset_every=1000, drift_threshold=1e-9, drift_check_every=64), "
                             f"tracker={v.get('tracker', 'default')}")
                         for k, v in policies.items()},
            "total_s": time.perf_counter() - t0, "checkpoints": out}


