"""Smoke test of bench/ledger_bench.py (and its ledger_timing, ledger_costs, ledger_drift and
ledger_report modules) at tiny sizes: every section runs and reports well-formed numbers. No timing
assertions (timings are only printed by the bench)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.ledger_bench import main
from bench.ledger_costs import bench_delete_vs_retrain, bench_smw, bench_solve, bench_updates
from bench.ledger_drift import SMW_POLICIES, drift_study, smw_drift
from bench.ledger_timing import Synth, side_by_side


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """As the bench does: on a shared 2-core machine multi-threaded BLAS calls can stall for ms."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


def _finite_positive(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_synth_is_deterministic_and_on_the_grid() -> None:
    syn = Synth(12, 3, seed=1)
    Q1, y1, F1 = syn.batch((5, 7), 20)
    Q2, y2, F2 = syn.batch((5, 7), 20)
    assert np.array_equal(Q1, Q2) and np.array_equal(y1, y2) and np.array_equal(F1, F2)
    assert Q1.dtype == np.int64 and Q1.shape == (20, 12)
    assert np.abs(Q1).max() <= 1 << 30
    assert np.array_equal(F1, Q1 / float(1 << 30))  # float ledgers see exactly the quantized model
    assert not np.array_equal(Q1, syn.batch((5, 8), 20)[0])


def test_side_by_side_runs_cleanup_untimed() -> None:
    state = {"n": 0}

    def add() -> None:
        state["n"] += 1

    def undo() -> None:
        state["n"] -= 1

    res = side_by_side({"a": (add, undo), "b": lambda: None}, repeats=3)
    assert state["n"] == 0
    assert set(res) == {"a", "b"}
    assert len(res["a"]["samples_s"]) == 3 and res["a"]["min_s"] <= res["a"]["median_s"] <= res["a"]["max_s"]


def test_update_solve_smw_sections() -> None:
    up = bench_updates((16,), 3, (1, 8), repeats=2, seed=0)
    assert [(r["d"], r["r"]) for r in up] == [(16, 1), (16, 8)]
    for r in up:
        assert _finite_positive(r["exact_us"]) and _finite_positive(r["float64_us"])
        assert r["exact_us_per_row"] == pytest.approx(r["exact_us"] / r["r"])
        assert r["exact_over_float"] == pytest.approx(r["exact_us"] / r["float64_us"])
    (sv,) = bench_solve((16,), 3, 40, repeats=2, seed=0)
    for k in ("solve_exact_ms", "solve_float64_ms", "gram_moments_ms", "cholesky_ms", "digest_ms", "smw_reset_ms"):
        assert _finite_positive(sv[k])
    sm = bench_smw((16,), 3, (1, 4), 40, repeats=2, seed=0)
    assert all(r["all_deletes_feasible"] and _finite_positive(r["delete_us"]) for r in sm)


def test_delete_vs_retrain_section() -> None:
    dv = bench_delete_vs_retrain(200, 12, 3, repeats=2, seed=0, thread_settings=(1,))
    assert dv["n_retained"] == 200
    sa = dv["sanity"]
    assert sa["smw_downdate_feasible"]
    # What is timed computes the right heads.
    assert sa["dev_A_vs_float64_retrain"] < 1e-10 and sa["dev_B_vs_float64_retrain"] < 1e-10
    assert sa["dev_sklearn_vs_float64_retrain"] < 1e-10
    assert sa["factor_downdate_feasible"] and sa["dev_B_factor_vs_float64_retrain"] < 1e-10
    (st,) = dv["settings"]
    for k in ("ledger_delete_1row", "solve_head", "smw_downdate_r1", "deletion_A", "deletion_B",
              "factor_downdate_r1", "deletion_B_factor", "retrain_float64", "retrain_sklearn", "digest"):
        assert _finite_positive(st["median_s"][k])
    assert st["speedup_float64_over_B_factor"] == pytest.approx(
        st["median_s"]["retrain_float64"] / st["median_s"]["deletion_B_factor"])
    assert st["speedup_float64_over_A"] == pytest.approx(
        st["median_s"]["retrain_float64"] / st["median_s"]["deletion_A"])


def test_drift_study_exact_ledger_matches_scratch() -> None:
    dr = drift_study(d=8, c=3, n_bulk=3000, batch=256, delete_chunk=100, n_retained=40, n_churn=300, seed=3)
    cps = dr["checkpoints"]
    assert [c["checkpoint"].split(" ")[0] for c in cps] == ["R", "bulk", "rank-1", "half", "bulk", "churn"]
    assert cps[-1]["n_retained"] == 40 == cps[-1]["scratch_n"]
    assert cps[1]["n_retained"] == 3040
    for c in cps:
        assert c["exact_digest_equal"] is True
        assert c["exact_head_bits_equal"] is True
        assert c["n_retained"] == c["scratch_n"]
        assert math.isfinite(c["exact_dev"]) and c["exact_dev"] < 1e-12
    final = cps[-1]
    # After deleting back to a small retained set the float ledgers carry residue; the exact one does not.
    assert final["exact_dev"] <= final["float64_dev"]
    assert final["float64_dev"] <= final["float32_dev"] or math.isnan(final["float32_dev"])


def test_smw_drift_section() -> None:
    sd = smw_drift(d=8, c=3, n0=30, n_events=200, n_checkpoints=2, seed=0)
    assert [r["events"] for r in sd["checkpoints"]] == [99, 199]
    for r in sd["checkpoints"]:
        assert r["ledgers_identical"] is True
        for name in SMW_POLICIES:
            assert math.isfinite(r[name]["dev"]) and r[name]["dev"] < 1e-8
    assert sd["checkpoints"][-1]["no resets"]["resets"] == sd["checkpoints"][-1]["no resets"]["forced_resets"]


def test_main_tiny_prints_all_sections_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    main(["--tiny", "--json", str(out)])
    text = capsys.readouterr().out
    for heading in ("## Machine and configuration", "## 0.", "## 1.", "## 2.", "## 3.", "## 4.", "## 5.", "## 6a.",
                    "## 6b."):
        assert heading in text
    assert "AMD" in text or "Intel" in text or "CPU:" in text
    data = json.loads(out.read_text())
    assert data["config"]["name"] == "tiny"
    assert data["machine"]["numpy"] == np.__version__
    assert all(c["exact_digest_equal"] for c in data["drift"]["checkpoints"])


def test_sections_runs_only_the_named_ones(capsys) -> None:
    """``--sections 4,8``: the deletion section and the fast heads (with the hyhound columns where
    hyhound is installed), nothing else."""
    from unlearn.ledger import cholesky_tracker

    main(["--tiny", "--sections", "4,8"])
    text = capsys.readouterr().out
    assert "## 4." in text and "## 8." in text
    assert not any(h in text for h in ("## 1.", "## 2.", "## 3.", "## 5.", "## 6a.", "## 7."))
    assert "deletion B, factor" in text
    assert ("Cholesky hyhound delete" in text) == (cholesky_tracker.hyhound is not None)
