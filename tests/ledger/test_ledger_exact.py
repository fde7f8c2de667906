"""Algebraic invariants of the exact ledger: order, partition and add-then-delete invariance,
bit-exact against a Python-int reference, and serialization round trips."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unlearn.ledger import QMAX, ExactLedger, LedgerError, wide

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def random_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Quantized rows including the nasty values: +-2^30, split boundaries, zeros."""
    Q = rng.integers(-QMAX, QMAX + 1, size=(n, d), dtype=np.int64)
    specials = np.array([QMAX, -QMAX, 0, 1 << 14, -(1 << 14), (1 << 14) - 1, (1 << 15), -(1 << 15) - 1], np.int64)
    mask = rng.random((n, d)) < 0.2
    Q[mask] = rng.choice(specials, size=int(mask.sum()))
    return Q


def random_labels(rng: np.random.Generator, n: int, kind: str, c: int) -> np.ndarray:
    if kind == "class":
        return rng.integers(0, c, size=n)
    return rng.integers(-QMAX, QMAX + 1, size=(n, c), dtype=np.int64)


def reference_ints(Q: np.ndarray, Y: np.ndarray, c: int, kind: str, k_y: int) -> tuple[np.ndarray, np.ndarray]:
    """S and G by Python big ints: an independent reference for the split-GEMM path."""
    Qo = Q.astype(object)
    if kind == "class":
        Yo = np.zeros((Q.shape[0], c), dtype=object)
        for i, j in enumerate(Y):
            Yo[i, int(j)] = 1 << k_y
    else:
        Yo = Y.astype(object)
    return Qo.T @ Qo, Qo.T @ Yo


label_kinds = st.sampled_from(["class", "matrix"])


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 9), n=st.integers(0, 40), kind=label_kinds,
       k_y=st.integers(0, 8))
def test_matches_python_int_reference(seed: int, d: int, n: int, kind: str, k_y: int) -> None:
    rng = np.random.default_rng(seed)
    c = 4
    Q, Y = random_rows(rng, n, d), random_labels(rng, n, kind, c)
    k_y = k_y if kind == "class" else 0
    led = ExactLedger(d, c, label_frac_bits=k_y)
    led.add(Q, Y)
    S_ref, G_ref = reference_ints(Q, Y, c, kind, k_y)
    assert (led.gram_int() == S_ref).all()
    assert (led.moments_int() == G_ref).all()
    assert led.count == n


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 8), n=st.integers(1, 30), kind=label_kinds,
       n_ops=st.integers(0, 60))
def test_any_interleaving_equals_fresh_ledger_on_retained(seed: int, d: int, n: int, kind: str, n_ops: int) -> None:
    """Random add/delete stream (deletes only of members, duplicates allowed = multiset)."""
    rng = np.random.default_rng(seed)
    c = 3
    pool_Q, pool_Y = random_rows(rng, n, d), random_labels(rng, n, kind, c)
    led = ExactLedger(d, c)
    retained: list[int] = []
    for _ in range(n_ops):
        if retained and rng.random() < 0.4:
            # delete a random subset of retained members as one batch
            k = int(rng.integers(1, min(len(retained), 5) + 1))
            pick = rng.choice(len(retained), size=k, replace=False)
            idx = [retained[p] for p in pick]
            led.delete(pool_Q[idx], pool_Y[idx])
            for p in sorted(pick, reverse=True):
                retained.pop(int(p))
        else:
            idx = list(rng.integers(0, n, size=int(rng.integers(1, 4))))
            led.add(pool_Q[idx], pool_Y[idx])
            retained.extend(int(i) for i in idx)
    fresh = ExactLedger(d, c)
    order = sorted(retained)  # a different order than the stream's
    if order:
        fresh.add(pool_Q[order], pool_Y[order])
    assert led.digest() == fresh.digest()
    assert led == fresh
    assert led.count == len(retained)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 8), n=st.integers(0, 50), parts=st.integers(1, 6),
       kind=label_kinds)
def test_partition_ledgers_merge_to_the_whole(seed: int, d: int, n: int, parts: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    Q, Y = random_rows(rng, n, d), random_labels(rng, n, kind, 5)
    whole = ExactLedger.from_rows(Q, Y, n_outputs=5) if n else ExactLedger(d, 5)
    assign = rng.integers(0, parts, size=n)
    merged = ExactLedger(d, 5)
    for p in rng.permutation(parts):
        rows = np.flatnonzero(assign == p)
        part = ExactLedger(d, 5)
        if rows.size:
            part.add(Q[rows[::-1]], Y[rows[::-1]])
        merged = merged + part
    assert merged.digest() == whole.digest()


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 8), n=st.integers(0, 30), kind=label_kinds)
def test_add_then_delete_returns_to_empty(seed: int, d: int, n: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    Q, Y = random_rows(rng, n, d), random_labels(rng, n, kind, 3)
    led = ExactLedger(d, 3)
    empty_digest = led.digest()
    for i in range(n):
        led.add(Q[i], Y[i:i + 1] if kind == "matrix" else Y[i])
    perm = rng.permutation(n)
    led.delete(Q[perm], Y[perm])
    assert led.digest() == empty_digest
    assert led.count == 0


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 10), n=st.integers(0, 30), kind=label_kinds,
       k_y=st.integers(0, 30))
