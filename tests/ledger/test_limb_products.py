"""The exact limb kernel (ledger/limb_products.py): pending float64 dsyrk accumulation folded into int64.

Every fast path is checked against a straightforward Python-int reference of the limbs themselves
(not only S), and the digests/blobs of fixed streams against values recorded from the previous
implementation (per-call GEMMs into symmetric int64 limbs), so the encoding cannot drift."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unlearn.ledger import QMAX, ExactLedger, NonMemberDelete, exact_ledger, limb_products
from unlearn.ledger.ledger_encoding import BLOB_HEADER

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Split boundaries and extremes of the quantized range.
EDGES = np.array([QMAX, -QMAX, QMAX - 1, -QMAX + 1, 0, 1, -1, 1 << 14, -(1 << 14), (1 << 14) - 1,
                  (1 << 15), -(1 << 15), (1 << 15) - 1, (1 << 30) - (1 << 14) - 1], np.int64)


def rows(rng: np.random.Generator, n: int, d: int, edge_share: float) -> np.ndarray:
    Q = rng.integers(-QMAX, QMAX + 1, size=(n, d), dtype=np.int64)
    mask = rng.random((n, d)) < edge_share
    Q[mask] = rng.choice(EDGES, size=int(mask.sum()))
    return Q


def halves(Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documented split as Python ints: q = a*2^15 + b, b in [-2^14, 2^14)."""
    a = np.vectorize(lambda q: (int(q) + (1 << 14)) >> 15, otypes=[object])(Q)
    return a, Q.astype(object) - a * (1 << 15)


def reference_limbs(Q: np.ndarray, Y: np.ndarray) -> list[np.ndarray]:
    """AA, X, BB, GAA, GX, GBB by Python big ints (the limb definitions, written out)."""
    a, b = halves(Q)
    ya, yb = halves(Y)
    return [a.T @ a, a.T @ b + b.T @ a, b.T @ b, a.T @ ya, a.T @ yb + b.T @ ya, b.T @ yb]


def blob_limbs(led: ExactLedger) -> list[np.ndarray]:
    """The limbs as serialized: upper triangles of AA, X, BB and the G limbs, from to_bytes()."""
    blob = led.to_bytes()
    d, c = led.dim, led.n_outputs
    t = d * (d + 1) // 2
    body = np.frombuffer(blob[BLOB_HEADER.size:-32], dtype="<i8")[c:]
    parts = np.split(body, np.cumsum([t, t, t, d * c, d * c]))
    return [p.astype(object) for p in parts[:3]] + [p.reshape(d, c).astype(object) for p in parts[3:]]


def upper(M: np.ndarray) -> np.ndarray:
    return M[np.triu_indices(M.shape[0])]


def label_matrix(y: np.ndarray, c: int, k_y: int) -> np.ndarray:
    Y = np.zeros((y.shape[0], c), np.int64)
    Y[np.arange(y.shape[0]), y] = 1 << k_y
    return Y


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 12), r=st.integers(1, 32),
       kind=st.sampled_from(["class", "matrix"]), k_y=st.sampled_from([0, 13, 14, 15, 30]),
       edge_share=st.sampled_from([0.0, 0.3, 1.0]))
def test_limbs_equal_python_int_reference(seed: int, d: int, r: int, kind: str, k_y: int, edge_share: float) -> None:
    """Ranks 1..32 (rank 1 = the dsyr path), edge values included, class labels on grids on both
    sides of the 2^14 split (GAA zero / non-zero) and full-range target matrices."""
    rng = np.random.default_rng(seed)
    c = 3
    Q = rows(rng, r, d, edge_share)
    if kind == "class":
        y = rng.integers(0, c, r)
        Y, labels = label_matrix(y, c, k_y), y
    else:
        Y = labels = rows(rng, r, c, edge_share)
        k_y = 0
    led = ExactLedger(d, c, label_frac_bits=k_y)
    led.add(Q, labels)
    ref = reference_limbs(Q, Y)
    got = blob_limbs(led)
    for name, g, want in zip(("AA", "X", "BB"), got[:3], ref[:3]):
        assert (g == upper(want)).all(), name
    for name, g, want in zip(("GAA", "GX", "GBB"), got[3:], ref[3:]):
        assert (g == want).all(), name
    S = Q.astype(object)
    assert (led.gram_int() == S.T @ S).all()  # the mirrored full S


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 10), n_ops=st.integers(1, 25), row_block=st.integers(1, 9),
       exact_rows=st.integers(1, 40), defer_rows=st.integers(1, 40), hold=st.integers(0, 60))
