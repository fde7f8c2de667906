"""The Cholesky-factor fast head (ledger/cholesky_tracker.py): both factor kernels (the blocked numpy
update/downdate and the compiled hyhound one) against a fresh factorization, the tracker with
either kernel against solve_head on the exact ledger, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unlearn.ledger import (
    CholeskyTracker,
    ExactLedger,
    Quantizer,
    TrackedHead,
    cholesky_tracker,
    l2_normalize,
    one_hot,
    posterior_inverse,
    relative_deviation,
    solve_head,
)
from unlearn.ledger.cholesky_tracker import FactorKernel, chol_rank_update, hyperbolic_rank_update, tri_solve

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Documented tolerance of the fast head (docs/design.md section 2): after a long update stream without
#: resets the factor-form W stays within this relative Frobenius distance of solve_head on the ledger.
FAST_HEAD_TOL = 1e-9

#: Every factor kernel the tracker can run; hyhound's wheel is installed where it exists (Linux x86_64).
KERNELS = ["blocked", pytest.param("hyhound", marks=pytest.mark.skipif(
    cholesky_tracker.hyhound is None, reason="hyhound has no wheel for this platform"))]


def spd(rng: np.random.Generator, d: int) -> np.ndarray:
    A = rng.standard_normal((d + 3, d))
    return A.T @ A / d + np.eye(d)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 70), r=st.integers(1, 12), block=st.integers(1, 20),
       fortran=st.booleans())
def test_rank_update_and_downdate_match_a_fresh_factorization(seed: int, d: int, r: int, block: int,
                                                              fortran: bool) -> None:
    """Any d, r, block size (r larger than a block, a ragged last block) and memory order."""
    rng = np.random.default_rng(seed)
    H = spd(rng, d)
    V = rng.standard_normal((d, r)) * 0.5
    L0 = np.linalg.cholesky(H)
    L = np.array(L0, order="F" if fortran else "C")  # always a copy
    gen = chol_rank_update(L, V, +1, block=block)
    assert gen is not None
    ref = np.linalg.cholesky(H + V @ V.T)
    assert np.allclose(L, ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    assert not np.triu(L, 1).any()  # still exactly lower triangular
    X = rng.standard_normal((d, 2))
    assert np.allclose(gen.solve(tri_solve(L0, X)), np.linalg.solve(ref, X), atol=1e-10)  # L~^-1 = M^-1 L^-1
    assert chol_rank_update(L, V, -1, block=block) is not None
    assert np.allclose(L, L0, rtol=0, atol=1e-12 * np.abs(L0).max())


@pytest.mark.skipif(cholesky_tracker.hyhound is None, reason="hyhound has no wheel for this platform")
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 70), r=st.integers(1, 12))
def test_hyperbolic_update_and_downdate_match_a_fresh_factorization(seed: int, d: int, r: int) -> None:
    rng = np.random.default_rng(seed)
    H = spd(rng, d)
    V = rng.standard_normal((d, r)) * 0.5
    L0 = np.linalg.cholesky(H)
    L = np.array(L0, order="F")
    V_before = V.copy()
    assert hyperbolic_rank_update(L, V, +1)
    assert np.array_equal(V, V_before)  # the kernel overwrites its argument: it gets a copy
    ref = np.linalg.cholesky(H + V @ V.T)
    assert np.allclose(np.tril(L), ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    assert hyperbolic_rank_update(L, V, -1)
    assert np.allclose(np.tril(L), L0, rtol=0, atol=1e-12 * np.abs(L0).max())


@pytest.mark.skipif(cholesky_tracker.hyhound is None, reason="hyhound has no wheel for this platform")
def test_hyperbolic_downdate_past_positive_definiteness_is_reported() -> None:
    rng = np.random.default_rng(1)
    L = np.array(np.linalg.cholesky(spd(rng, 30)), order="F")
    assert not hyperbolic_rank_update(L, rng.standard_normal((30, 3)) * 50, -1)
    with pytest.raises(ValueError, match="Fortran"):
        hyperbolic_rank_update(np.ascontiguousarray(np.linalg.cholesky(spd(rng, 5))), np.ones((5, 1)), 1)


def test_downdate_past_positive_definiteness_leaves_the_factor_untouched() -> None:
    rng = np.random.default_rng(1)
    L = np.linalg.cholesky(spd(rng, 30))
    before = L.copy()
    assert chol_rank_update(L, rng.standard_normal((30, 3)) * 50, -1, block=7) is None
    assert np.array_equal(L, before)


def clustered(rng: np.random.Generator, n: int, d: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, c, n)
    F = rng.normal(size=(c, d))[y] + rng.normal(size=(n, 8)) @ rng.normal(size=(8, d)) * 0.5
    return l2_normalize(F + rng.normal(size=(n, d)) * 0.3), y


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("gamma", [1.0, 1e-2])
def test_random_stream_without_resets_stays_on_solve_head(gamma: float, kernel: FactorKernel) -> None:
    """Adds and deletes of ranks 1..40 (both W paths: r < c uses the labels, r >= c the c-column
    solve), no resets: W stays within FAST_HEAD_TOL of solve_head, and a reset restores its bits."""
    rng = np.random.default_rng(3)
    d, c = 40, 6
    F, y = clustered(rng, 900, d, c)
    Q = Quantizer().quantize(F)
    head = TrackedHead(ExactLedger(d, c), gamma=gamma, reset_every=10**9, drift_threshold=np.inf,
                       tracker="cholesky", factor_kernel=kernel)
    assert isinstance(head.tracker, CholeskyTracker) and head.tracker.kernel == kernel
    held: list[int] = []
    free = list(range(len(Q)))
    for _ in range(400):
        r = int(rng.choice([1, 1, 1, 3, 8, 40]))
        if held and (rng.random() < 0.45 or not free):
            idx = [held.pop(int(rng.integers(len(held)))) for _ in range(min(r, len(held)))]
            rep = head.delete(Q[idx], y[idx])
            free.extend(idx)
        else:
            idx = [free.pop(int(rng.integers(len(free)))) for _ in range(min(r, len(free)))]
            rep = head.add(Q[idx], y[idx])
            held.extend(idx)
        assert rep.reset_reason == "" or rep.reset_reason.startswith("downdate")
    canonical = solve_head(head.ledger, gamma)
    dev = relative_deviation(head.weights, canonical)
    assert dev < FAST_HEAD_TOL, dev
    report = head.reset("test")
    assert report.drift == pytest.approx(dev)
    assert np.array_equal(head.weights, canonical)
    assert np.array_equal(head.tracker.T, posterior_inverse(head.ledger, gamma))  # what exact heads publish


@pytest.mark.parametrize("kernel", KERNELS)
def test_columns_without_data_stay_exactly_zero_and_the_rest_on_solve_head(kernel: FactorKernel) -> None:
    """A head of 30 columns whose data uses a few (an auto-created head): the update runs on the
    live columns only. The unused columns stay exactly 0.0, a class that first appears late joins
    them, a class whose samples all leave goes on as a live column, and W stays within
    FAST_HEAD_TOL of solve_head, by either W path (ranks below and above the live count)."""
    rng = np.random.default_rng(11)
    d, c = 40, 30
    F, y = clustered(rng, 600, d, 4)
    y = np.where(np.arange(600) < 300, y, y + 10)  # classes 10..13 first appear half way
    Q = Quantizer().quantize(F)
    head = TrackedHead(ExactLedger(d, c), gamma=1.0, reset_every=10**9, drift_threshold=np.inf,
                       tracker="cholesky", factor_kernel=kernel)
    for s0 in range(0, 600, 25):
        r = int(rng.choice([1, 2, 25]))
        head.add(Q[s0:s0 + r], y[s0:s0 + r])
        head.add(Q[s0 + r:s0 + 25], y[s0 + r:s0 + 25])
    gone = np.flatnonzero(y == 11)
    for i in range(0, len(gone), 3):
        head.delete(Q[gone[i:i + 3]], y[gone[i:i + 3]])
    W = head.weights
    unused = np.setdiff1d(np.arange(c), np.unique(y))
    assert np.all(W[:, unused] == 0.0)
    assert np.any(W[:, 13] != 0.0)
    canonical = solve_head(head.ledger, 1.0)
    assert np.all(canonical[:, 11] == 0.0)  # no sample left: exactly zero in the canonical head
    assert relative_deviation(W, canonical) < FAST_HEAD_TOL
    head.reset("test")
    assert np.array_equal(head.weights, canonical)
    head.add(Q[:2], np.array([29, 29]))  # after the reset, a column unused so far
    assert relative_deviation(head.weights, solve_head(head.ledger, 1.0)) < FAST_HEAD_TOL
    assert np.all(head.weights[:, 11] == 0.0)  # not live since the reset, and no data came


@pytest.mark.parametrize("kernel", KERNELS)
def test_infeasible_downdate_is_refused_and_state_unchanged(kernel: FactorKernel) -> None:
    rng = np.random.default_rng(6)
    F, y = clustered(rng, 40, 6, 2)
    led = ExactLedger.from_rows(Quantizer().quantize(F), y, n_outputs=2)
    tr = CholeskyTracker.from_ledger(led, gamma=0.1, kernel=kernel)
    L0, W0 = tr.L.copy(), tr.W.copy()
    U = np.full((1, 6), 5.0)  # never added, far too large: H - U^T U is indefinite
    chk = tr.delete(U, U.T @ one_hot([0], 2))
    assert not chk.feasible and "infeasible" in chk.reason
    assert np.array_equal(tr.L, L0) and np.array_equal(tr.W, W0)
    assert not tr.check_downdate(U).feasible


@pytest.mark.skipif(cholesky_tracker.hyhound is None, reason="hyhound has no wheel for this platform")
def test_a_failed_in_place_downdate_at_the_margin_restores_the_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    """hyhound downdates in place: where the Lemma-1 pivot is small, the tracker keeps a copy of L, so
    a factor downdate that fails anyway (rounding at the margin; simulated here) leaves L and W as
    they were and is refused, and the head resets from the ledger."""
    d = 6
    Q = Quantizer().quantize(l2_normalize(np.arange(1, d + 1, dtype=float)))
    head = TrackedHead(ExactLedger(d, 2), gamma=1e-5, reset_every=10**6, drift_threshold=np.inf,
                       tracker="cholesky", factor_kernel="hyhound")
    head.add(Q, [1])
    tr = head.tracker
    assert isinstance(tr, CholeskyTracker)
    U = Q.astype(float) * 2.0 ** -head.ledger.frac_bits
    chk = tr.check_downdate(U)
    assert chk.feasible and chk.min_pivot < cholesky_tracker.BACKUP_BELOW_PIVOT  # 1 - leverage ~ gamma
    L0, W0 = tr.L.copy(), tr.W.copy()

    def failing(L: np.ndarray, V: np.ndarray, sigma: int) -> bool:
        L[np.diag_indices_from(L)] = np.nan
        return False

    monkeypatch.setattr(cholesky_tracker, "hyperbolic_rank_update", failing)
    chk = tr.delete(U, U.T @ one_hot([1], 2), one_hot([1], 2))
    assert not chk.feasible and "lost positive definiteness" in chk.reason
    assert np.array_equal(tr.L, L0) and np.array_equal(tr.W, W0)


@pytest.mark.parametrize("kernel", KERNELS)
def test_tracked_head_falls_back_to_a_reset_on_a_lost_downdate(kernel: FactorKernel) -> None:
    """With a tiny gamma, deleting the only sample leaves I - u H^-1 u^T ~ gamma: the tracker refuses
    (ill-conditioned), the head resets from the exact ledger instead of serving garbage."""
    d = 6
    Q = Quantizer().quantize(l2_normalize(np.arange(1, d + 1, dtype=float)))
    head = TrackedHead(ExactLedger(d, 2), gamma=1e-12, reset_every=10**6, drift_threshold=np.inf,
                       tracker="cholesky", factor_kernel=kernel)
    head.add(Q, [1])
    r = head.delete(Q, [1])
    assert r.mode == "exact" and r.reset_reason.startswith("downdate") and "ill-conditioned" in r.reset_reason
    assert np.array_equal(head.weights, np.zeros((d, 2)))
    assert np.isfinite(head.tracker.L).all()


def test_policies_are_the_trackers_common_ones() -> None:
    """Periodic resets and the drift check work the same with the factor form."""
    rng = np.random.default_rng(4)
    F, y = clustered(rng, 60, 12, 3)
    Q = Quantizer().quantize(F)
    head = TrackedHead(ExactLedger(12, 3), gamma=1.0, reset_every=10, drift_threshold=np.inf, tracker="cholesky")
    reports = [head.add(Q[i], y[i:i + 1]) for i in range(25)]
    assert [i for i, r in enumerate(reports) if r.reset_reason] == [9, 19]
    head = TrackedHead(ExactLedger(12, 3), gamma=1.0, reset_every=10**6, drift_threshold=0.0, drift_check_every=1,
                       tracker="cholesky")
    head.add(Q[:5], y[:5])
    head.tracker.W += 1e-3  # corrupt the fast head: the estimate must catch it
    r = head.add(Q[5:6], y[5:6])
    assert r.mode == "exact" and r.reset_reason.startswith("drift")
    assert np.array_equal(head.weights, solve_head(head.ledger, 1.0))


def test_unknown_tracker_or_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="tracker"):
        TrackedHead(ExactLedger(3, 1), tracker="qr")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kernel"):
        TrackedHead(ExactLedger(3, 1), tracker="cholesky", factor_kernel="lapack")  # type: ignore[arg-type]


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_reset_keeps_the_factor_in_fortran_order_whatever_scipy_returns(
        kernel: FactorKernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """hyhound updates L in place only in Fortran order; a newer SciPy's cholesky returned C order
    (seen on the GPU machine: the ledger's first add after a reset failed). The reset must not
    depend on the order SciPy picks."""
    rng = np.random.default_rng(11)
    F, y = clustered(rng, 30, 8, 3)
    led = ExactLedger.from_rows(Quantizer().quantize(F), y, n_outputs=3)
    real = cholesky_tracker.cholesky_factor
    monkeypatch.setattr(cholesky_tracker, "cholesky_factor",
                        lambda stats, gamma: np.ascontiguousarray(real(stats, gamma)))
    tr = CholeskyTracker.from_ledger(led, gamma=0.1, kernel=kernel)
    tr.reset(led)
    assert tr.L.flags.f_contiguous
    Q = Quantizer().quantize(l2_normalize(rng.standard_normal((2, 8))))
    U = Q.astype(float) * 2.0 ** -led.frac_bits
    tr.add(U, U.T @ one_hot([0, 2], 3), one_hot([0, 2], 3))
    led.add(Q, [0, 2])
    assert relative_deviation(tr.W, solve_head(led, 0.1)) < FAST_HEAD_TOL


@pytest.mark.parametrize("tracker", ["cholesky", "smw"])
def test_with_the_labels_dg_is_not_needed(tracker: str) -> None:
    """The trackers update W from the rows' labels (dG = U^T Y is never read then): with dG left
    out, adds and deletes of every width (fewer rows than live columns, and more) give the W that
    dG gives, within rounding; with neither dG nor Y an update is refused before anything moves."""
    rng = np.random.default_rng(12)
    F, y = clustered(rng, 80, 10, 4)
    led = ExactLedger.from_rows(Quantizer().quantize(F[:40]), y[:40], n_outputs=4)
    make = (lambda: CholeskyTracker.from_ledger(led, gamma=0.5, hold_rows=8)) if tracker == "cholesky" else \
        (lambda: TrackedHead(led.copy(), gamma=0.5, tracker="smw").tracker)
    with_dg, without = make(), make()
    U = l2_normalize(F[40:80])
    for rows, sign in ((slice(0, 2), 1), (slice(2, 12), 1), (slice(0, 1), -1), (slice(12, 30), 1), (slice(3, 9), -1)):
        Y = one_hot(y[40:80][rows], 4)
        for tr, dG in ((with_dg, U[rows].T @ Y), (without, None)):
            (tr.add if sign > 0 else tr.delete)(U[rows], dG, Y)
        assert np.allclose(without.W, with_dg.W, rtol=0, atol=1e-12 * np.abs(with_dg.W).max())
    W0 = without.W.copy()
    with pytest.raises(ValueError, match="dG or the rows' labels"):
        without.add(U[:1], None)
    assert np.array_equal(without.W, W0)
