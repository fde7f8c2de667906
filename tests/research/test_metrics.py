"""bench.metrics on hand-computable cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.metrics import (
    MembershipAttack,
    SetOutputs,
    accuracy,
    causal_faithfulness,
    cumulative,
    mia_features,
    mia_score,
    output_kl,
    parameter_gap,
    speedup,
    unlearning_metrics,
)


def test_accuracy() -> None:
    assert accuracy([0, 1, 2, 2], [0, 1, 1, 2]) == 0.75
    assert math.isnan(accuracy([], []))
    with pytest.raises(ValueError):
        accuracy([0, 1], [0])


def test_parameter_gap() -> None:
    W = np.array([[1.0, 2.0], [2.0, 4.0]])  # ||W||_F = 5
    assert parameter_gap(W * 1.1, W) == pytest.approx(0.1)
    assert parameter_gap(W + np.array([[3.0, 0], [0, 4.0]]) / 5, W) == pytest.approx(1.0 / 5)
    assert parameter_gap(np.array([[3.0, 4.0]]), np.zeros((1, 2))) == 5.0  # absolute when the reference is 0
    with pytest.raises(ValueError):
        parameter_gap(np.zeros((2, 2)), np.zeros((2, 3)))


def test_output_kl_hand_computed() -> None:
    P_ref = np.array([[0.5, 0.5], [1.0, 0.0]])
    P = np.array([[0.25, 0.75], [1.0, 0.0]])
    expected_row0 = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert output_kl(P_ref, P) == pytest.approx(expected_row0 / 2, rel=1e-9)
    assert output_kl(P, P) == 0.0
    assert math.isfinite(output_kl(np.array([[0.5, 0.5]]), np.array([[1.0, 0.0]])))  # floored, not inf
    assert math.isnan(output_kl(np.zeros((0, 2)), np.zeros((0, 2))))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 1000))
def test_output_kl_is_nonnegative_and_zero_only_for_equal_rows(seed: int) -> None:
    rng = np.random.default_rng(seed)
    P, Q = rng.dirichlet(np.ones(4), 5), rng.dirichlet(np.ones(4), 5)
    assert output_kl(P, Q) > 0 and output_kl(P, P) == 0.0


def test_mia_features() -> None:
    P = np.array([[0.9, 0.1], [0.5, 0.5]])
    f = mia_features(P, np.array([0, 1]))
    np.testing.assert_allclose(f[:, 0], [0.9, 0.5])
    np.testing.assert_allclose(f[:, 1], [-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)), math.log(2)])


def _outputs(conf: np.ndarray) -> np.ndarray:
    """Two-class probabilities with the true class (0) at the given confidence."""
    return np.column_stack([conf, 1 - conf])


@pytest.mark.parametrize("method", ["svc", "threshold"])
def test_mia_separates_confident_members_from_unsure_nonmembers(method: str) -> None:
    rng = np.random.default_rng(0)
    members = _outputs(rng.uniform(0.9, 0.99, 200))
    nonmembers = _outputs(rng.uniform(0.4, 0.6, 200))
    y = np.zeros(200, np.int64)
    like_members = _outputs(rng.uniform(0.9, 0.99, 50))
    like_test = _outputs(rng.uniform(0.4, 0.6, 50))
    yf = np.zeros(50, np.int64)
    assert mia_score(members, y, nonmembers, y, like_members, yf, method=method) == 1.0
    assert mia_score(members, y, nonmembers, y, like_test, yf, method=method) == 0.0
    assert math.isnan(mia_score(members, y, nonmembers, y, like_test[:0], yf[:0], method=method))


def test_membership_attack_balances_and_validates() -> None:
    with pytest.raises(ValueError):
        MembershipAttack("nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        MembershipAttack().fit(np.zeros((0, 2)), np.ones((3, 2)))
    att = MembershipAttack("threshold", max_per_class=3).fit(np.array([[0.9, 0], [0.8, 0], [0.95, 0], [0.99, 0]]),
                                                            np.array([[0.1, 0], [0.2, 0], [0.3, 0]]))
    assert att.predict(np.array([[0.85, 0.0], [0.25, 0.0]])).tolist() == [True, False]


def test_causal_faithfulness_and_speedup() -> None:
    assert causal_faithfulness(0.7116, 0.7079, 0.7176) == pytest.approx(1 - 0.0037 / 0.0097)
    assert causal_faithfulness(0.70, 0.70, 0.72) == 1.0
    assert math.isnan(causal_faithfulness(0.7, 0.7, 0.7))
    assert speedup(10.0, 0.5) == 20.0 and speedup(1.0, 0.0) == math.inf
    assert cumulative([1.0, 2.0, 0.5]) == [1.0, 3.0, 3.5]


def test_unlearning_metrics_of_a_model_equal_to_its_reference_are_all_zero_gaps() -> None:
    rng = np.random.default_rng(1)
    P = rng.dirichlet(np.ones(3), 60)
    y = rng.integers(0, 3, 60)
    o = SetOutputs(P[:30], y[:30], P[30:40], y[30:40], P[40:], y[40:])
    W = rng.normal(size=(4, 3))
    m = unlearning_metrics(o, o, W, W, mia_max_per_class=20)
    for k in ("ra_gap", "fa_gap", "ta_gap", "mia_gap", "param_gap", "kl_test", "kl_forget"):
        assert m[k] == 0.0, k
    assert m["ra"] == accuracy(P[:30].argmax(1), y[:30])
    m2 = unlearning_metrics(o, o, W, W, with_mia=False)
    assert "mia" not in m2


def test_unlearning_metrics_gaps_are_absolute_differences() -> None:
    y = np.array([0, 0, 1, 1])
    good = np.array([[0.9, 0.1], [0.8, 0.2], [0.2, 0.8], [0.1, 0.9]])
    bad = good[:, ::-1]
    a = SetOutputs(good, y, good[:0], y[:0], good, y)
    b = SetOutputs(bad, y, bad[:0], y[:0], bad, y)
    m = unlearning_metrics(b, a, np.eye(2), np.eye(2), with_mia=False)
    assert m["ra"] == 0.0 and m["ra_retrain"] == 1.0 and m["ra_gap"] == 1.0
    assert math.isnan(m["fa"]) and math.isnan(m["kl_forget"])
