"""The live head (ledger/tracked_head.py): drift over a long stream and the reset policy (periodic,
drift estimate, ill-conditioned downdate, packed statistics) back to the canonical bits; a reset
computed elsewhere from a copy of the ledger (mark, adopt)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ledger.test_solve import clustered_features
from unlearn.ledger import (
    ExactLedger,
    Quantizer,
    TrackedHead,
    l2_normalize,
    relative_deviation,
    solve_head,
)
from unlearn.ledger.cholesky_tracker import CholeskyTracker
from unlearn.ledger.smw_tracker import SMWTracker


def _stream(rng: np.random.Generator, head: TrackedHead, Q: np.ndarray, y: np.ndarray, steps: int) -> list[int]:
    retained: list[int] = []
    free = list(range(len(Q)))
    for _ in range(steps):
        r = int(rng.choice([1, 1, 1, 4, 16]))
        if retained and (rng.random() < 0.45 or not free):
            k = min(r, len(retained))
            pick = sorted(rng.choice(len(retained), size=k, replace=False), reverse=True)
            idx = [retained.pop(int(p)) for p in pick]
            head.delete(Q[idx], y[idx])
            free.extend(idx)
        elif free:
            k = min(r, len(free))
            pick = sorted(rng.choice(len(free), size=k, replace=False), reverse=True)
            idx = [free.pop(int(p)) for p in pick]
            head.add(Q[idx], y[idx])
            retained.extend(idx)
    return retained


def test_smw_long_stream_drift_is_small_and_reset_restores_canonical_bits() -> None:
    rng = np.random.default_rng(3)
    d, c = 32, 5
    F, y = clustered_features(rng, 600, d, c)
    Q = Quantizer().quantize(F)
    head = TrackedHead(ExactLedger(d, c), gamma=1.0, reset_every=10**9, drift_threshold=np.inf)
    retained = _stream(rng, head, Q, y, 1500)
    canonical = solve_head(head.ledger, 1.0)
    drift = relative_deviation(head.weights, canonical)
    assert head.mode == "fast"
    assert 0 < drift < 1e-8  # float rounding, not an algebra error
    report = head.reset("test")
    assert report.mode == "exact" and report.drift == pytest.approx(drift)
    assert np.array_equal(head.weights, canonical)
    # and the ledger itself is the from-scratch ledger of the retained multiset
    fresh = ExactLedger(d, c)
    fresh.add(Q[sorted(retained)], y[sorted(retained)])
    assert fresh.digest() == head.ledger.digest()


def test_tracked_head_periodic_reset_policy() -> None:
    rng = np.random.default_rng(4)
    F, y = clustered_features(rng, 100, 12, 3)
    Q = Quantizer().quantize(F)
    head = TrackedHead(ExactLedger(12, 3), gamma=1.0, reset_every=10, drift_threshold=np.inf)
    reports = [head.add(Q[i], y[i:i + 1]) for i in range(25)]
    resets = [i for i, r in enumerate(reports) if r.reset_reason]
    assert resets == [9, 19]
    assert reports[9].mode == "exact" and reports[10].mode == "fast"


def test_drift_threshold_triggers_reset() -> None:
    rng = np.random.default_rng(5)
    F, y = clustered_features(rng, 50, 8, 2)
    Q = Quantizer().quantize(F)
    head = TrackedHead(ExactLedger(8, 2), gamma=1.0, reset_every=10**6, drift_threshold=0.0, drift_check_every=1)
    head.add(Q[:5], y[:5])
    r = head.add(Q[5:10], y[5:10])
    assert (r.mode == "exact" and "drift" in r.reset_reason) or r.reset_reason == ""  # zero residual is possible
    head.tracker.W += 1e-3  # corrupt the fast head: the estimate must catch it
    r = head.add(Q[10:11], y[10:11])
    assert r.mode == "exact" and r.reset_reason.startswith("drift")
    assert np.array_equal(head.weights, solve_head(head.ledger, 1.0))


def test_ill_conditioned_downdate_falls_back_to_reset() -> None:
    """With a tiny gamma, deleting the only sample makes I - u T u^T ~ gamma: refuse SMW, reset."""
    d = 6
    q = Quantizer()
    Q = q.quantize(l2_normalize(np.arange(1, d + 1, dtype=float)))
    head = TrackedHead(ExactLedger(d, 2), gamma=1e-12, reset_every=10**6, drift_threshold=np.inf)
    head.add(Q, [1])
    r = head.delete(Q, [1])
    assert r.mode == "exact" and "ill-conditioned" in r.reset_reason
    assert np.array_equal(head.weights, np.zeros((d, 2)))


def test_packed_statistics_update_resets_to_canonical() -> None:
    rng = np.random.default_rng(7)
    F, y = clustered_features(rng, 60, 10, 3)
    Q = Quantizer().quantize(F)
    head = TrackedHead(ExactLedger(10, 3), gamma=1.0)
    head.add(Q[:30], y[:30])
    head.absorb(ExactLedger.from_rows(Q[30:], y[30:], n_outputs=3), +1)
    head.absorb(ExactLedger.from_rows(Q[:10], y[:10], n_outputs=3), -1)
    ref = ExactLedger.from_rows(Q[10:], y[10:], n_outputs=3)
    assert head.ledger.digest() == ref.digest()
    assert np.array_equal(head.weights, solve_head(ref, 1.0))


# --------------------------------------------------------------------------- resets computed elsewhere
def _fast_head(seed: int, d: int = 16, c: int = 4,
               kind: str = "cholesky") -> tuple[TrackedHead, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    F, y = clustered_features(rng, 300, d, c)
    Q = Quantizer().quantize(F)
    head = TrackedHead(ExactLedger(d, c), gamma=1.0, reset_every=10**9, drift_threshold=np.inf,
                       tracker=kind)  # type: ignore[arg-type]
    _stream(rng, head, Q[:150], y[:150], 200)
    assert head.mode == "fast"
    return head, Q, y


def _canonical(head: TrackedHead, ledger: ExactLedger) -> CholeskyTracker | SMWTracker:
    """What the ledger processor's thread computes from a copy: a tracker of the head's kind."""
    kind = type(head.tracker)
    return kind.from_ledger(ledger, head.gamma)


def test_a_reset_adopted_with_no_rows_since_its_mark_is_the_reset_bit_for_bit() -> None:
    """mark -> canonical tracker of a copy of the ledger -> adopt gives the served head, its
    posterior and the drift it reports exactly as ``reset`` at the mark would."""
    a, _, _ = _fast_head(11)
    b, _, _ = _fast_head(11)
    mark = a.mark()
    assert mark is not None
    copy = a.ledger.copy()
    tracker = _canonical(a, copy)
    rep = a.adopt(tracker, relative_deviation(a.weights, tracker.W), mark)
    ref = b.reset("timer")
    assert rep is not None and rep.mode == a.mode == "exact" and rep.reset_reason == "timer" and rep.measured
    assert rep.drift == ref.drift > 0
    assert np.array_equal(a.weights, b.weights) and np.array_equal(a.posterior, b.posterior)
    assert np.array_equal(a.weights, solve_head(a.ledger, 1.0))


@pytest.mark.parametrize("kind", ["cholesky", "smw"])
def test_an_adopted_reset_moves_by_the_rows_tracked_since_its_mark(kind: str) -> None:
    """Adds and deletes after the mark (each tracked on its own) are taken by the adopted head in
    one update: it is fast, as close to the canonical head of the ledger now as a fast head
    is, the ledger untouched, and the next reset is canonical bit for bit."""
    for seed in range(5):
        head, Q, y = _fast_head(20 + seed, kind=kind)
        mark = head.mark()
        assert mark is not None
        copy = head.ledger.copy()
        before = relative_deviation(head.weights, solve_head(copy, 1.0))
        rng = np.random.default_rng(seed)
        _stream(rng, head, Q[150:], y[150:], 40)
        digest = head.ledger.digest()
        tracker = _canonical(head, copy)
        rep = head.adopt(tracker, before, mark)
        assert rep is not None and rep.mode == head.mode == "fast" and rep.drift == before
        assert head.tracker is tracker and tracker.updates_since_reset <= 2  # adds, then deletes
        assert head.ledger.digest() == digest
        assert relative_deviation(head.weights, solve_head(head.ledger, 1.0)) < 1e-9
        head.reset("check")
        assert np.array_equal(head.weights, solve_head(head.ledger, 1.0))


def test_an_adopted_reset_takes_classes_declared_since_its_mark() -> None:
    head, Q, _ = _fast_head(31, c=2)
    mark = head.mark()
    assert mark is not None
    copy = head.ledger.copy()
    head.add(Q[200:203], [4, 4, 1])  # class 4 grows the ledger's outputs to 5
    tracker = _canonical(head, copy)
    assert tracker.W.shape[1] == 2
    assert head.adopt(tracker, 0.0, mark) is not None
    canonical = solve_head(head.ledger, 1.0)
    assert head.weights.shape == canonical.shape == (16, 5)
    assert relative_deviation(head.weights, canonical) < 1e-9


def test_a_reset_since_the_mark_or_a_newer_mark_voids_it() -> None:
    """A reset after the mark (a heads rotation, a refused downdate, coalesced rows) leaves a
    head newer than the copy: adopting the copy's head would serve older data. Only the latest
    mark counts, and no mark is taken while rows wait for ``sync``."""
    head, Q, y = _fast_head(41)
    mark = head.mark()
    assert mark is not None
    copy = head.ledger.copy()
    head.add(Q[200:202], y[200:202])
    head.reset("heads rotation")
    served = head.weights.copy()
    assert head.adopt(_canonical(head, copy), 0.0, mark) is None
    assert head.mode == "exact" and np.array_equal(head.weights, served)

    head.add(Q[202:204], y[202:204])
    first = head.mark()
    second = head.mark()
    assert first is not None and second is not None and first != second
    assert head.adopt(_canonical(head, head.ledger.copy()), 0.0, first) is None
    assert head.adopt(_canonical(head, head.ledger.copy()), 0.0, second) is not None
    assert head.adopt(_canonical(head, head.ledger.copy()), 0.0, second) is None  # once

    head.add(Q[204:206], y[204:206])
    head.apply(Q[206:208], y[206:208], +1)  # in the ledger, not yet in the fast head
    assert head.mark() is None
    head.sync()
    assert head.mark() is not None


def test_a_drift_measured_at_a_released_mark_stands_for_a_drift_check() -> None:
    """A reset computed elsewhere and not adopted still measured the fast head: that counts as
    a drift check (the next estimate is due ``drift_check_every`` updates later), and a drift
    past the threshold makes the next sync reset."""
    head, Q, y = _fast_head(51)
    head.drift_check_every, head.drift_threshold = 4, 1e-3
    calls: list[int] = []
    estimate = head.tracker.drift_estimate

    def counted(stats: object) -> float:
        calls.append(head.tracker.updates_since_reset)
        return estimate(stats)  # type: ignore[arg-type]
    head.tracker.drift_estimate = counted  # type: ignore[method-assign]
    for i in range(3):  # off the multiples of 4 the estimate would otherwise keep
        if head.tracker.updates_since_reset % 4 != 1:
            head.add(Q[230 + i:231 + i], y[230 + i:231 + i])
    assert head.tracker.updates_since_reset % 4 == 1
    calls.clear()
    t0 = head.tracker.updates_since_reset
    mark = head.mark()
    assert mark is not None
    head.release(mark, drift=1e-12)
    for i in range(9):
        head.apply(Q[200 + i:201 + i], y[200 + i:201 + i], +1)
        assert head.sync().reset_reason == ""
    assert calls == [t0 + 4, t0 + 8], "checked 4 and 8 updates after the measurement, not at multiples of 4"
    mark = head.mark()
    assert mark is not None
    head.release(mark, drift=1.0)
    head.apply(Q[220:221], y[220:221], +1)
    rep = head.sync()
    assert rep.mode == "exact" and rep.reset_reason.startswith("drift measured 1 >")
    assert np.array_equal(head.weights, solve_head(head.ledger, 1.0))
