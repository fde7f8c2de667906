"""The feature contract: backbone choice, fixed dimensions, exact feature rows and labels; the batched
feature quantization is the per-row specification, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.features.contract import (
    DEFAULT_BACKBONES,
    BatchQuantizer,
    FeatureRejected,
    fixed_dim,
    quantize_feature_row,
    quantize_feature_rows,
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


# ------------------------------------------------------------------ the batched quantization
# components: ordinary values, huge ones (overflowing squared norms), tiny/subnormal ones, NaN/Inf
components = st.one_of(
    st.floats(-4, 4, width=64),
    st.floats(-1e160, 1e160, width=64),
    st.floats(-1e-300, 1e-300, width=64),
    st.floats(width=64, allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5]),
)


@st.composite
def grids(draw: st.DrawFn) -> tuple[int, float, bool]:
    """(frac_bits, bound, normalize) with bound * 2^frac_bits <= 2^30, as the quantizer requires."""
    k = draw(st.integers(0, 30))
    bound = draw(st.sampled_from([1.0, 0.5, 0.03, 2.0 ** (30 - k)]))
    if bound * 2.0 ** k > 2.0 ** 30:
        bound = 2.0 ** (30 - k)
    return k, bound, draw(st.booleans())


def per_row(F: np.ndarray, k: int, bound: float, normalize: bool) -> list[np.ndarray | tuple[str, str]]:
    out: list[np.ndarray | tuple[str, str]] = []
    for f in F:
        try:
            out.append(quantize_feature_row(f, k, bound, normalize))
        except FeatureRejected as exc:
            out.append((exc.reason, exc.detail))
    return out


def same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, tuple):
            assert isinstance(g, FeatureRejected) and (g.reason, g.detail) == w
        else:
            assert isinstance(g, np.ndarray) and g.dtype == np.int64 and g.shape == w.shape
            assert g.tobytes() == w.tobytes()  # bit for bit (also the sign of zero cannot differ in int64)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 9), d=st.integers(1, 40), grid=grids(), scale=st.sampled_from([1.0, 1e-3, 7.0]))
def test_batched_quantization_is_the_per_row_function(data: st.DataObject, n: int, d: int,
                                                      grid: tuple[int, float, bool], scale: float) -> None:
    """Any rows (finite, huge, tiny, NaN, Inf), any grid and bound, with or without normalization:
    the batch gives each row what ``quantize_feature_row`` gives it, q or the same refusal."""
    rows = data.draw(st.lists(st.lists(components, min_size=d, max_size=d), min_size=n, max_size=n))
    with np.errstate(over="ignore"):
        F = np.array(rows, dtype=np.float64).reshape(n, d) * scale
    k, bound, normalize = grid
    want = per_row(F, k, bound, normalize)
    same(quantize_feature_rows(F, k, bound, normalize), want)
    qz = BatchQuantizer(list(F))
    got: list = []
    for f in qz._rows:
        try:
            got.append(qz(f, k, bound, normalize))
        except FeatureRejected as exc:
            got.append(exc)
    same(got, want)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_realistic_batch_matches_row_by_row(dtype: type) -> None:
    """256 backbone-like rows at d=768 (float64, and float32 widened as ``features_bin`` '<f4'
    arrives), the featurizer's default grid: all accepted, every q identical."""
    rng = np.random.default_rng(12)
    F = (rng.normal(size=(256, 768)) * rng.uniform(0.01, 50, size=(256, 1))).astype(dtype).astype(np.float64)
    for k, normalize in ((30, True), (20, True), (30, False)):
        want = per_row(F if normalize else F / 400, k, 1.0, normalize)
        same(quantize_feature_rows(F if normalize else F / 400, k, 1.0, normalize), want)
        assert normalize is False or all(isinstance(w, np.ndarray) for w in want)


def test_rows_of_another_dimension_or_unknown_rows_take_the_per_row_path() -> None:
    a, b = np.array([3.0, 4.0]), np.array([1.0, 0.0, 0.0])
    qz = BatchQuantizer([a, b, "not a row"])
    assert qz(a, 4).tolist() == [10, 13] and qz(b, 4).tolist() == [16, 0, 0]
    c = np.array([0.0, 2.0])
    assert qz(c, 4).tolist() == quantize_feature_row(c, 4).tolist()
    with pytest.raises(FeatureRejected, match="non_finite_feature"):
        nan_row = np.array([np.nan, 1.0])
        BatchQuantizer([nan_row])(nan_row, 4)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), d=st.integers(1, 1100),
       spread=st.sampled_from([1e-6, 1.0, 1e3, 1e150]))
def test_normalizing_a_batch_is_normalizing_each_row_bitwise(seed: int, n: int, d: int, spread: float) -> None:
    """Why the batch can be exact at all: ``l2_normalize`` of n rows gives each row the same float64
    bits as normalizing it alone (q barely shows last-bit differences, so this is checked on the
    floats themselves, at the featurizer's sizes)."""
    rng = np.random.default_rng(seed)
    F = rng.normal(size=(n, d)) * rng.uniform(0, spread, size=(n, 1))
    whole = l2_normalize(F)
    assert whole.tobytes() == b"".join(l2_normalize(f).tobytes() for f in F)
