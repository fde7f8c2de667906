"""The Bayesian helpers (ledger/bayes.py): predictive variances and a zero KL certificate."""

from __future__ import annotations

import numpy as np

from tests.ledger.test_solve import clustered_features
from unlearn.ledger import (
    ExactLedger,
    Quantizer,
    kl_matrix_normal,
    posterior_inverse,
    predictive_variance,
    predictive_variance_cholesky,
    solve_head,
)


def test_posterior_helpers_and_zero_kl_certificate() -> None:
    rng = np.random.default_rng(8)
    F, y = clustered_features(rng, 80, 6, 3)
    Q = Quantizer().quantize(F)
    streamed = ExactLedger(6, 3)
    streamed.add(Q, y)
    streamed.delete(Q[:20], y[:20])
    retrained = ExactLedger.from_rows(Q[20:], y[20:], n_outputs=3)
    T1, T2 = posterior_inverse(streamed, 1.0), posterior_inverse(retrained, 1.0)
    W1, W2 = solve_head(streamed, 1.0), solve_head(retrained, 1.0)
    assert kl_matrix_normal(W1, T1, W2, T2) == 0.0  # identical bits -> exactly zero
    # the KL is a real metric: a float ledger with residue would not give 0
    assert kl_matrix_normal(W1, T1, W1 + 1e-3, T2) > 0
    probe = F[:5]
    v = predictive_variance(probe, T1)
    L = np.linalg.cholesky(np.linalg.inv(T1))
    assert np.allclose(v, predictive_variance_cholesky(probe, L), rtol=1e-9)
    assert np.allclose(predictive_variance(probe, T1, sigma2=2.0, include_noise=True), 2 * v + 2)
    assert (v > 0).all()