def test_chunking_and_budget_folds_change_nothing(seed: int, d: int, n_ops: int, row_block: int,
                                                  exact_rows: int, defer_rows: int, hold: int) -> None:
    """Tiny ROW_BLOCK / EXACT_ROWS force chunk splits and budget folds mid-batch; DEFER_ROWS and
    ``hold_rows`` decide which updates wait to be multiplied with later ones and when they
    are; idle steps (``products.multiply_some``) and reads at random points multiply or fold them
    between updates. The result equals one plain add of the retained rows."""
    rng = np.random.default_rng(seed)
    pool = rows(rng, 40, d, 0.3)
    ys = rng.integers(0, 4, 40)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(exact_ledger, "ROW_BLOCK", row_block)
        m.setattr(limb_products, "ROW_BLOCK", row_block)
        m.setattr(limb_products, "EXACT_ROWS", exact_rows)
        m.setattr(limb_products, "DEFER_ROWS", defer_rows)
        led = ExactLedger(d, 4)
        led.hold_rows = hold
        held: list[int] = []
        for _ in range(n_ops):
            if held and rng.random() < 0.35:
                k = int(rng.integers(1, len(held) + 1))
                gone = [held.pop(int(rng.integers(len(held)))) for _ in range(k)]
                led.delete(pool[gone], ys[gone])
            else:
                idx = list(rng.integers(0, 40, int(rng.integers(1, 33))))
                led.add(pool[idx], ys[idx])
                held.extend(int(i) for i in idx)
            if rng.random() < 0.3:
                led.digest()
            elif rng.random() < 0.3:
                products = led.products
                if products is not None:
                    products.multiply_some(int(rng.integers(1, 20)))
        got = led.to_bytes()
    fresh = ExactLedger(d, 4)
    if held:
        fresh.add(pool[held], ys[held])
    assert got == fresh.to_bytes()


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 16), r=st.integers(1, 32), read_between=st.booleans())
def test_add_then_delete_restores_the_exact_state(seed: int, d: int, r: int, read_between: bool) -> None:
    rng = np.random.default_rng(seed)
    led = ExactLedger(d, 5, label_frac_bits=int(rng.integers(0, 31)))
    base = rows(rng, 20, d, 0.3)
    led.add(base, rng.integers(0, 5, 20))
    before = led.to_bytes()
    Q = rows(rng, r, d, 0.5)
    y = rng.integers(0, 5, r)
    led.add(Q, y)
    if read_between:
        led.gram()
    perm = rng.permutation(r)
    for part in np.array_split(perm, int(rng.integers(1, r + 1))):
        led.delete(Q[part], y[part])
    assert led.to_bytes() == before


def test_extremes_past_the_exact_budget() -> None:
    """More than EXACT_ROWS rows of the largest |s| = |a + b| (and of +-QMAX): the pending float
    accumulators fold before they could round, and every limb equals its closed form."""
    n = limb_products.EXACT_ROWS + 5
    q_s = (1 << 30) - (1 << 14) - 1  # a = 2^15 - 1, b = 2^14 - 1: the largest s
    Q = np.empty((n, 2), np.int64)
    Q[:, 0] = q_s
    Q[:, 1] = -QMAX
    led = ExactLedger(2, 1)
    led.add(Q, np.zeros(n, np.int64))
    a0, b0, a1 = (1 << 15) - 1, (1 << 14) - 1, -(1 << 15)
    AA, X, BB = blob_limbs(led)[:3]
    assert list(AA) == [n * a0 * a0, n * a0 * a1, n * a1 * a1]
    assert list(X) == [n * 2 * a0 * b0, n * b0 * a1, 0]
    assert list(BB) == [n * b0 * b0, 0, 0]
    assert led.gram_int()[0, 1] == n * q_s * -QMAX


