"""Markdown tables and PNG plots from the experiment records (the only place that draws)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def fmt(x: Any, digits: int = 4) -> str:
    """Compact number formatting for tables: n/a for None, scientific for tiny values."""
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        v = float(x)
        if math.isnan(v):
            return "-"
        if math.isinf(v):
            return "inf"
        if v == 0.0:
            return "0"
        if abs(v) < 1e-3 or abs(v) >= 1e5:
            return f"{v:.2e}"
        return f"{v:.{digits}g}"
    return str(x)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _by(records: Sequence[Mapping[str, Any]], experiment: str) -> list[Mapping[str, Any]]:
    return [r for r in records if r.get("experiment") == experiment]


def _step(rec: Mapping[str, Any], step: int) -> Mapping[str, Any] | None:
    for s in rec.get("steps", []):
        if s.get("step") == step:
            return s
    return None


def _status(rec: Mapping[str, Any]) -> str:
    st = rec.get("status", "ok")
    return "" if st == "ok" else f" ({st})"


def ridge_tables(records: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    t3 = _by(records, "ridge.table3")
    if t3:
        rows: list[list[Any]] = [[r["strategy"], r["family"], (_step(r, 0) or {}).get("ta"), r.get("fit_seconds"),
                                  (_step(r, 0) or {}).get("head_bit_identical")] for r in t3]
        parts.append(f"### Table 3: test accuracy after the initial fit ({t3[0].get('clients')} clients)\n\n"
                     "The softmax unlearning methods start from the retrain-softmax model (their fit time "
                     "excludes that training); exact-b's fast head after the per-client SMW fit is within "
                     "rounding of, not bit-identical to, the canonical head until its first reset.\n\n"
                     + table(["strategy", "family", "test acc", "fit (s)", "head bit-identical to from-scratch"], rows))
    t4 = _by(records, "ridge.table4")
    if t4:
        ks = list(t4[0]["deviation_by_clients"].keys())
        rows = [[r["strategy"]] + [r["deviation_by_clients"][k] for k in ks]
                + [r.get("ledger_identical_across_clients"), r.get("reference")] for r in t4]
        parts.append("### Table 4: relative deviation ||W - W_c|| / ||W_c|| after a federated fit with K clients\n\n"
                     + table(["strategy"] + [f"K={k}" for k in ks] + ["ledger identical across K", "reference"], rows))
    t5 = _by(records, "ridge.table5")
    if t5:
        ev = t5[0]["eval_steps"]
        m = t5[0]["single_deletions"]
        rows = []
        for r in t5:
            devs = [(_step(r, e) or {}).get("param_gap") if _step(r, e) else None for e in ev]
            last = _step(r, ev[-1]) or {}
            ms = r.get("mean_request_seconds")
            rows.append([r["strategy"] + _status(r), *devs, None if ms is None else 1e3 * ms,
                         last.get("ledger_bit_identical")])
        hdr = ["strategy", *(f"after {e} deletions" if e <= m else f"after {e - m} add-backs" for e in ev)]
        parts.append(f"### Table 5: deviation from the retrained model, {m} single deletions then add-back\n\n"
                     "Deviation is the parameter gap to the retrain of the strategy's own family (ridge: "
                     "scikit-learn central ridge; softmax: L-BFGS/FedAvg retrain). Retrain strategies are "
                     "evaluated lazily (retrained only at the evaluation steps; their per-request time is that "
                     "retrain's time).\n\n"
                     + table([*hdr, "mean ms / request", "ledger bit-identical at end"], rows))
    f2 = _by(records, "ridge.figure2")
    if f2:
        n_steps = max(len(r["steps"]) for r in f2)
        rows = []
        for r in f2:
            ta = [s.get("ta") for s in r["steps"]] + [None] * (n_steps - len(r["steps"]))
            rows.append([r["strategy"] + _status(r), *ta, r.get("cum_seconds")])
        parts.append("### Figure 2 (table): test accuracy after each chunked deletion of "
                     f"{f2[0].get('chunk_fraction', 0.2):.0%} of the data, and cumulative unlearning time\n\n"
                     + table(["strategy", *(f"step {i}" for i in range(n_steps)), "cum. time (s)"], rows))
    return "\n\n".join(parts)


def _final_metrics_rows(recs: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    rows = []
    for r in recs:
        f = r.get("final") or {}
        rows.append([r["strategy"] + _status(r), "no" if r.get("uses_retained_data") else "yes", r.get("exactness"),
                     f.get("ra_gap"), f.get("fa_gap"), f.get("ta_gap"), f.get("mia_gap"), f.get("param_gap"),
                     f.get("kl_test"), r.get("cum_seconds"), r.get("speedup_over_retrain")])
    return rows


METRIC_HDR = ["strategy", "no retained data", "exactness", "dRA", "dFA", "dTA", "dMIA", "param gap", "KL(test)",
              "cum. time (s)", "speedup"]


def acu_tables(records: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for exp in sorted({r["experiment"] for r in records if r["experiment"].startswith("acu.")},
                      key=lambda e: int(e.removeprefix("acu.requests"))):
        recs = _by(records, exp)
        R, pool = recs[0]["requests"], recs[0]["pool"]
        parts.append(f"### ACU protocol: {pool} samples forgotten in {R} sequential requests (gaps after the last)\n\n"
                     "Gaps are absolute differences to the retrain of the strategy's own family; "
                     "\"no retained data\" = the method never touches retained samples when unlearning; "
                     "speedup = cumulative retrain time / cumulative unlearning time over the requests.\n\n"
                     + table(METRIC_HDR, _final_metrics_rows(recs)))
    return "\n\n".join(parts)


def safe_tables(records: Sequence[Mapping[str, Any]]) -> str:
    recs = _by(records, "safe.random_subsets")
    if not recs:
        return ""
    rows = []
    for r in recs:
        mo = r.get("mean_over_steps") or {}
        rows.append([r["strategy"] + _status(r), mo.get("ra"), mo.get("fa"), mo.get("ta"), mo.get("mia"),
                     mo.get("ra_retrain"), mo.get("fa_retrain"), mo.get("ta_retrain"), mo.get("mia_retrain"),
                     r.get("mean_request_seconds"), r.get("speedup_over_retrain")])
    return (f"### SAFE protocol: {recs[0]['rounds']} rounds of {recs[0]['per_round']} random deletions "
            "(means over rounds)\n\n"
            "MIA = fraction of forgotten samples an RBF-SVC attack (trained on retained vs test outputs) "
            "calls members; \"retrain\" columns are the strategy's own-family retrain.\n\n"
            + table(["strategy", "RA", "FA", "TA", "MIA", "RA retrain", "FA retrain", "TA retrain", "MIA retrain",
                     "s / request", "speedup"], rows))


def hfkcu_tables(records: Sequence[Mapping[str, Any]]) -> str:
    recs = _by(records, "hfkcu.remove_client")
    if not recs:
        return ""
    rows = []
    for r in recs:
        f = r.get("final") or {}
        rows.append([r["strategy"] + _status(r), r.get("acc_trained"), f.get("ta"), f.get("ta_retrain"), r.get("cf"),
                     f.get("mia"), f.get("mia_retrain"), f.get("param_gap"), f.get("kl_test"), f.get("seconds"),
                     f.get("speedup")])
    return (f"### HF-KCU protocol: {recs[0]['clients']} Dirichlet clients, client 0 ({recs[0]['removed']} samples) "
            "removed\n\n"
            "Softmax strategies start from the FedAvg model; their retrain is FedAvg without client 0. "
            "Speedup = retrain time / unlearning time.\n\n"
            + table(["strategy", "acc before", "acc after", "acc retrain", "CF", "MIA", "MIA retrain", "param gap",
                     "KL(test)", "time (s)", "speedup"], rows))


def markdown_report(records: Sequence[Mapping[str, Any]], header: str) -> str:
    sections = [header]
    for title, fn in (("1. Exact federated continual unlearning (ridge paper)", ridge_tables),
                      ("2. ACU protocol", acu_tables), ("3. SAFE protocol", safe_tables),
                      ("4. HF-KCU protocol", hfkcu_tables)):
        body = fn(records)
        if body:
            sections.append(f"## {title}\n\n{body}")
    return "\n\n".join(sections) + "\n"


# ------------------------------------------------------------------------------------------ plots
def _style(rec: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Distinct colour per strategy; solid lines for ridge heads, dashed for softmax heads."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return {"color": cmap(i % 20), "linestyle": "-" if rec.get("family") == "ridge" else "--",
            "marker": "o", "ms": 3, "label": rec["strategy"]}


def _int_locator() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _plot_lines(ax: Any, recs: Sequence[Mapping[str, Any]], key: str, x_key: str = "step") -> None:
    for i, r in enumerate(recs):
        pts = [(s[x_key], s.get(key)) for s in r.get("steps", []) if s.get(key) is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, **_style(r, i))
    ax.xaxis.set_major_locator(_int_locator())


def plots(records: Sequence[Mapping[str, Any]], out_dir: Path, prefix: str) -> list[Path]:
    """Write the figures; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        p = out_dir / f"{prefix}{name}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)

    f2 = _by(records, "ridge.figure2")
    if f2:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
        _plot_lines(a1, f2, "ta")
        a1.set(xlabel="deletion step (20% of the data each)", ylabel="test accuracy",
               title="Chunked deletions: accuracy")
        for i, r in enumerate(f2):
            cum = np.cumsum([t if t is not None else np.nan for t in _request_times(r)])
            a2.plot(range(1, len(cum) + 1), cum, **_style(r, i))
        a2.xaxis.set_major_locator(_int_locator())
        a2.set(xlabel="deletion step", ylabel="cumulative unlearning time (s)", yscale="log",
               title="Chunked deletions: cumulative time")
        a2.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
        save(fig, "figure2_chunked")
    t5 = _by(records, "ridge.table5")
    if t5:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        m = t5[0]["single_deletions"]
        for i, r in enumerate(t5):
            ts = _request_times(r)[:m]
            xs = [j + 1 for j, t in enumerate(ts) if t is not None]
            ys = [t for t in ts if t is not None]
            if ys:
                ax.plot(xs, ys, **{**_style(r, i), "marker": ".", "lw": 0.8})
        ax.xaxis.set_major_locator(_int_locator())
        ax.set(xlabel="single-point deletion request", ylabel="wall time (s)", yscale="log",
               title=f"{m} single deletions: time per request")
        ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
        save(fig, "table5_request_times")
    acu = sorted({r["experiment"] for r in records if r["experiment"].startswith("acu.")},
                 key=lambda e: int(e.removeprefix("acu.requests")))
    if acu:
        recs = _by(records, acu[-1])
        fig, axs = plt.subplots(1, 3, figsize=(15, 4.5))
        _plot_lines(axs[0], recs, "ra")
        axs[0].set(xlabel="request", ylabel="retained-set accuracy", title=f"{acu[-1]}: RA")
        _plot_lines(axs[1], recs, "ta")
        axs[1].set(xlabel="request", ylabel="test accuracy", title=f"{acu[-1]}: TA")
        _plot_lines(axs[2], recs, "cum_seconds")
        axs[2].set(xlabel="request", ylabel="cumulative time (s)", yscale="log", title=f"{acu[-1]}: cumulative time")
        axs[2].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
        save(fig, "acu_dynamics")
    safe = _by(records, "safe.random_subsets")
    if safe:
        fig, axs = plt.subplots(1, 2, figsize=(12, 4.5))
        _plot_lines(axs[0], safe, "ta")
        axs[0].set(xlabel="round", ylabel="test accuracy", title="SAFE protocol: TA per round")
        _plot_lines(axs[1], safe, "mia_gap")
        axs[1].set(xlabel="round", ylabel="|MIA - MIA retrain|", title="SAFE protocol: MIA gap")
        axs[1].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
        save(fig, "safe_rounds")
    return written


def _request_times(rec: Mapping[str, Any]) -> list[float | None]:
    return list(rec.get("request_seconds", []))