def test_bytes_round_trip(seed: int, d: int, n: int, kind: str, k_y: int) -> None:
    rng = np.random.default_rng(seed)
    led = ExactLedger(d, 4, frac_bits=int(rng.integers(0, 31)), label_frac_bits=k_y)
    if n:
        led.add(random_rows(rng, n, d), random_labels(rng, n, kind, 4))
    back = ExactLedger.from_bytes(led.to_bytes())
    assert back.digest() == led.digest()
    assert np.array_equal(back.class_counts, led.class_counts)
    assert (back.gram_int() == led.gram_int()).all()
    assert back.to_bytes() == led.to_bytes()


def test_from_bytes_rejects_corruption_and_truncation() -> None:
    rng = np.random.default_rng(1)
    led = ExactLedger.from_rows(random_rows(rng, 10, 4), rng.integers(0, 3, 10))
    blob = led.to_bytes()
    with pytest.raises(LedgerError, match=r"truncated|bytes"):
        ExactLedger.from_bytes(blob[:-1])
    flipped = bytearray(blob)
    flipped[60] ^= 0x01
    with pytest.raises(LedgerError, match="checksum"):
        ExactLedger.from_bytes(bytes(flipped))
    wrong_version = bytearray(blob)
    wrong_version[4] = 9
    with pytest.raises(LedgerError, match="version"):
        ExactLedger.from_bytes(bytes(wrong_version))
    with pytest.raises(LedgerError, match="magic"):
        ExactLedger.from_bytes(b"XXXX" + blob[4:])


def test_digest_encoding_is_the_documented_one() -> None:
    """Recompute the digest from Python ints with struct/int.to_bytes, as an outside auditor would."""
    import hashlib
    import struct

    rng = np.random.default_rng(7)
    d, c, n = 5, 3, 12
    Q = random_rows(rng, n, d)
    y = rng.integers(0, c, n)
    led = ExactLedger.from_rows(Q, y, n_outputs=c, label_frac_bits=2)
    S, G = reference_ints(Q, y, c, "class", 2)
    h = hashlib.sha256(b"unlearn.ledger/v1\x00" + struct.pack("<qqqqq", d, c, 30, 2, n))
    for i in range(d):
        for j in range(i, d):
            h.update(int(S[i, j]).to_bytes(16, "little", signed=True))
    for i in range(d):
        for m in range(c):
            h.update(int(G[i, m]).to_bytes(16, "little", signed=True))
    assert led.digest() == h.hexdigest()


def test_class_incremental_outputs_grow() -> None:
    rng = np.random.default_rng(3)
    led = ExactLedger(4, 0)
    Q = random_rows(rng, 3, 4)
    led.add(Q[:1], [0])
    assert led.n_outputs == 1
    led.add(Q[1:], [5, 2])
    assert led.n_outputs == 6
    assert list(led.class_counts) == [1, 0, 1, 0, 0, 1]


def test_chunked_gemm_beyond_2_pow_21_rows_is_exact() -> None:
    """A batch larger than one exact GEMM chunk, at the extreme magnitude, still sums exactly."""
    n = (1 << 21) + 3
    Q = np.full((n, 1), QMAX, np.int64)
    Q[::2] = -QMAX
    led = ExactLedger(1, 1)
    led.add(Q, np.zeros(n, np.int64))
    assert led.gram_int()[0, 0] == n * QMAX * QMAX
    assert led.moments_int()[0, 0] == int(Q[:, 0].astype(object).sum())


def test_wide_int_helpers_match_python_ints() -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(-(1 << 62), 1 << 62, size=50, dtype=np.int64)
    b = rng.integers(-(1 << 62), 1 << 62, size=50, dtype=np.int64)
    w = wide.combine([(a, 30), (b, 15), (a, 0)])
    expect = [(int(x) << 30) + (int(y) << 15) + int(x) for x, y in zip(a, b)]
    assert wide.to_pyints(w) == expect
    assert np.allclose(wide.to_float64(w), np.array([float(e) for e in expect]), rtol=1e-15, atol=0)
