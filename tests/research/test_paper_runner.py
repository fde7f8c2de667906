"""The evaluation harness: the stream runner on synthetic data, and `python -m bench.paper` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from research.paper import main as paper_main
from research.paper_data import DataUnavailable, PaperData, load_paper_data, prepare_features
from research.paper_experiments import STRATEGY_ORDER, exact_checks
from research.paper_runner import Request, StreamRunner, run_summary
from research.strategies import SAFE, CentralTrainer, ExactRidgeA, Float32RidgeA, NegGrad, RidgeRetrain, SoftmaxRetrain


def synthetic_data(seed: int = 0, n: int = 160, n_test: int = 60, d: int = 6, c: int = 3) -> PaperData:
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(c, d))
    y, yt = rng.integers(0, c, n), rng.integers(0, c, n_test)
    F = means[y] + 0.7 * rng.normal(size=(n, d))
    Ft = means[yt] + 0.7 * rng.normal(size=(n_test, d))
    return PaperData("synthetic", prepare_features(F), y, prepare_features(Ft), yt, c)


def test_prepare_features_is_on_the_grid_and_bounded() -> None:
    F = prepare_features(np.random.default_rng(0).normal(size=(10, 5)) * 100)
    assert F.shape == (10, 6) and np.all(F[:, -1] == 1.0) and np.abs(F).max() <= 1.0
    assert np.array_equal(np.rint(F * 2.0**30) / 2.0**30, F)


def test_runner_measures_every_strategy_against_its_own_family_retrain() -> None:
    data = synthetic_data()
    tr = CentralTrainer(l2=1e-2)
    factories = {
        "exact-a": lambda: ExactRidgeA(0.5),
        "float32-a": lambda: Float32RidgeA(0.5),
        "safe": lambda: SAFE(tr, projection_dim=3, horizon=4),
        "neggrad": lambda: NegGrad(tr),
        "retrain-ridge": lambda: RidgeRetrain(0.5),
        "retrain-softmax": lambda: SoftmaxRetrain(tr),
    }
    clients = np.arange(160) % 4
    reqs = [Request("delete", np.arange(0, 10)), Request("delete", np.arange(10, 30)), Request("add", np.arange(0, 10))]
    runner = StreamRunner(data, clients, factories, mia_max_per_class=50, extra=exact_checks(data))
    runs = runner.run(np.arange(160), reqs, eval_initial=True)
    ex = runs["exact-a"]
    assert [s["step"] for s in ex.steps] == [0, 1, 2, 3]
    assert all(s["ledger_bit_identical"] and s["head_bit_identical"] for s in ex.steps)
    assert max(s["param_gap"] for s in ex.steps) < 1e-10
    assert ex.steps[2]["n_forgotten"] == 30 and ex.steps[3]["n_forgotten"] == 20
    assert 1e-10 < runs["float32-a"].steps[-1]["param_gap"] < 1e-3
    assert runs["safe"].status == "unsupported-add@3" and len(runs["safe"].steps) == 3
    assert runs["retrain-softmax"].steps[-1]["param_gap"] == 0.0  # a retrain is its own reference
    for name in ("safe", "neggrad"):
        st = runs[name].steps[1]
        assert st["param_gap"] > 0 and 0 <= st["mia"] <= 1 and st["kl_test"] > 0
    summary = run_summary(runs["exact-a"])
    assert summary["requests_timed"] == 3 and summary["final"]["step"] == 3
    assert summary["cum_seconds"] == pytest.approx(sum(summary["request_seconds"]))


def test_runner_rejects_inconsistent_requests() -> None:
    data = synthetic_data()
    runner = StreamRunner(data, np.zeros(160, np.int64), {"exact-a": lambda: ExactRidgeA()}, with_mia=False)
    with pytest.raises(ValueError, match="not retained"):
        runner.run(np.arange(100), [Request("delete", np.array([150]))])


def test_digits_always_loads() -> None:
    data = load_paper_data("digits", 100, 50, log=lambda m: None)
    assert data.F_train.shape == (100, 65) and data.n_classes == 10


def test_auto_falls_back_to_digits_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import unlearn.services.demo.datasets as ds

    real = ds.cached_features

    def fake(dataset: str, *args: object, **kw: object) -> object:
        if dataset == "fashion-mnist":
            raise ds.DatasetUnavailableError("Fashion-MNIST file not found; apt-get install dataset-fashion-mnist")
        return real(dataset, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ds, "cached_features", fake)
    said: list[str] = []
    data = load_paper_data("auto", 5000, 300, log=said.append)
    assert data.name == "digits/features" and data.F_train.shape[0] == 1438  # capped to what digits has
    assert said and "falling back to sklearn digits" in said[0] and data.notes == said
    with pytest.raises(DataUnavailable, match="apt-get install"):
        load_paper_data("fashion-mnist", 100, 10)


@pytest.mark.slow
def test_bench_paper_quick_runs_every_strategy_through_every_experiment(tmp_path: Path, capsys) -> None:
    rc = paper_main(["--quick", "--json", "--dataset", "digits", "--n-train", "330", "--n-test", "100",
                     "--out", str(tmp_path)])
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert lines == [json.loads(x) for x in (tmp_path / "paper-quick.jsonl").read_text().splitlines()]
    experiments = {r["experiment"] for r in lines}
    assert experiments == {"ridge.table3", "ridge.table4", "ridge.table5", "ridge.figure2", "acu.requests5",
                           "acu.requests25", "safe.random_subsets", "hfkcu.remove_client"}
    for exp in experiments - {"ridge.table4"}:
        names = [r["strategy"] for r in lines if r["experiment"] == exp]
        assert names == list(STRATEGY_ORDER), exp  # every strategy, one record each
    t5 = {r["strategy"]: r for r in lines if r["experiment"] == "ridge.table5"}
    assert t5["exact-a"]["final"]["ledger_bit_identical"] is True
    hf = {r["strategy"]: r for r in lines if r["experiment"] == "hfkcu.remove_client"}
    assert hf["exact-a"]["cf"] in (1.0, None) and hf["fedavg-retrain"]["final"]["param_gap"] == 0.0
    md = (tmp_path / "paper-quick.md").read_text()
    for title in ("Table 3", "Table 4", "Table 5", "Figure 2", "ACU protocol", "SAFE protocol", "HF-KCU protocol"):
        assert title in md
    assert len(list(tmp_path.glob("paper-quick_*.png"))) == 4
