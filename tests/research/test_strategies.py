"""Every strategy against its defining property on small synthetic data.

Exact ledger strategies: bit for bit equal to a from-scratch build, whatever the order or client
partition. Float ledgers: equal to retraining within their dtype's rounding. ACU: the Knowledge
Tracking Matrix recursion equals a fresh solve. (HF-KCU, SAFE and the baselines: see
test_strategies_approx.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from research.strategies import (
    ACU,
    STRATEGIES,
    ACURandomProjection,
    ExactRidgeA,
    ExactRidgeB,
    Float32RidgeA,
    Float32RidgeB,
    Float64RidgeA,
    Float64RidgeB,
    FloatRidge,
    RidgeRetrain,
    Strategy,
    StrategyError,
    UnsupportedOperation,
    available_strategies,
    dirichlet_partition,
    make_strategy,
)
from unlearn.ledger import (
    ExactLedger,
    Quantizer,
    centralized_retrain,
    l2_normalize,
    one_hot,
    solve_head,
    with_intercept,
)

C = 3


def make_data(seed: int, n: int = 120, d: int = 8, c: int = C) -> tuple[np.ndarray, np.ndarray]:
    """Clustered unit-norm features with an intercept, on the exact ledger's grid."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    F = rng.normal(size=(c, d))[y] + 0.6 * rng.normal(size=(n, d))
    q = Quantizer()
    return q.dequantize(q.quantize(with_intercept(l2_normalize(F)))), y.astype(np.int64)


def relative(A: np.ndarray, B: np.ndarray) -> float:
    return float(np.linalg.norm(A - B) / np.linalg.norm(B))


def ridge_reference(F: np.ndarray, y: np.ndarray, gamma: float) -> np.ndarray:
    return centralized_retrain(F, one_hot(y, C), gamma)


def fast_params(name: str) -> dict[str, object]:
    """Small settings so every strategy runs in milliseconds in the interface tests."""
    from research.strategies import CentralTrainer, FedAvgTrainer

    if name == "acu-rp":
        return {"expansion_dim": 24, "gamma": 10.0}
    if name in ("hf-kcu", "fedavg-retrain"):
        return {"trainer": FedAvgTrainer(n_rounds=2, local_epochs=1)}
    if name in ("safe", "neggrad", "finetune", "no-unlearning", "retrain-softmax"):
        return {"trainer": CentralTrainer(max_iter=200)}
    return {}


# ------------------------------------------------------------------------------ the interface
@pytest.mark.parametrize("name", available_strategies())
def test_every_strategy_serves_the_common_interface(name: str) -> None:
    F, y = make_data(0)
    n = len(y)
    ids = np.arange(n)
    clients = dirichlet_partition(y, 3, 0.5, seed=0)
    s = make_strategy(name, **fast_params(name))
    assert isinstance(s, Strategy) and s.name == name
    s.fit(F, y, ids=ids, clients=clients, n_classes=C)
    W0 = s.weights.copy()
    assert W0.ndim == 2 and W0.shape[1] == C and np.isfinite(W0).all()
    gone = np.array([3, 10, 40])
    s.delete(F[gone], y[gone], ids=ids[gone], clients=clients[gone])
    P = s.predict_proba(F)
    assert P.shape == (n, C) and np.allclose(P.sum(axis=1), 1.0)
    assert s.predict(F).shape == (n,) and s.decision_function(F).shape == (n, C)
    cp = s.retrain_counterpart()
    assert cp.family == s.family and cp.dim is None  # unfitted, same model family
    if s.supports_add:
        s.add(F[gone], y[gone], ids=ids[gone], clients=clients[gone])
    else:
        with pytest.raises(UnsupportedOperation):
            s.add(F[gone], y[gone], ids=ids[gone], clients=clients[gone])
    with pytest.raises(StrategyError):
        s.delete(F[:2, :-1], y[:2], ids=ids[:2])  # wrong width is refused
    assert set(s.params()) == set(s.params())  # params() is total and side-effect free


def test_registry_rejects_unknown_names_and_lists_every_seed_method() -> None:
    with pytest.raises(StrategyError, match="unknown strategy"):
        make_strategy("sisa")
    for required in ("exact-a", "exact-b", "float64-a", "float32-b", "acu", "acu-rp", "hf-kcu", "safe", "neggrad",
                     "finetune", "retrain-ridge", "retrain-softmax", "fedavg-retrain"):
        assert required in STRATEGIES


