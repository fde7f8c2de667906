"""Rows that wait outside the fast head's Cholesky factor (ledger/waiting_rows.py,
``CholeskyTracker(hold_rows=...)``): W through them against solve_head on the exact ledger, the
factor after they are folded against a fresh factorization, the Lemma-1 check through them, and a
fold that fails."""

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
    cholesky_factor,
    cholesky_tracker,
    l2_normalize,
    one_hot,
    posterior_inverse,
    relative_deviation,
    solve_head,
)
from unlearn.ledger.cholesky_tracker import FactorKernel
from unlearn.ledger.waiting_rows import WaitingRows

#: The fast head's documented tolerance (docs/design.md section 2), as in test_cholesky_tracker.py.
FAST_HEAD_TOL = 1e-9

KERNELS = ["blocked", pytest.param("hyhound", marks=pytest.mark.skipif(
    cholesky_tracker.hyhound is None, reason="hyhound has no wheel for this platform"))]


def clustered(rng: np.random.Generator, n: int, d: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, c, n)
    F = rng.normal(size=(c, d))[y] + rng.normal(size=(n, 4)) @ rng.normal(size=(4, d)) * 0.5
    return l2_normalize(F + rng.normal(size=(n, d)) * 0.3), y


def waiting_head(seed: int, n: int, d: int, c: int, gamma: float, hold: int,
                 kernel: FactorKernel = "blocked") -> tuple[TrackedHead, np.ndarray, np.ndarray]:
    """A head whose fast factor lets ``hold`` rows wait, and ``n`` quantized rows for it."""
    F, y = clustered(np.random.default_rng(seed), n, d, c)
    head = TrackedHead(ExactLedger(d, c), gamma=gamma, reset_every=10**9, drift_threshold=np.inf,
                       tracker="cholesky", factor_kernel=kernel, factor_hold_rows=hold)
    return head, Quantizer().quantize(F), y


def test_the_correction_is_h_inverse_against_a_dense_solve() -> None:
    """Woodbury with added and deleted rows: L^T (Z - P K^-1 P^T Z) = H^-1 X for Z = L^-1 X."""
    rng = np.random.default_rng(2)
    d = 12
    A = rng.standard_normal((30, d))
    H0 = A.T @ A + np.eye(d)
    L = np.linalg.cholesky(H0)
    w = WaitingRows(d)
    added, deleted = rng.standard_normal((5, d)), A[:3] * 0.5  # deleting half of rows H0 holds stays PD
    w.append(added, +1, np.linalg.solve(L, added.T))
    w.append(deleted, -1, np.linalg.solve(L, deleted.T))
    H = H0 + added.T @ added - deleted.T @ deleted
    X = rng.standard_normal((d, 3))
    got = np.linalg.solve(L.T, w.correct(np.linalg.solve(L, X)))
    assert np.allclose(got, np.linalg.solve(H, X), rtol=1e-10, atol=1e-12)
    first, signs, rest = w.split(6)
    assert signs.tolist() == [1, 1, 1, 1, 1, -1] and rest.tolist() == [6, 7]  # added first, oldest first
    assert np.array_equal(first[:5], added) and np.array_equal(first[5], deleted[0])


SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("kernel", KERNELS)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), hold=st.sampled_from([1, 8, 40, 500]),
       ops=st.lists(st.tuples(st.sampled_from(["add", "delete", "sync", "fold"]), st.integers(1, 12)), min_size=1,
                    max_size=40))
def test_any_stream_with_folds_at_any_time_stays_on_solve_head(kernel: FactorKernel, seed: int, hold: int,
                                                               ops: list[tuple[str, int]]) -> None:
    """Adds and deletes applied and synced in any grouping (a sync with deletes lets its adds
    wait), deletes of rows that wait or that the factor holds, and partial folds at any time:
    after every sync W is within FAST_HEAD_TOL of solve_head and no more than ``hold``
    rows wait; once everything is folded the factor is the ledger's (as a fresh factorization)
    and T the posterior inverse."""
    rng = np.random.default_rng(seed)
    head, Q, y = waiting_head(seed, 600, 64, 4, 0.5, hold, kernel)  # a sync of 32 rows or more resets (coalesced)
    held: list[int] = []
    free = list(range(len(Q)))
    for op, n in [*ops, ("sync", 0)]:
        if op == "fold":
            waited, W = len(head.tracker.waiting), head.weights.copy()  # type: ignore[union-attr]
            assert head.fold_waiting(n) == min(n, waited)
            assert np.array_equal(head.weights, W)  # a fold does not move W (rows applied since may wait for a sync)
            continue
        elif op == "delete" and held:
            idx = [held.pop(int(rng.integers(len(held)))) for _ in range(min(n, len(held)))]
            head.apply(Q[idx], y[idx], -1)
            free.extend(idx)
            continue
        elif op in ("add", "delete"):
            idx = [free.pop(int(rng.integers(len(free)))) for _ in range(min(n, len(free)))]
            head.apply(Q[idx], y[idx], +1)
            held.extend(idx)
            continue
        else:
            rep = head.sync()
            assert rep.reset_reason == "" or rep.reset_reason.startswith(("downdate", "coalesced")), rep
        tr = head.tracker
        assert isinstance(tr, CholeskyTracker) and len(tr.waiting) <= hold
        assert relative_deviation(head.weights, solve_head(head.ledger, 0.5)) < FAST_HEAD_TOL
    W = head.weights.copy()
    tr.fold_waiting()
    assert len(tr.waiting) == 0 and np.array_equal(tr.W, W)  # a fold does not move W
    ref = cholesky_factor(head.ledger, 0.5)
    assert np.allclose(np.tril(tr.L), ref, rtol=0, atol=1e-10 * np.abs(ref).max())
    assert np.allclose(tr.T, posterior_inverse(head.ledger, 0.5), rtol=0, atol=1e-9)


