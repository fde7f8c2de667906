"""Which classes a head may predict, and the scores of feature rows under a head version.

A prediction scores the classes that hold retained samples, and only those. A column
without one (``HeadUpdate.retained_classes``) has no data behind it: its weights are zero (or, on
a fast head, a float residue of zero), so its score is not a competing 0.0 but *no score*. Every
Python reader that predicts (serving, the SDK's ``predict_rows``, the demo) takes the predicted
class and the top k here, over the marked classes only, and reports the other classes' scores as
absent (NaN here, ``null`` in JSON); a head with no retained sample predicts nothing (``-1`` /
``null``). A head of target vectors (``retained_classes`` None) has every column as an output.
The rule is part of the head format (docs/formats.md, "Heads"), so clients in other languages
implement the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from unlearn.schemas.head import HeadUpdate

__all__ = [
    "HeadScores",
    "output_mask",
    "score_rows",
]


def output_mask(head: HeadUpdate) -> NDArray[np.bool_]:
    """bool (c,): the columns a prediction may name (every column for a head of target vectors)."""
    if head.retained_classes is None:
        return np.ones(head.c, dtype=bool)
    return np.asarray(head.retained_classes, dtype=bool)


@dataclass(frozen=True)
class HeadScores:
    """Scores of n inputs under one head version.

    ``scores`` (n, c) float64: f @ W on the output columns, NaN on the others. ``predicted`` (n,)
    int64: the argmax over the output columns (the lowest index among equal scores), -1 when
    the head has none. ``top`` (n, k) int64: the k best output columns, best first (k <= the
    number of output columns). ``mask``: which columns are outputs."""

    scores: NDArray[np.float64]
    predicted: NDArray[np.int64]
    top: NDArray[np.int64]
    mask: NDArray[np.bool_]

    def as_json(self, i: int) -> dict[str, Any]:
        """Input ``i``'s ``scores`` (null where absent), ``predicted_class`` and ``top_classes``."""
        row = self.scores[i]
        return {
            "scores": [float(v) if m else None for v, m in zip(row.tolist(), self.mask.tolist())],
            "predicted_class": int(self.predicted[i]) if self.predicted[i] >= 0 else None,
            "top_classes": self.top[i].tolist(),
        }


def score_rows(head: HeadUpdate, X: NDArray[np.float64], top_k: int = 1) -> HeadScores:
    """Scores of the feature rows X (n, d) under ``head``, ranked over its output columns only.
    ``top_k`` (>= 1) is clipped to the number of output columns."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != head.d:
        raise ValueError(f"X must have shape (n, {head.d}), got {X.shape}")
    mask = output_mask(head)
    raw = X @ np.asarray(head.weights, dtype=np.float64)
    scores = np.where(mask, raw, np.nan)
    cols = np.flatnonzero(mask)
    n = X.shape[0]
    k = min(top_k, cols.size)
    if k == 0:
        return HeadScores(scores, np.full(n, -1, np.int64), np.zeros((n, 0), np.int64), mask)
    # a stable sort of -score: the best first, the lowest class index first among equal scores
    order = np.argsort(-raw[:, cols], axis=1, kind="stable")[:, :k]
    top = cols[order].astype(np.int64)
    return HeadScores(scores, top[:, 0].copy(), top, mask)
