"""The centralized retrain (ledger/retrain.py): an independent reference."""

from __future__ import annotations

import numpy as np

from tests.ledger.test_solve import clustered_features
from unlearn.ledger import (
    centralized_retrain,
    one_hot,
)


def test_centralized_retrain_is_independent_reference() -> None:
    rng = np.random.default_rng(9)
    F, y = clustered_features(rng, 100, 5, 2)
    Y = one_hot(y, 2)
    W = centralized_retrain(F, Y, 0.3)
    assert np.allclose(W, np.linalg.solve(F.T @ F + 0.3 * np.eye(5), F.T @ Y), rtol=1e-10)
