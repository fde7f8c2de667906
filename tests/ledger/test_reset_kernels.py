"""The reset's two kernels against the code they replace (issue 12): ``wide.upper_to_float64``
(``ExactLedger.gram``) must give the bits of ``to_float64(combine(...)) * scale``, and
``inverse_from_factor`` (LAPACK dpotri) the inverse ``cho_solve`` gave, to rounding."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import scipy.linalg as sla
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from unlearn.ledger import ExactLedger, wide
from unlearn.ledger import exact as exact_mod
from unlearn.ledger.errors import LedgerError
from unlearn.ledger.exact import _mirror_upper
from unlearn.ledger.solve import inverse_from_factor, posterior_inverse

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


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 48), n=st.integers(1, 300), k=st.sampled_from([20, 30]))
def test_gram_equals_the_previous_formula(seed: int, d: int, n: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    Q = rng.integers(-(1 << 30), (1 << 30) + 1, size=(n, d), dtype=np.int64)
    Q[rng.random((n, d)) < 0.1] = -(1 << 30)
    y = rng.integers(0, 4, n)
    led = ExactLedger.from_rows(Q, y, n_outputs=4, frac_bits=k)
    led.delete(Q[: n // 3], y[: n // 3])
    ref = _mirror_upper(wide.to_float64(wide.combine(exact_mod.shifted(led.parts().gram))) * 2.0 ** (-2 * k))
    assert np.array_equal(led.gram().view(np.int64), ref.view(np.int64))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 80), n=st.integers(0, 200),
       log_scale=st.floats(-3.0, 3.0), gamma=st.sampled_from([1e-3, 1.0, 10.0]))
def test_dpotri_inverse_matches_cho_solve(seed: int, d: int, n: int, log_scale: float, gamma: float) -> None:
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, d)) * 10.0 ** log_scale
    H = A.T @ A + gamma * np.eye(d)
    L = sla.cholesky(H, lower=True, check_finite=False)
    old = sla.cho_solve((L, True), np.eye(d), check_finite=False)
    old = (old + old.T) * 0.5
    new = inverse_from_factor(L)
    assert new.flags.c_contiguous and np.array_equal(new, new.T)  # exactly symmetric
    cond = np.linalg.cond(H)
    tol = 64 * np.finfo(np.float64).eps * cond
    assert np.linalg.norm(new - old) <= tol * np.linalg.norm(old)
    # and as good an inverse: residuals of the same order
    res_new = np.linalg.norm(H @ new - np.eye(d))
    res_old = np.linalg.norm(H @ old - np.eye(d))
    assert res_new <= 4 * res_old + 16 * d * np.finfo(np.float64).eps * cond


def test_inverse_from_factor_refuses_a_singular_factor() -> None:
    L = np.eye(4)
    L[2, 2] = 0.0
    with pytest.raises(LedgerError, match="singular"):
        inverse_from_factor(L)


def test_posterior_inverse_of_a_ledger() -> None:
    rng = np.random.default_rng(7)
    d = 24
    led = ExactLedger.from_rows(rng.integers(-(1 << 29), 1 << 29, size=(100, d)), rng.integers(0, 3, 100), n_outputs=3)
    T = posterior_inverse(led, 1.0)
    H = led.gram() + np.eye(d)
    assert np.array_equal(T, T.T)
    assert np.linalg.norm(H @ T - np.eye(d)) < 1e-10


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 100), block=st.integers(1, 40))
def test_mirror_upper_copies_the_upper_triangle(seed: int, d: int, block: int) -> None:
    M = np.random.default_rng(seed).standard_normal((d, d))
    want = np.triu(M) + np.triu(M, 1).T
    assert np.array_equal(_mirror_upper(M, block=block), want)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.sampled_from([1, 2, 31, 32, 33, 65, 97]), n=st.integers(1, 40))
def test_digest_in_row_blocks_hashes_the_same_bytes(seed: int, d: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    led = ExactLedger.from_rows(rng.integers(-(1 << 30), (1 << 30) + 1, size=(n, d)), rng.integers(0, 3, n),
                                n_outputs=3)
    h = hashlib.sha256(exact_mod.DIGEST_DOMAIN)
    h.update(struct.pack("<qqqqq", d, 3, led.frac_bits, led.label_frac_bits, n))
    up = exact_mod.upper_limbs(led.parts().gram)  # the whole triangle in one encoding, as before
    h.update(wide.to_le_bytes(wide.combine([(up[0], 30), (up[1], 15), (up[2], 0)])))
    h.update(wide.to_le_bytes(wide.combine(exact_mod.shifted(led.parts().moments))))
    assert led.digest() == h.hexdigest()
