"""The feature contract: backbone choice, fixed dimensions, exact feature rows and labels."""

from __future__ import annotations

import numpy as np
import pytest

from unlearn.features.contract import (
    DEFAULT_BACKBONES,
    FeatureRejected,
    fixed_dim,
    quantize_feature_row,
    quantize_label,
    resolve_backbone,
)
from unlearn.ledger import Quantizer, l2_normalize
from unlearn.ledger.quantization import MAX_CLASS_INDEX


def test_feature_row_is_the_quantized_l2_normalized_vector_and_never_clipped() -> None:
    f = np.array([3.0, -4.0, 0.5])
    expected = Quantizer(20, 1.0).quantize(l2_normalize(f))[0]
    np.testing.assert_array_equal(quantize_feature_row(f, 20), expected)
    np.testing.assert_array_equal(quantize_feature_row([0.5, -0.25], 4, normalize=False), [8, -4])
    for bad, reason in (([1.0, np.nan], "non_finite_feature"), ([1e200, 1e200], "non_finite_feature"),
                        ([2.0, 0.0], "feature_out_of_bound")):
        with pytest.raises(FeatureRejected) as exc:
            quantize_feature_row(np.array(bad), 20, normalize=reason != "feature_out_of_bound")
        assert exc.value.reason == reason


def test_labels() -> None:
    assert quantize_label(3, 0) == ("class", 0, 3)
    kind, width, q = quantize_label((0.5, 1.0), 2)
    assert (kind, width, q.tolist()) == ("vector", 2, [2, 4])
    cases = ((MAX_CLASS_INDEX + 1, 0, "label_out_of_range"), ((0.5,), 0, "soft_label_needs_label_frac_bits"),
             ((2.0**40,), 0, "label_out_of_range"))
    for label, k_y, reason in cases:
        with pytest.raises(FeatureRejected) as exc:
            quantize_label(label, k_y)
        assert exc.value.reason == reason


def test_backbone_resolution_and_fixed_dims() -> None:
    assert {k: resolve_backbone("h", k)[0] for k in DEFAULT_BACKBONES} == DEFAULT_BACKBONES
    assert resolve_backbone("h", "image") == ("efficientnet-lite0", "efficientnet-lite0@112px")
    assert resolve_backbone("h", "features", "features:8") == ("features:8", "features:8")
    with pytest.raises(FeatureRejected, match="backbone_mismatch"):
        resolve_backbone("h", "text", "efficientnet-lite0")
    with pytest.raises(FeatureRejected, match="backbone_unavailable"):
        resolve_backbone("h", "text", "no-such-model")
    assert fixed_dim("features:64") == 64 and fixed_dim("minilm") == 384
    assert fixed_dim("efficientnet-lite0@112px") == 1280
    assert fixed_dim("features") is None and fixed_dim("no-such-model") is None


@pytest.mark.parametrize("normalize", [True, False])
def test_vectors_with_no_information_are_refused_for_training(normalize: bool) -> None:
    """d = 8 of 0.0, of -0.0, of 5e-324 (too small to normalize), and a norm just under the floor:
    ``zero_norm_feature`` after quantizing (without normalization: a q of all zeros; a norm under
    the floor that still quantizes to a nonzero q is fine there), never a zero row counting in n.
    Quantizing alone (a prediction query) refuses none of them."""
    from unlearn.features.contract import MIN_FEATURE_NORM, check_information

    tiny = np.full(8, MIN_FEATURE_NORM / np.sqrt(8) * 0.99)
    rows = [np.zeros(8), np.full(8, -0.0), np.full(8, 5e-324), tiny]
    for f in rows:
        q = quantize_feature_row(f, 30, 1.0, normalize)  # no refusal here
        with pytest.raises(FeatureRejected) as exc:
            check_information(f, q, normalize)
        assert exc.value.reason == "zero_norm_feature"
    above = np.full(8, MIN_FEATURE_NORM / np.sqrt(8) * 1.01)
    check_information(above, quantize_feature_row(above, 30), True)  # unit norm after normalizing
    check_information(np.eye(8)[0], quantize_feature_row(np.eye(8)[0], 30, 1.0, normalize), normalize)
