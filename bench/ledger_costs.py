"""Ledger benchmark, the cost sections: what exactness costs per operation, side by side with
the float64 arithmetic it replaces (sections 0-4, 7 and 8 of bench/ledger_bench.py).

0. BLAS threading; 1. per-event update; 2. Variant A solve; 3. Variant B SMW update; 4. one
deletion vs a centralized retrain; 7. the exact update kernel vs float64 X^T X; 8. the fast
head's forms (SMW vs the Cholesky factor, per kernel).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.ledger_timing import (
    GAMMA,
    K_BASE,
    K_EXTRA,
    K_KERNEL,
    K_RETRAIN,
    K_UPD,
    QUANTIZER,
    Case,
    Synth,
    Threads,
    med,
    side_by_side,
)
from unlearn.ledger import (
    CholeskyTracker,
    ExactLedger,
    FloatLedger,
    SMWTracker,
    centralized_retrain,
    cholesky_tracker,
    l2_normalize,
    one_hot,
    relative_deviation,
    solve_head,
)


# ------------------------------------------------------------------------- 0. BLAS threading
def bench_blas_threads(d: int, repeats: int = 15) -> list[dict[str, Any]]:
    """A d x d matrix-vector product and a d x d x 10 GEMM with 1 BLAS thread vs all."""
    rng = np.random.default_rng(0)
    T = rng.standard_normal((d, d))
    u = rng.standard_normal((d, 1))
    G = rng.standard_normal((d, 10))
    rows = []
    for label, n in (("1", 1), ("all", None)):
        with Threads(n):
            res = side_by_side({"T@u": lambda: T @ u, "T@G": lambda: T @ G}, max(repeats, 3))
        rows.append({"threads": label, "d": d, "matvec_us": med(res, "T@u") * 1e6,
                     "gemm_d_d_10_us": med(res, "T@G") * 1e6})
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
            te, tf = med(res, "exact"), med(res, "float64")
            rows.append({"d": d, "c": c, "r": r, "exact_us": te * 1e6, "float64_us": tf * 1e6,
                         "exact_us_per_row": te * 1e6 / r, "float64_us_per_row": tf * 1e6 / r,
                         "exact_over_float": te / tf, "quantize_us": med(res, "quantize") * 1e6,
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
        rows.append({"d": d, "c": c, "n": n_rows, **{f"{k}_ms": med(res, k) * 1e3 for k in res}, "repeats": repeats})
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
        t_solve = med(side_by_side({"solve": lambda: solve_head(ex, GAMMA)}, repeats), "solve")
        for r in ranks:
            U = F[:r]
            dG = U.T @ one_hot(y[:r], c)
            feasible: list[bool] = []
            res = side_by_side({
                "add": lambda: tracker.add(U, dG),
                "delete": lambda: feasible.append(tracker.delete(U, dG).feasible),
            }, repeats, alternate=False)
            ta, td = med(res, "add"), med(res, "delete")
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
        with Threads(th):
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
        medians = {k: med(res, k) for k in res}
        settings.append({
            "threads": "all" if th is None else th,
            "median_s": medians,
            "spread_s": {k: [res[k]["min_s"], res[k]["max_s"]] for k in res},
            "speedup_float64_over_A": medians["retrain_float64"] / medians["deletion_A"],
            "speedup_float64_over_B": medians["retrain_float64"] / medians["deletion_B"],
            "speedup_sklearn_over_A": medians["retrain_sklearn"] / medians["deletion_A"],
            "speedup_sklearn_over_B": medians["retrain_sklearn"] / medians["deletion_B"],
            "speedup_float64_over_B_factor": medians["retrain_float64"] / medians["deletion_B_factor"],
            "speedup_float64_over_B_with_digest":
                medians["retrain_float64"] / (medians["deletion_B"] + medians["digest"]),
        })
    return {"n_retained": n, "d": d, "c": c, "gamma": GAMMA, "repeats": repeats,
            "exact_ledger_build_s": build_exact_s, "sanity": sanity, "settings": settings}


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
    tg, ta, taf = med(res, "gemm"), med(res, "exact_add"), med(res, "exact_add_fold")
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
        small.append({"r": r, **{f"{k}_us": med(res, k) * 1e6 for k in res}, "repeats": repeats})
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
        row = {"r": r, **{f"{k}_us": med(res, k) * 1e6 for k in res},
               "add_smw_over_chol": med(res, "smw_add") / med(res, "chol_add"),
               "delete_smw_over_chol": med(res, "smw_delete") / med(res, "chol_delete")}
        if hyh is not None:
            row["add_smw_over_hyh"] = med(res, "smw_add") / med(res, "hyh_add")
            row["delete_smw_over_hyh"] = med(res, "smw_delete") / med(res, "hyh_delete")
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
            **{f"{k}_ms": med(res, k) * 1e3 for k in res}}