RECORDED = {  # digest and sha256(to_bytes()) of fixed streams, from the previous implementation
    1: ("9707723fdb6031823c392bbd9e47eb76fa85e8ace1434cfb4e20f9a671d5bb4d",
        "c29442384a9265e59022b853ed0143eb890ac76ed23e8ea21937e90530d23233"),
    2: ("ebe5f6fa77d683784b6dbecba1a80bcfbc0a2a4b2ec999ed26c17ac9acba345e",
        "b836f6df91771511dd619fd9893f0657d726e7a43a66ae25d3c7944ebce9f85c"),
}
RECORDED_MATRIX = ("2ae47535220766df1aeb19440e25a2802a75d785058dc6bb9b884543fd6ad6db",
                   "f54ca554e2e99f8b23370e01ebc6fe8f4037437b30d37e37b364350389fc4df8",
                   "7b7fe62d95386d7ee2ff7832f944be7107c02f03b6bd3449c04806e64e1f2a4c",
                   "2a8aff4b51535e2452f5e5ca817427b4e050ec311294af6d12fb2798755c1db4")


@pytest.mark.parametrize("seed", sorted(RECORDED))
def test_fixed_class_stream_matches_previous_implementation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    d, c = 13, 4
    led = ExactLedger(d, c, label_frac_bits=3)
    pool = rng.integers(-QMAX, QMAX + 1, (200, d))
    pool[rng.random(pool.shape) < 0.2] = QMAX
    pool[rng.random(pool.shape) < 0.1] = -QMAX
    ys = rng.integers(0, c + 2, 200)
    led.add(pool[:150], ys[:150])
    for i in range(150, 200):
        led.add(pool[i], ys[i:i + 1])
    led.delete(pool[10:60], ys[10:60])
    led.delete(pool[155], ys[155:156])
    assert (led.digest(), hashlib.sha256(led.to_bytes()).hexdigest()) == RECORDED[seed]


def test_fixed_matrix_stream_matches_previous_implementation() -> None:
    rng = np.random.default_rng(3)
    d, c = 70, 3
    led = ExactLedger(d, c)
    Q = rng.integers(-QMAX, QMAX + 1, (600, d))
    Y = rng.integers(-QMAX, QMAX + 1, (600, c))
    led.add(Q[:500], Y[:500])
    led.add(Q[500:], Y[500:])
    led.delete(Q[:37], Y[:37])
    for i in range(40, 45):
        led.delete(Q[i], Y[i:i + 1])
    got = (led.digest(), hashlib.sha256(led.to_bytes()).hexdigest(),
           hashlib.sha256(led.gram().tobytes()).hexdigest(), hashlib.sha256(led.moments().tobytes()).hexdigest())
    assert got == RECORDED_MATRIX


def test_copy_and_absorb_see_pending_products() -> None:
    rng = np.random.default_rng(11)
    Q, y = rows(rng, 30, 6, 0.3), rng.integers(0, 3, 30)
    a = ExactLedger(6, 3)
    a.add(Q[:20], y[:20])  # pending, not folded
    b = ExactLedger(6, 3)
    b.add(Q[20:], y[20:])
    both = a.copy()
    both.absorb(b)
    assert both == ExactLedger.from_rows(Q, y, n_outputs=3)
    both.absorb(b, -1)
    assert both.to_bytes() == a.to_bytes()
    g = a.gram()
    assert np.array_equal(g, g.T)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 12), sizes=st.lists(st.integers(1, 80), min_size=1, max_size=8),
       signs=st.lists(st.sampled_from([1, -1]), min_size=8, max_size=8), hold=st.sampled_from([0, 64, 100, 300]),
       steps=st.lists(st.integers(0, 90), min_size=8, max_size=8))