def test_fit_rejects_bad_input() -> None:
    F, y = make_data(1)
    with pytest.raises(StrategyError):
        ExactRidgeA().fit(F, y[:-1])
    with pytest.raises(StrategyError):
        ExactRidgeA().fit(np.where(np.eye(len(y), F.shape[1]) > 0, np.nan, F), y)
    with pytest.raises(StrategyError):
        ExactRidgeA().delete(F[:1], y[:1], ids=[0])  # not fitted
    with pytest.raises(StrategyError, match="unique"):
        ExactRidgeA().fit(F, y).delete(F[:2], y[:2], ids=[5, 5])


def test_data_keeping_strategies_refuse_deletes_of_unknown_ids() -> None:
    F, y = make_data(2)
    s = RidgeRetrain().fit(F, y, n_classes=C)
    with pytest.raises(StrategyError, match="not retained"):
        s.delete(F[:1], y[:1], ids=[10_000])
    s.delete(F[:1], y[:1], ids=[0])
    with pytest.raises(StrategyError, match="not retained"):
        s.delete(F[:1], y[:1], ids=[0])  # already deleted


# ------------------------------------------------------------------------------ exact ledger
ops = st.lists(st.tuples(st.booleans(), st.integers(1, 6)), min_size=1, max_size=12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), stream=ops)
def test_exact_a_after_any_stream_is_bit_identical_to_from_scratch(seed: int, stream: list[tuple[bool, int]]) -> None:
    """Any interleaving of adds and deletes: ledger digest and head bits equal the from-scratch ones."""
    F, y = make_data(seed, n=80)
    rng = np.random.default_rng(seed)
    initial = rng.choice(80, 40, replace=False)
    retained = set(initial.tolist())
    s = ExactRidgeA(gamma=0.5).fit(F[initial], y[initial], ids=initial, n_classes=C)
    for is_add, k in stream:
        pool = sorted(set(range(80)) - retained) if is_add else sorted(retained)
        if len(pool) <= k:
            continue
        pick = rng.choice(pool, k, replace=False)
        (s.add if is_add else s.delete)(F[pick], y[pick], ids=pick)
        retained = retained | set(pick.tolist()) if is_add else retained - set(pick.tolist())
    r = np.array(sorted(retained))
    fresh = ExactLedger.from_rows(s.quantizer.quantize(F[r]), y[r], C)
    assert s.digest() == fresh.digest()
    assert np.array_equal(s.weights, solve_head(fresh, 0.5))  # bit for bit
    assert relative(s.weights, ridge_reference(F[r], y[r], 0.5)) < 1e-10


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), k1=st.integers(1, 12), k2=st.integers(1, 12))
def test_exact_fit_is_partition_invariant_bit_for_bit(seed: int, k1: int, k2: int) -> None:
    F, y = make_data(seed, n=90)
    rng = np.random.default_rng(seed)
    a = ExactRidgeA().fit(F, y, clients=rng.integers(0, k1, 90), n_classes=C)
    b = ExactRidgeA().fit(F, y, clients=rng.integers(0, k2, 90), n_classes=C)
    assert a.digest() == b.digest() and np.array_equal(a.weights, b.weights)


def test_exact_b_tracks_within_rounding_and_resets_to_the_canonical_bits() -> None:
    F, y = make_data(3, n=150)
    clients = dirichlet_partition(y, 5, 0.5, seed=1)
    s = ExactRidgeB(gamma=1.0).fit(F, y, clients=clients, n_classes=C)  # Algorithm 2: per-client SMW adds
    order = np.random.default_rng(3).permutation(150)
    for i in order[:30]:
        s.delete(F[[i]], y[[i]], ids=[i])
    for i in order[:10]:
        s.add(F[[i]], y[[i]], ids=[i])
    r = np.sort(np.concatenate([order[30:], order[:10]]))
    fresh = ExactLedger.from_rows(s.quantizer.quantize(F[r]), y[r], C)
    canonical = solve_head(fresh, 1.0)
    assert s.ledger.digest() == fresh.digest()
    assert relative(s.weights, canonical) < 1e-10  # the fast head drifts only by rounding
    s.reset()
    assert s.mode == "exact" and np.array_equal(s.weights, canonical)


def test_exact_strategies_refuse_out_of_bound_features() -> None:
    F, y = make_data(4)
    with pytest.raises(ValueError, match="exceeds the bound"):
        ExactRidgeA().fit(F * 3.0, y)


# ------------------------------------------------------------------------------ float ledgers
@pytest.mark.parametrize("cls,tol", [(Float64RidgeA, 1e-11), (Float64RidgeB, 1e-9), (Float32RidgeA, 2e-3),
                                     (Float32RidgeB, 2e-3)])
