"""The batched feature quantization is the per-row specification, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.features.contract import BatchQuantizer, FeatureRejected, quantize_feature_row, quantize_feature_rows
from unlearn.ledger import l2_normalize

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