def test_deferred_rows_show_in_the_diagonals_and_fold_to_the_same_limbs(seed: int, d: int, sizes: list[int],
                                                                         signs: list[int], hold: int,
                                                                         steps: list[int]) -> None:
    """Small updates wait unmultiplied (DEFER_ROWS), larger ones too while at most ``hold`` rows
    wait, and idle steps multiply some of them (``multiply_some``, cutting an update); the
    diagonals the delete check reads include the waiting rows exactly after every step, and the
    fold gives the limbs of the Python-int reference whatever was deferred."""
    rng = np.random.default_rng(seed)
    pend = limb_products.PendingProducts(d, hold)
    ref = [np.zeros((d, d), dtype=object) for _ in range(3)]
    for r, sign, step in zip(sizes, signs, steps):
        Q = rows(rng, r, d, 0.3)
        pend.accumulate(*limb_products.split_rows(Q), sign)
        a, b = halves(Q)
        for acc, part in zip(ref, (a.T @ a, a.T @ b + b.T @ a, b.T @ b)):
            acc += sign * part
        assert pend.deferred < max(hold, limb_products.DEFER_ROWS)  # all multiplied once that many wait
        waiting = pend.deferred
        assert pend.multiply_some(step) == min(step, waiting)
        assert pend.deferred == waiting - min(step, waiting)
        for got, want in zip(pend.diagonals(), ref):
            assert [int(v) for v in got] == [int(v) for v in np.diagonal(want)]
    zeros = (np.zeros((d, d), np.int64), np.zeros((d, d), np.int64), np.zeros((d, d), np.int64))
    pend.fold_into(zeros)  # in place
    out = zeros
    for got, want in zip(out, ref):
        assert (upper(got).astype(object) == upper(want)).all()
    assert pend.rows == 0 and pend.deferred == 0


def test_delete_check_sees_pending_diagonal() -> None:
    """The non-member check reads the pending products' diagonal without folding them."""
    led = ExactLedger(3, 1)
    q = np.array([[QMAX, 5, -7]], np.int64)
    led.add(q, [0])
    led.add(np.zeros((1, 3), np.int64), [0])
    with pytest.raises(NonMemberDelete, match=r"S\[0,0\]"):
        led.delete(np.array([[QMAX, 5, -7], [1, 0, 0]], np.int64), [0, 0])
    led.delete(q, [0])
    assert led.gram_int()[0, 0] == 0


def test_stale_accumulator_is_overwritten_not_read() -> None:
    """After a fold the float buffers hold int bit patterns (NaNs among them); BLAS with beta = 0
    must overwrite them, and must never touch the strict lower triangle."""
    rng = np.random.default_rng(2)
    for d, r in ((5, 1), (5, 3), (64, 2), (200, 70)):
        C = np.full((d, d), np.nan)
        M = rng.integers(-9, 9, (r, d)).astype(np.float64)
        limb_products.syrk_upper(-1.0, M, C, accumulate=False)
        iu = np.triu_indices(d)
        assert np.array_equal(C[iu], (-M.T @ M)[iu])
        assert np.isnan(C[np.tril_indices(d, -1)]).all()
        limb_products.syrk_upper(1.0, M[:1], C, accumulate=True)  # the dsyr path, in place
        assert np.array_equal(C[iu], (-M.T @ M + M[:1].T @ M[:1])[iu])


def test_exact_int_at_its_bounds() -> None:
    edge = (1 << 51) - 1
    v = np.array([edge, -edge, 0.0, -0.0, 1, -1, 12345678901234], np.float64)
    assert limb_products.exact_int(v).tolist() == [edge, -edge, 0, 0, 1, -1, 12345678901234]


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), r=st.integers(1, 40))
def test_split_rows_is_the_integer_split(seed: int, r: int) -> None:
    rng = np.random.default_rng(seed)
    Q = rows(rng, r, 7, 0.5)
    a, b, s = limb_products.split_rows(Q)
    ai = (Q + (1 << 14)) >> 15
    assert np.array_equal(a, ai) and np.array_equal(b, Q - (ai << 15)) and np.array_equal(s, a + b)
    assert (b >= -(1 << 14)).all() and (b < (1 << 14)).all()
    assert np.abs(s).max() < 1.5 * (1 << 15)
