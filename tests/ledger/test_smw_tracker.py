"""The inverse-form fast head (ledger/smw_tracker.py): rank-r SMW updates against the canonical solve,
and an infeasible downdate refused with the state unchanged."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ledger.test_solve import clustered_features
from unlearn.ledger import (
    ExactLedger,
    Quantizer,
    SMWTracker,
    one_hot,
    relative_deviation,
    solve_head,
)


def test_infeasible_downdate_is_refused_and_state_unchanged() -> None:
    rng = np.random.default_rng(6)
    F, y = clustered_features(rng, 40, 6, 2)
    Q = Quantizer().quantize(F)
    led = ExactLedger.from_rows(Q, y, n_outputs=2)
    tr = SMWTracker.from_ledger(led, gamma=0.1)
    T0, W0 = tr.T.copy(), tr.W.copy()
    U = np.full((1, 6), 5.0)  # never added, far too large: H - U^T U is indefinite
    chk = tr.delete(U, U.T @ one_hot([0], 2))
    assert not chk.feasible and "infeasible" in chk.reason
    assert np.array_equal(tr.T, T0) and np.array_equal(tr.W, W0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), r=st.integers(1, 6))
def test_smw_rank_r_add_then_delete_matches_solve(seed: int, r: int) -> None:
    rng = np.random.default_rng(seed)
    F, y = clustered_features(rng, 30 + r, 7, 3)
    q = Quantizer()
    Q = q.quantize(F)
    led = ExactLedger.from_rows(Q[:30], y[:30], n_outputs=3)
    tr = SMWTracker.from_ledger(led, gamma=0.5)
    U = q.dequantize(Q[30:])
    dG = U.T @ one_hot(y[30:], 3)
    tr.add(U, dG)
    led.add(Q[30:], y[30:])
    assert relative_deviation(tr.W, solve_head(led, 0.5)) < 1e-11
    assert tr.delete(U, dG).feasible
    led.delete(Q[30:], y[30:])
    assert relative_deviation(tr.W, solve_head(led, 0.5)) < 1e-11
