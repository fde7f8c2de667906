"""The wide-integer helpers (ledger/wide.py): exact 128-bit combinations of limbs, and
``upper_to_float64`` (``ExactLedger.gram``) against ``to_float64(combine(...)) * scale``, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from unlearn.ledger import wide


def test_wide_int_helpers_match_python_ints() -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(-(1 << 62), 1 << 62, size=50, dtype=np.int64)
    b = rng.integers(-(1 << 62), 1 << 62, size=50, dtype=np.int64)
    w = wide.combine([(a, 30), (b, 15), (a, 0)])
    expect = [(int(x) << 30) + (int(y) << 15) + int(x) for x, y in zip(a, b)]
    assert wide.to_pyints(w) == expect
    assert np.allclose(wide.to_float64(w), np.array([float(e) for e in expect]), rtol=1e-15, atol=0)


I64 = np.iinfo(np.int64)


# the edges of a limb, of the 2^64 split and of the shifts (carries, borrows, the sign of the low word)
EDGES = [I64.min, I64.min + 1, I64.max, I64.max - 1, 0, 1, -1, 1 << 62, -(1 << 62), (1 << 49) - 1,
         -(1 << 49), (1 << 34) - 1, 1 << 34, (1 << 63) - (1 << 30), 1 << 53, (1 << 53) + 1, -(1 << 53) - 1]


def _limbs(rng: np.random.Generator, d: int, edge_share: float) -> NDArray[np.int64]:
    v = rng.integers(I64.min, I64.max, size=(d, d), dtype=np.int64, endpoint=True)
    small = rng.random((d, d)) < 0.3  # also values whose 128-bit sum stays below 2^63 (one rounding)
    v[small] >>= rng.integers(0, 63, size=int(small.sum()))
    edge = rng.random((d, d)) < edge_share
    v[edge] = rng.choice(np.array(EDGES, dtype=np.int64), size=int(edge.sum()))
    return np.triu(v)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 70), rows=st.integers(1, 40),
       edge_share=st.sampled_from([0.0, 0.2, 0.8]), scale_exp=st.sampled_from([-60, -45, -30, 0, 3]))
def test_upper_to_float64_is_bit_identical_to_combine(seed: int, d: int, rows: int, edge_share: float,
                                                      scale_exp: int) -> None:
    rng = np.random.default_rng(seed)
    terms = [(_limbs(rng, d, edge_share), 30), (_limbs(rng, d, edge_share), 15), (_limbs(rng, d, edge_share), 0)]
    scale = 2.0 ** scale_exp
    ref = wide.to_float64(wide.combine(terms)) * scale
    got = wide.upper_to_float64(terms, scale, rows=rows)
    assert np.array_equal(got.view(np.int64), ref.view(np.int64))  # bits, signed zeros included


def test_upper_to_float64_refuses_a_scale_that_is_not_a_power_of_two() -> None:
    v = np.zeros((3, 3), dtype=np.int64)
    with pytest.raises(ValueError, match="power of two"):
        wide.upper_to_float64([(v, 0)], 3.0)
