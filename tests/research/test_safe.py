"""SAFE (research/strategies/safe.py): incremental Gaussian statistics and the recursive retention
gradient equal their recomputed definitions; one normalized, seeded step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from research.strategies import (
    SAFE,
    CentralTrainer,
    GaussianClassStats,
)
from research.strategies._softmax import ce_loss_grad
from research.strategies.safe import kl_grad_logits
from tests.research.test_strategies import C, make_data


# ------------------------------------------------------------------------------ SAFE
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), batches=st.lists(st.integers(1, 15), min_size=1, max_size=6))
def test_safe_incremental_gaussians_equal_recomputed_statistics(seed: int, batches: list[int]) -> None:
    """Eq. 22-23: per-class mean/covariance after removals equal those recomputed on the retained rows."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, 120)
    Z = rng.normal(size=(120, 4)) * rng.uniform(0.5, 3, 4) + y[:, None]
    st_inc = GaussianClassStats.from_data(Z, y, C)
    order = rng.permutation(120)
    pos = 0
    for k in batches:
        b = order[pos:pos + k]
        st_inc.remove(Z[b], y[b])
        pos += k
    r = order[pos:]
    ref = GaussianClassStats.from_data(Z[r], y[r], C)
    np.testing.assert_array_equal(st_inc.count, ref.count)
    for c in range(C):
        if ref.count[c] >= 1:
            np.testing.assert_allclose(st_inc.mean[c], ref.mean[c], rtol=1e-9, atol=1e-11)
        if ref.count[c] >= 2:
            np.testing.assert_allclose(st_inc.cov[c], ref.cov[c], rtol=1e-8, atol=1e-10)


def test_safe_gaussians_handle_emptied_classes() -> None:
    Z = np.arange(12, dtype=float).reshape(6, 2)
    y = np.array([0, 0, 0, 1, 1, 1])
    g = GaussianClassStats.from_data(Z, y, 2)
    g.remove(Z[[3, 4]], y[[3, 4]])
    assert g.count.tolist() == [3, 1] and np.isneginf(g.log_density(Z, 1)).all()
    g.remove(Z[[5]], y[[5]])
    assert g.count[1] == 0
    with pytest.raises(ValueError):
        g.remove(Z[[5]], y[[5]])


def _safe_fixture(**kw: object) -> tuple[SAFE, np.ndarray, np.ndarray]:
    F, y = make_data(3, n=150, d=6)
    s = SAFE(CentralTrainer(l2=1e-2), projection_dim=3, **kw).fit(F, y, ids=np.arange(150), n_classes=C)  # type: ignore[arg-type]
    return s, F, y


def test_safe_recursive_retention_gradient_equals_the_retained_gradient() -> None:
    """Eq. 15 without D0: after any deletions, grad R_t^ret(w0) is the mean-loss gradient at w0 over
    the retained set -- exactly what a pass over the retained data would give."""
    s, F, y = _safe_fixture()
    order = np.random.default_rng(3).permutation(150)
    for k in (5, 17, 1, 30):
        b, order = order[:k], order[k:]
        s.delete(F[b], y[b], ids=b)
    r = np.sort(order)
    np.testing.assert_allclose(s.grad_ret, ce_loss_grad(s.w0, F[r], y[r], 0.0)[1], rtol=1e-10, atol=1e-13)
    ref = GaussianClassStats.from_data(s.project(F[r]), y[r], C)
    np.testing.assert_allclose(s.stats.cov, ref.cov, rtol=1e-8, atol=1e-10)


def test_safe_step_is_one_normalized_step_from_w0() -> None:
    """Eq. 27 with no noise: ||w_t - w0|| = gamma for every request, never cumulative."""
    s, F, y = _safe_fixture(noise_ratio=0.0)
    for b in (np.arange(5), np.arange(5, 25)):
        s.delete(F[b], y[b], ids=b)
        assert np.linalg.norm(s.weights - s.w0) == pytest.approx(s.lr, rel=1e-12)
    assert s.lr == pytest.approx(np.sqrt(np.linalg.norm(s.w0)) / (8.0 * np.sqrt(20)))  # gamma = sqrt(W)/(K sqrt(T))


def test_safe_noise_is_seeded_and_scaled() -> None:
    a, F, y = _safe_fixture(seed=1)
    b, *_ = _safe_fixture(seed=1)
    c, *_ = _safe_fixture(seed=1, noise_ratio=0.0)
    for s in (a, b, c):
        s.delete(F[:4], y[:4], ids=np.arange(4))
    assert np.array_equal(a.weights, b.weights)
    noise = np.linalg.norm(a.weights - c.weights)
    assert 0.05 * a.lr < noise < 0.2 * a.lr  # E||b|| = 0.1 gamma


def test_safe_target_is_the_original_prediction_before_any_shift() -> None:
    """With nothing removed the density ratio is 1: the target equals f(x; w0) and the forgetting
    gradient vanishes."""
    s, F, _y = _safe_fixture()
    np.testing.assert_allclose(np.exp(s.log_target(F[:20])), np.exp(np.log(s.predict_proba(F[:20]))), rtol=1e-9)
    assert np.abs(s.forgetting_gradient(F[:20], s.w0)).max() < 1e-9


def test_safe_kl_gradient_matches_autograd() -> None:
    rng = np.random.default_rng(4)
    Z = rng.normal(size=(7, 4))
    T = rng.dirichlet(np.ones(4), size=7)
    zt = torch.tensor(Z, requires_grad=True)
    p = torch.softmax(zt, dim=1)
    (p * (torch.log(p) - torch.log(torch.tensor(T)))).sum().backward()
    P = np.exp(Z - Z.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    np.testing.assert_allclose(kl_grad_logits(P, np.log(T)), zt.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_safe_forgets_removed_class_mass() -> None:
    """Removing most of one class lowers the target probability of that class on its samples."""
    s, F, y = _safe_fixture()
    cls0 = np.flatnonzero(y == 0)[:-3]
    before = np.exp(s.log_target(F[cls0]))[:, 0].mean()
    s.delete(F[cls0], y[cls0], ids=cls0)
    after = np.exp(s.log_target(F[cls0]))[:, 0].mean()
    assert after < 0.5 * before




def test_safe_refuses_to_forget_the_same_sample_twice() -> None:
    s, F, y = _safe_fixture()
    s.delete(F[:3], y[:3], ids=np.arange(3))
    with pytest.raises(ValueError, match="already forgotten"):
        s.delete(F[2:4], y[2:4], ids=np.arange(2, 4))
