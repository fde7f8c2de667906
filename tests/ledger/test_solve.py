"""Variant A (ledger/solve.py): the canonical head against scikit-learn's ridge, deterministic and
order-free, and the posterior inverse by LAPACK dpotri against the ``cho_solve`` it replaced."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.ledger import (
    ExactLedger,
    Quantizer,
    l2_normalize,
    one_hot,
    posterior_inverse,
    retrain_deviation,
    solve_head,
    with_intercept,
)
from unlearn.ledger.errors import LedgerError
from unlearn.ledger.solve import inverse_from_factor


def clustered_features(rng: np.random.Generator, n: int, d: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """Backbone-like features: class means + low-rank structure + noise, L2-normalized."""
    y = rng.integers(0, c, n)
    means = rng.normal(size=(c, d))
    basis = rng.normal(size=(16, d))
    F = means[y] + rng.normal(size=(n, 16)) @ basis * 0.5 + rng.normal(size=(n, d)) * 0.3
    return l2_normalize(F), y


def test_head_matches_sklearn_ridge_at_paper_scale() -> None:
    """d=768, c=10, n=20k: relative Frobenius deviation from sklearn Ridge <= 1e-10."""
    rng = np.random.default_rng(0)
    n, d, c, gamma = 20_000, 768, 10, 1.0
    F, y = clustered_features(rng, n, d, c)
    q = Quantizer()
    Q = q.quantize(F)
    led = ExactLedger(d, c)
    led.add(Q, y)
    W = solve_head(led, gamma)
    dev = retrain_deviation(W, q.dequantize(Q), one_hot(y, c), gamma)
    assert dev <= 1e-10, dev


def test_solve_head_is_deterministic_and_order_free() -> None:
    rng = np.random.default_rng(1)
    F, y = clustered_features(rng, 400, 24, 4)
    Q = Quantizer().quantize(F)
    a, b = ExactLedger(24, 4), ExactLedger(24, 4)
    a.add(Q, y)
    perm = rng.permutation(400)
    for chunk in np.array_split(perm, 7):
        b.add(Q[chunk], y[chunk])
    assert np.array_equal(solve_head(a, 0.5), solve_head(b, 0.5))  # bit for bit


def test_intercept_by_augmentation_matches_sklearn() -> None:
    rng = np.random.default_rng(2)
    F, y = clustered_features(rng, 300, 8, 3)
    Fa = with_intercept(F * 0.9)
    q = Quantizer()
    Q = q.quantize(Fa)
    led = ExactLedger.from_rows(Q, y, n_outputs=3)
    W = solve_head(led, 0.1)
    assert W.shape == (9, 3)
    assert retrain_deviation(W, q.dequantize(Q), one_hot(y, 3), 0.1) < 1e-12


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 80), n=st.integers(0, 200),
       log_scale=st.floats(-3.0, 3.0), gamma=st.sampled_from([1e-3, 1.0, 10.0]))
def test_dpotri_inverse_matches_cho_solve(seed: int, d: int, n: int, log_scale: float, gamma: float) -> None:
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, d)) * 10.0 ** log_scale
    H = A.T @ A + gamma * np.eye(d)
    L = sla.cholesky(H, lower=True, check_finite=False)
    old = sla.cho_solve((L, True), np.eye(d), check_finite=False)
    old = (old + old.T) * 0.5
    new = inverse_from_factor(L)
    assert new.flags.c_contiguous and np.array_equal(new, new.T)  # exactly symmetric
    cond = np.linalg.cond(H)
    tol = 64 * np.finfo(np.float64).eps * cond
    assert np.linalg.norm(new - old) <= tol * np.linalg.norm(old)
    # and as good an inverse: residuals of the same order
    res_new = np.linalg.norm(H @ new - np.eye(d))
    res_old = np.linalg.norm(H @ old - np.eye(d))
    assert res_new <= 4 * res_old + 16 * d * np.finfo(np.float64).eps * cond


def test_inverse_from_factor_refuses_a_singular_factor() -> None:
    L = np.eye(4)
    L[2, 2] = 0.0
    with pytest.raises(LedgerError, match="singular"):
        inverse_from_factor(L)


def test_posterior_inverse_of_a_ledger() -> None:
    rng = np.random.default_rng(7)
    d = 24
    led = ExactLedger.from_rows(rng.integers(-(1 << 29), 1 << 29, size=(100, d)), rng.integers(0, 3, 100), n_outputs=3)
    T = posterior_inverse(led, 1.0)
    H = led.gram() + np.eye(d)
    assert np.array_equal(T, T.T)
    assert np.linalg.norm(H @ T - np.eye(d)) < 1e-10
