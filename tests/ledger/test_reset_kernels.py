"""The reset's kernels against the code they replace (issue 12): ``inverse_from_factor`` (LAPACK
dpotri) must give the inverse ``cho_solve`` gave, to rounding."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.ledger import ExactLedger
from unlearn.ledger.errors import LedgerError
from unlearn.ledger.solve import inverse_from_factor, posterior_inverse


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
