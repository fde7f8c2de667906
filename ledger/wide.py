"""Signed 128-bit integer matrices as (hi: int64, lo: uint64) pairs, vectorized with numpy.

The exact Gram entries need up to ~93 bits. The ledger stores them as int64 limbs; this module
combines limbs into exact 128-bit values for the digest and for float conversion without going
through Python ints element by element.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def shifted(v: NDArray[np.int64], shift: int) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """The 128-bit value v * 2^shift as (hi, lo); 0 <= shift < 64."""
    v = np.asarray(v, dtype=np.int64)
    if not 0 <= shift < 64:
        raise ValueError("shift must be in 0..63")
    lo = (v.astype(np.uint64) << np.uint64(shift)) & _MASK64
    hi = v >> np.int64(63) if shift == 0 else v >> np.int64(64 - shift)
    return hi.astype(np.int64), lo


def add(a: tuple[NDArray[np.int64], NDArray[np.uint64]],
        b: tuple[NDArray[np.int64], NDArray[np.uint64]]) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """(hi, lo) + (hi, lo) with carry; the caller guarantees the sum fits in 128 bits."""
    lo = a[1] + b[1]
    carry = (lo < a[1]).astype(np.int64)
    return a[0] + b[0] + carry, lo


def combine(terms: list[tuple[NDArray[np.int64], int]]) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """Exact sum of int64 arrays each scaled by 2^shift (0 <= shift < 64), as 128-bit (hi, lo).

    Each term splits into a signed high word (v >> (64 - shift)) and an unsigned low word; the
    low words are summed modulo 2^64 with explicit carries. Fewer temporaries than chaining
    ``add(shifted(...))``: this sits on the digest's hot path.
    """
    hi: NDArray[np.int64] | None = None
    lo: NDArray[np.uint64] | None = None
    for v, shift in terms:
        v = np.asarray(v, dtype=np.int64)
        if not 0 <= shift < 64:
            raise ValueError("shift must be in 0..63")
        t_lo = v.view(np.uint64) << np.uint64(shift) if shift else v.view(np.uint64).copy()
        t_hi = v >> np.int64(63 if shift == 0 else 64 - shift)
        if hi is None or lo is None:
            hi, lo = t_hi, t_lo
            continue
        lo += t_lo  # wraps modulo 2^64
        hi += t_hi
        hi += lo < t_lo  # carry out of the low word
    assert hi is not None and lo is not None
    return hi, lo


def to_float64(w: tuple[NDArray[np.int64], NDArray[np.uint64]]) -> NDArray[np.float64]:
    """Deterministic float64 of a 128-bit value.

    The low word is re-read as signed (borrowing one from the high word when its top bit is
    set), so values below 2^63 in magnitude -- negatives included -- round exactly once instead
    of cancelling 2^64 against 2^64 - x.
    """
    hi, lo = w
    top = (lo >> np.uint64(63)).astype(np.int64)
    lo_signed = lo.view(np.int64) if lo.dtype == np.uint64 else lo.astype(np.int64)
    return (hi + top).astype(np.float64) * 18446744073709551616.0 + lo_signed.astype(np.float64)


def upper_to_float64(terms: list[tuple[NDArray[np.int64], int]], scale: float,
                     rows: int = 32) -> NDArray[np.float64]:
    """``to_float64(combine(terms)) * scale`` for square terms that are upper triangular (strict lower
    part zero), on the upper triangle only; the strict lower part of the result is 0. ``scale``
    must be a power of two (so that it commutes with the rounding: the same bits as the formula).

    Why: ``ExactLedger.gram`` runs at every reset. Same 128-bit words and the same two roundings
    (low word to float64, then the sum), but ``rows`` rows at a time in reused buffers that stay in
    cache, with in-place ufuncs, on half the entries -- instead of a dozen fresh (d, d) temporaries.
    """
    n = terms[0][0].shape[0]
    if np.frexp(scale)[0] != 0.5:
        raise ValueError("scale must be a power of two")
    out = np.zeros((n, n))
    hi = np.empty(rows * n, dtype=np.int64)
    lo = np.empty(rows * n, dtype=np.uint64)
    t = np.empty(rows * n, dtype=np.uint64)
    carry = np.empty(rows * n, dtype=bool)
    f = np.empty(rows * n)
    hi_scale = 18446744073709551616.0 * scale
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        shape = (i1 - i0, n - i0)
        k = shape[0] * shape[1]
        h, lw, tu, c, fb = (b[:k].reshape(shape) for b in (hi, lo, t, carry, f))
        ti = tu.view(np.int64)
        h.fill(0)
        for j, (v, shift) in enumerate(terms):
            if not 0 <= shift < 64:
                raise ValueError("shift must be in 0..63")
            vb = v[i0:i1, i0:]
            if j == 0:
                np.left_shift(vb.view(np.uint64), np.uint64(shift), out=lw)
            else:
                np.left_shift(vb.view(np.uint64), np.uint64(shift), out=tu)
                lw += tu  # wraps modulo 2^64
                np.less(lw, tu, out=c)  # carry out of the low word
                h += c
            np.right_shift(vb, np.int64(63 if shift == 0 else 64 - shift), out=ti)
            h += ti
        # to_float64: the low word read as signed, borrowing from the high word when its top bit is set
        np.right_shift(lw, np.uint64(63), out=tu)
        h += ti
        blk = out[i0:i1, i0:]
        np.multiply(h, hi_scale, out=blk)
        np.multiply(lw.view(np.int64), scale, out=fb)
        blk += fb
    return out


def to_le_bytes(w: tuple[NDArray[np.int64], NDArray[np.uint64]]) -> bytes:
    """Signed two's-complement little-endian 16-byte encoding of every element, in order."""
    hi, lo = w
    out = np.empty(hi.size, dtype=[("lo", "<u8"), ("hi", "<i8")])
    out["lo"] = lo.ravel()
    out["hi"] = hi.ravel()
    return out.tobytes()


def to_pyints(w: tuple[NDArray[np.int64], NDArray[np.uint64]]) -> list[int]:
    """Python ints (for tests and small diagnostics; slow for big arrays)."""
    hi, lo = w
    return [(int(h) << 64) + int(lw) for h, lw in zip(hi.ravel(), lo.ravel())]


def is_negative(w: tuple[NDArray[np.int64], NDArray[np.uint64]]) -> NDArray[np.bool_]:
    """Elementwise sign test of a 128-bit value."""
    return w[0] < 0