def sync(head: TrackedHead, adds: tuple[np.ndarray, np.ndarray], deletes: tuple[np.ndarray, np.ndarray]) -> None:
    """One sync of ``adds`` then ``deletes`` (as the ledger worker's poll): the adds may wait."""
    head.apply(*adds, +1)
    head.apply(*deletes, -1)
    assert head.sync().reset_reason == ""


@pytest.mark.parametrize("kernel", KERNELS)
def test_adds_wait_only_with_a_delete_behind_them_and_within_the_hold(kernel: FactorKernel) -> None:
    head, Q, y = waiting_head(5, 200, 48, 3, 1.0, 20, kernel)
    tr = head.tracker
    assert isinstance(tr, CholeskyTracker)
    head.add(Q[:10], y[:10])  # nothing behind them: the factor takes them at once
    assert len(tr.waiting) == 0
    L0 = tr.L.copy()
    sync(head, (Q[10:20], y[10:20]), (Q[12:14], y[12:14]))  # a delete of rows that wait themselves
    assert len(tr.waiting) == 12 and np.array_equal(tr.L, L0)  # the factor did not move
    assert relative_deviation(head.weights, solve_head(head.ledger, 1.0)) < FAST_HEAD_TOL
    sync(head, (Q[20:28], y[20:28]), (Q[:1], y[:1]))  # 12 + 8 > 20: everything folds, these go in at once
    assert len(tr.waiting) == 0
    ref = cholesky_factor(head.ledger, 1.0)
    assert np.allclose(np.tril(tr.L), ref, rtol=0, atol=1e-10 * np.abs(ref).max())
    assert relative_deviation(head.weights, solve_head(head.ledger, 1.0)) < FAST_HEAD_TOL
    # a holder that found the hold full is busy: rows wait again only after its next idle fold
    sync(head, (Q[30:32], y[30:32]), (Q[1:2], y[1:2]))
    assert len(tr.waiting) == 0
    assert head.fold_waiting(64) == 0
    sync(head, (Q[32:34], y[32:34]), (Q[2:3], y[2:3]))
    assert len(tr.waiting) == 3
    assert relative_deviation(head.weights, solve_head(head.ledger, 1.0)) < FAST_HEAD_TOL
    head.reset("test")
    assert len(head.tracker.waiting) == 0  # type: ignore[union-attr]
    assert np.array_equal(head.weights, solve_head(head.ledger, 1.0))


def test_after_a_partial_fold_the_rows_left_wait_against_the_new_factor() -> None:
    """A fold of some of the waiting rows changes L: the rows left must be taken against the new L
    (their P = L^-1 V^T again), or every update after the fold moves W by a wrong H^-1."""
    head, Q, y = waiting_head(1, 100, 64, 4, 0.5, 60)
    head.add(Q[50:60], y[50:60])
    sync(head, (Q[:20], y[:20]), (Q[50:51], y[50:51]))
    assert head.fold_waiting(7) == 7
    sync(head, (Q[20:25], y[20:25]), (Q[10:13], y[10:13]))  # rows that still wait
    assert relative_deviation(head.weights, solve_head(head.ledger, 0.5)) < FAST_HEAD_TOL
    sync(head, (Q[25:26], y[25:26]), (Q[:2], y[:2]))  # rows the partial fold took
    assert len(head.tracker.waiting) == 25  # type: ignore[union-attr]
    assert relative_deviation(head.weights, solve_head(head.ledger, 0.5)) < FAST_HEAD_TOL


def test_an_infeasible_delete_is_refused_through_the_waiting_rows() -> None:
    """The Lemma-1 check sees the waiting rows: deleting a row that only waits is feasible, a
    delete past what H holds is refused, and a refusal changes nothing."""
    rng = np.random.default_rng(6)
    F, y = clustered(rng, 40, 6, 2)
    led = ExactLedger.from_rows(Quantizer().quantize(F[:20]), y[:20], n_outputs=2)
    tr = CholeskyTracker.from_ledger(led, gamma=0.1, kernel="blocked", hold_rows=100)
    U = l2_normalize(F[20:24])
    tr.add(U, U.T @ one_hot(y[20:24], 2), one_hot(y[20:24], 2))
    L0, W0, waited = tr.L.copy(), tr.W.copy(), len(tr.waiting)
    big = np.full((1, 6), 5.0)
    chk = tr.delete(big, big.T @ one_hot([0], 2))
    assert not chk.feasible and "infeasible" in chk.reason
    assert np.array_equal(tr.L, L0) and np.array_equal(tr.W, W0) and len(tr.waiting) == waited
    assert tr.check_downdate(U[:2]).feasible  # rows that only wait are in H
    alone = CholeskyTracker.from_ledger(led, gamma=0.1, kernel="blocked")
    # without the waiting rows, deleting 4 rows H does not hold is past PD for this small gamma
    assert tr.check_downdate(U).min_pivot > alone.check_downdate(U).min_pivot


