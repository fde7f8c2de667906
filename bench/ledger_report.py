"""Ledger benchmark, the report: the markdown that bench/ledger_bench.py prints, made from the
results dict alone (what its JSON holds), so that measuring and presenting change apart.
"""

from __future__ import annotations

import math
from typing import Any

from bench.ledger_timing import GAMMA


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
    """The report of a run() result: the machine, then one table per section that ran."""
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

