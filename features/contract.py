"""The feature contract: how an input becomes the exact integer row a head is trained on.

A head's features are ``q = rint(f * 2^k)`` of the (optionally L2-normalized) backbone output,
with every component inside a declared bound. Training (the featurizer) and serving must apply
*the same* contract, or served predictions silently differ from what the head learned; both
import it from here and nowhere else.
"""

from __future__ import annotations

import math

import numpy as np

from unlearn.ledger import QuantizationError, Quantizer, l2_normalize

__all__ = ["FeatureRejected", "quantize_feature_row", "quantizer"]


class FeatureRejected(ValueError):
    """A feature vector the contract refuses: ``reason`` (a reason code) and ``detail``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


_QUANTIZERS: dict[tuple[int, float], Quantizer] = {}


def quantizer(frac_bits: int, bound: float) -> Quantizer:
    """The (cached) quantizer of a grid 2^-frac_bits and a bound."""
    key = (int(frac_bits), float(bound))
    qz = _QUANTIZERS.get(key)
    if qz is None:
        qz = _QUANTIZERS[key] = Quantizer(frac_bits, bound)
    return qz


def quantize_feature_row(f: np.ndarray, frac_bits: int, bound: float = 1.0, normalize: bool = True) -> np.ndarray:
    """q for ONE feature vector: ``Quantizer(k, bound).quantize(l2_normalize(f))`` in float64 (no
    normalization when ``normalize`` is False). Raises :class:`FeatureRejected`
    (``non_finite_feature``, ``feature_out_of_bound``); never clips. Public so a client can
    reproduce its q exactly."""
    x = np.asarray(f, dtype=np.float64).reshape(-1)
    if not np.isfinite(x).all():
        raise FeatureRejected("non_finite_feature", "a feature is NaN or infinite")
    if normalize:
        with np.errstate(over="ignore"):
            ss = float(np.dot(x, x))
        if not math.isfinite(ss):
            raise FeatureRejected("non_finite_feature", "the squared L2 norm overflows float64")
        x = l2_normalize(x)[0]
    try:
        return quantizer(frac_bits, bound).quantize(x)[0]
    except QuantizationError as exc:
        raise FeatureRejected("feature_out_of_bound", str(exc)) from None