def test_float_ledgers_match_retraining_within_their_rounding(cls: type[FloatRidge], tol: float) -> None:
    F, y = make_data(5, n=200)
    clients = dirichlet_partition(y, 4, 0.5, seed=2)
    s = cls(gamma=0.5).fit(F, y, clients=clients, n_classes=C)
    order = np.random.default_rng(5).permutation(200)
    for i in order[:40]:
        s.delete(F[[i]], y[[i]], ids=[i])
    s.add(F[order[:15]], y[order[:15]], ids=order[:15])
    r = np.sort(np.concatenate([order[40:], order[:15]]))
    dev = relative(s.weights, ridge_reference(F[r], y[r], 0.5))
    assert dev < tol, dev
    if cls in (Float32RidgeA, Float32RidgeB):
        assert dev > 1e-10  # float32 really is float32 (not silently upcast)


def test_float64_residue_never_cancels_but_the_exact_ledger_does() -> None:
    """Add then delete the same rows: the float ledger keeps rounding residue, the exact one none."""
    F, y = make_data(6, n=300)
    base, extra = np.arange(200), np.arange(200, 300)
    fl = Float64RidgeA().fit(F[base], y[base], n_classes=C)
    ex = ExactRidgeA().fit(F[base], y[base], n_classes=C)
    S0, digest0, W0 = fl.ledger.S.copy(), ex.digest(), ex.weights.copy()
    for s in (fl, ex):
        s.add(F[extra], y[extra], ids=extra)
        s.delete(F[extra], y[extra], ids=extra)
    assert not np.array_equal(fl.ledger.S, S0)  # residue (tiny, but not zero)
    assert np.max(np.abs(fl.ledger.S - S0)) < 1e-12
    assert ex.digest() == digest0 and np.array_equal(ex.weights, W0)


def test_float_b_refuses_an_infeasible_downdate_instead_of_publishing_a_wrong_head() -> None:
    """Lemma 1: a delete that would make H - U^T U indefinite (here: a row deleted twice, and it
    is the only one spanning the last feature) is refused by the SMW check; the fallback to
    Variant A then finds the float ledger inconsistent and raises rather than serve garbage."""
    F, y = make_data(7, n=60)
    F = np.hstack([F, np.zeros((60, 1))])
    F[0, -1] = 0.5  # only row 0 has a last component
    s = Float64RidgeB(gamma=1e-3).fit(F, y, n_classes=C)
    s.delete(F[:1], y[:1], ids=[0])
    assert s.fallbacks == 0
    W_before = s.weights.copy()
    with pytest.raises(np.linalg.LinAlgError):
        s.delete(F[:1], y[:1], ids=[1])
    assert s.fallbacks == 1
    assert np.array_equal(s.weights, W_before)  # the refused SMW step left the head untouched


# ------------------------------------------------------------------------------ ACU
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), sizes=st.lists(st.integers(1, 10), min_size=1, max_size=6),
       expand=st.booleans())
def test_acu_recursion_equals_a_fresh_solve_on_the_retained_set(seed: int, sizes: list[int], expand: bool) -> None:
    """ACU Theorem 1: after any sequence of unlearning requests, W equals the retrained ridge head
    (on the same random-projection features when the buffer layer is on)."""
    F, y = make_data(seed, n=100)
    s = ACURandomProjection(gamma=20.0, expansion_dim=30, expansion_seed=seed) if expand else ACU(gamma=0.7)
    s.fit(F, y, n_classes=C)
    order = np.random.default_rng(seed).permutation(100)
    pos = 0
    for k in sizes:
        batch = order[pos:pos + k]
        s.delete(F[batch], y[batch], ids=batch)
        pos += k
    r = np.sort(order[pos:])
    X = s.transform(F[r])
    ref = ridge_reference(X, y[r], s.gamma)
    assert relative(s.weights, ref) < 1e-8
    A = X.T @ X + s.gamma * np.eye(X.shape[1])
    assert s.R is not None and np.allclose(s.R @ A, np.eye(X.shape[1]), atol=1e-8)  # R is still (X^T X + gI)^-1


def test_acu_learning_recursion_appendix_c() -> None:
    F, y = make_data(8, n=100)
    s = ACU(gamma=0.3).fit(F[:60], y[:60], n_classes=C)
    s.add(F[60:80], y[60:80], ids=np.arange(60, 80))
    s.delete(F[:10], y[:10], ids=np.arange(10))
    s.add(F[80:], y[80:], ids=np.arange(80, 100))
    r = np.arange(10, 100)
    assert relative(s.weights, ridge_reference(F[r], y[r], 0.3)) < 1e-9


def test_acu_rp_counterpart_uses_the_same_expansion() -> None:
    F, y = make_data(9, n=80)
    s = ACURandomProjection(gamma=5.0, expansion_dim=16, expansion_seed=3).fit(F, y, n_classes=C)
    ref = s.retrain_counterpart().fit(F, y, n_classes=C)
    assert ref.weights.shape == (16, C)
    assert relative(s.weights, ref.weights) < 1e-9
