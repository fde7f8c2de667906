"""Predicting from a head update in the client, with serving's rules.

An app that reads head updates itself (``head_reader.read_heads`` / ``HeadFollower``) predicts
here instead of multiplying by W: inputs are quantized on the head contract's grid (the
featurizer's ``quantize_feature_row``, then dequantized), exactly as training rows and serving's
inputs are, and classes are ranked over those with retained samples only
(``schemas/head_scores.py``): a class without data never wins with a 0.0 score, and its score is
absent (NaN; ``HeadScores.as_json`` gives ``null``). The same answer as ``POST
/v1/heads/{head}/predict`` on the same head version, without a network hop.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from unlearn.features.contract import quantize_feature_row, quantizer
from unlearn.schemas.head import HeadUpdate
from unlearn.schemas.head_contract import HeadContract
from unlearn.schemas.head_scores import HeadScores, score_rows

__all__ = ["HeadScores", "featurize_rows", "predict_features"]


def featurize_rows(features: ArrayLike, contract: HeadContract | None = None, *, frac_bits: int = 30,
                   feature_bound: float = 1.0, normalize: bool = True) -> np.ndarray:
    """Feature vectors (n, d) -> the dequantized rows a head sees: the contract's normalization,
    bound and grid (without one, the keyword arguments: the settings' defaults). Raises
    ``features.contract.FeatureRejected`` for a row the featurizer would refuse."""
    F = np.asarray(features, dtype=np.float64)
    if F.ndim == 1:
        F = F[None, :]
    if contract is not None:
        frac_bits, feature_bound, normalize = contract.frac_bits, contract.feature_bound, contract.normalize
    Q = np.stack([quantize_feature_row(f, frac_bits, feature_bound, normalize) for f in F])
    return quantizer(frac_bits, feature_bound).dequantize(Q)


def predict_features(head: HeadUpdate, features: ArrayLike, contract: HeadContract | None = None, *,
                     top_k: int = 1, frac_bits: int = 30, feature_bound: float = 1.0,
                     normalize: bool = True) -> HeadScores:
    """Scores, predicted class and top ``top_k`` classes of feature vectors under ``head``, over
    the classes with retained samples only (serving's answer for the same head version)."""
    X = featurize_rows(features, contract, frac_bits=frac_bits, feature_bound=feature_bound, normalize=normalize)
    if X.shape[1] != head.d:
        raise ValueError(f"{X.shape[1]} features, head {head.head_id!r} has d = {head.d}")
    return score_rows(head, X, top_k)