def test_a_delete_near_the_margin_does_not_wait() -> None:
    """A delete whose Lemma-1 pivot is small is taken against the folded factor (as without
    waiting rows): the rows waiting before it are folded first."""
    d = 6
    Q = Quantizer().quantize(l2_normalize(np.arange(1, d + 1, dtype=float)))
    other = Quantizer().quantize(l2_normalize(np.ones(d)))
    head = TrackedHead(ExactLedger(d, 2), gamma=1e-5, reset_every=10**6, drift_threshold=np.inf,
                       tracker="cholesky", factor_kernel="blocked", factor_hold_rows=50)
    head.add(np.vstack([other, other]), [0, 0])
    sync(head, (Q, np.array([1])), (other, np.array([0])))  # the add of Q waits behind that delete
    tr = head.tracker
    assert isinstance(tr, CholeskyTracker) and len(tr.waiting) == 2
    head.add(other, [0])
    assert len(tr.waiting) == 0  # nothing behind it: the add did not wait, so it folded the others first
    sync(head, (other, np.array([0])), (Q, np.array([1])))  # 1 - leverage of Q ~ gamma: under BACKUP_BELOW_PIVOT
    assert len(tr.waiting) == 0
    assert relative_deviation(head.weights, solve_head(head.ledger, 1e-5)) < 1e-6


def test_a_fold_that_loses_definiteness_changes_nothing_and_the_next_sync_resets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    head, Q, y = waiting_head(8, 60, 40, 2, 1.0, 100)
    head.add(Q[:30], y[:30])
    sync(head, (Q[30:40], y[30:40]), (Q[:5], y[:5]))
    tr = head.tracker
    assert isinstance(tr, CholeskyTracker) and len(tr.waiting) == 15
    L0, W0 = tr.L.copy(), tr.W.copy()
    real = cholesky_tracker.chol_rank_update

    def failing_downdate(L: np.ndarray, V: np.ndarray, sigma: int, *args: object) -> object:
        if sigma < 0:
            L[:] = np.nan  # as an in-place kernel would leave it
            return None
        return real(L, V, sigma)

    monkeypatch.setattr(cholesky_tracker, "chol_rank_update", failing_downdate)
    assert head.fold_waiting(100) == 0
    assert np.array_equal(tr.L, L0) and np.array_equal(tr.W, W0) and len(tr.waiting) == 15
    assert head.mark() is None  # a reset is due: no reset elsewhere may start from this head
    monkeypatch.setattr(cholesky_tracker, "chol_rank_update", real)
    rep = head.sync()
    assert rep.mode == "exact" and "lost positive definiteness" in rep.reset_reason
    assert np.array_equal(head.weights, solve_head(head.ledger, 1.0))


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_delete_waits_alone_and_its_downdate_happens_at_the_fold(kernel: FactorKernel) -> None:
    """With nothing waiting, a delete away from the margin waits too (its receipt pays for no
    downdate): L does not move until ``fold_waiting``, W is the solve's head all along, and the
    fold brings L to the ledger's own factor. Without a hold it is downdated at once."""
    head, Q, y = waiting_head(11, 120, 32, 3, 1.0, 20, kernel)
    head.add(Q[:60], y[:60])
    tr = head.tracker
    assert isinstance(tr, CholeskyTracker) and len(tr.waiting) == 0
    L0 = tr.L.copy()
    head.delete(Q[3:4], y[3:4])
    assert len(tr.waiting) == 1 and np.array_equal(tr.L, L0)
    assert relative_deviation(head.weights, solve_head(head.ledger, 1.0)) < FAST_HEAD_TOL
    assert head.fold_waiting(64) == 1 and len(tr.waiting) == 0
    ref = cholesky_factor(head.ledger, 1.0)
    assert np.allclose(np.tril(tr.L), ref, rtol=0, atol=1e-10 * np.abs(ref).max())
    assert relative_deviation(head.weights, solve_head(head.ledger, 1.0)) < FAST_HEAD_TOL

    none, Q2, y2 = waiting_head(11, 120, 32, 3, 1.0, 0, kernel)
    none.add(Q2[:60], y2[:60])
    L1 = none.tracker.L.copy()  # type: ignore[union-attr]
    none.delete(Q2[3:4], y2[3:4])
    assert len(none.tracker.waiting) == 0 and not np.array_equal(none.tracker.L, L1)  # type: ignore[union-attr]
