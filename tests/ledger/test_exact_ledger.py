"""The exact ledger (ledger/exact_ledger.py): order, partition and add-then-delete invariance,
bit-exact against a Python-int reference; every invalid update refused with a clear error and the
ledger left exactly as it was; S read back as float64 by the documented formula."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unlearn.ledger import (
    QMAX,
    ExactLedger,
    LedgerError,
    NonMemberDelete,
    OverflowBudgetError,
    Quantizer,
    wide,
)
from unlearn.ledger.exact_ledger import _mirror_upper
from unlearn.ledger.ledger_encoding import shifted
from unlearn.ledger.limb_products import MAX_COUNT

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
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 9), n=st.integers(1, 60), kind=label_kinds,
       used=st.integers(1, 6), k_y=st.integers(0, 8))
def test_a_wide_label_space_with_few_columns_used_matches_the_reference(seed: int, d: int, n: int, kind: str,
                                                                        used: int, k_y: int) -> None:
    """An auto-created head's label space: 37 columns, rows naming a few (the moments skip the
    others): adds then deletes in chunks, against Python big ints."""
    rng = np.random.default_rng(seed)
    c = 37
    cols = rng.choice(c, size=used, replace=False)
    Q = random_rows(rng, n, d)
    if kind == "class":
        Y = cols[rng.integers(0, used, size=n)]
    else:
        Y = np.zeros((n, c), dtype=np.int64)
        Y[:, cols] = random_labels(rng, n, kind, used)
    k_y = k_y if kind == "class" else 0
    led = ExactLedger(d, c, label_frac_bits=k_y)
    cut = sorted(rng.integers(0, n + 1, size=3).tolist())
    for lo, hi in zip([0, *cut], [*cut, n], strict=True):
        led.add(Q[lo:hi], Y[lo:hi])
    S_ref, G_ref = reference_ints(Q, Y, c, kind, k_y)
    assert (led.gram_int() == S_ref).all() and (led.moments_int() == G_ref).all()
    gone = rng.permutation(n)[: n // 2]
    led.delete(Q[gone], Y[gone])
    keep = np.setdiff1d(np.arange(n), gone)
    S_ref, G_ref = reference_ints(Q[keep], Y[keep], c, kind, k_y)
    assert (led.gram_int() == S_ref).all() and (led.moments_int() == G_ref).all()


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
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 8), n=st.integers(1, 30), kind=label_kinds,
       n_ops=st.integers(0, 80))
def test_copies_share_nothing_observable(seed: int, d: int, n: int, kind: str, n_ops: int) -> None:
    """Ledgers copied from one another (``copy`` shares S's limbs until one of them writes), each
    then added to, deleted from, absorbed into and read in any order: each equals the fresh ledger
    of its own retained rows."""
    rng = np.random.default_rng(seed)
    c = 3
    pool_Q, pool_Y = random_rows(rng, n, d), random_labels(rng, n, kind, c)
    ledgers, retained = [ExactLedger(d, c)], [[]]  # type: ignore[var-annotated]
    for _ in range(n_ops):
        i, op = int(rng.integers(len(ledgers))), rng.random()
        if op < 0.2:
            ledgers.append(ledgers[i].copy())
            retained.append(list(retained[i]))
        elif op < 0.3:
            ledgers[i].digest()  # a read folds what is pending, into new limbs where they are shared
        elif op < 0.4:
            j = int(rng.integers(len(ledgers)))
            ledgers[i].absorb(ledgers[j].copy())
            retained[i] += retained[j]
        elif op < 0.6 and retained[i]:
            pick = sorted(rng.choice(len(retained[i]), size=min(len(retained[i]), 3), replace=False), reverse=True)
            idx = [retained[i].pop(int(p)) for p in pick]
            ledgers[i].delete(pool_Q[idx], pool_Y[idx])
        else:
            idx = [int(k) for k in rng.integers(0, n, size=int(rng.integers(1, 4)))]
            ledgers[i].add(pool_Q[idx], pool_Y[idx])
            retained[i] += idx
    for led, rows in zip(ledgers, retained, strict=True):
        fresh = ExactLedger(d, c)
        if rows:
            fresh.add(pool_Q[sorted(rows)], pool_Y[sorted(rows)])
        assert led == fresh and led.count == len(rows)


def test_a_copys_shared_limbs_refuse_a_write_in_place() -> None:
    led = ExactLedger.from_rows(np.eye(3, dtype=np.int64) * QMAX, [0, 1, 2])
    copy = led.copy()
    for held in (led, copy):
        with pytest.raises(ValueError, match="read-only"):
            held.parts().gram[0][0, 0] += 1
    led.add(np.ones((1, 3), np.int64), [0])
    led.fold()  # writes new limbs: the copy's stay as they were
    assert led.parts().gram[0].flags.writeable and not copy.parts().gram[0].flags.writeable
    assert copy == ExactLedger.from_rows(np.eye(3, dtype=np.int64) * QMAX, [0, 1, 2])


def test_a_write_after_a_copy_reuses_the_limbs_shared_before_only_once_no_copy_holds_them() -> None:
    rng = np.random.default_rng(4)
    Q, y = random_rows(rng, 12, 5), rng.integers(0, 3, 12)

    def limbs(led: ExactLedger) -> list[int]:
        return [id(a) for a in led.parts().gram]

    led = ExactLedger.from_rows(Q[:4], y[:4])
    first = led.copy()
    ids0 = limbs(led)
    led.add(Q[4:6], y[4:6])
    ids1 = limbs(led)  # new arrays: the copy holds the first ones
    assert not set(ids1) & set(ids0)
    second = led.copy()
    del first  # now only ``led`` refers to the first limbs
    led.add(Q[6:8], y[6:8])
    assert limbs(led) == ids0  # written into them again, not into new arrays
    third = led.copy()
    led.add(Q[8:10], y[8:10])
    assert not set(limbs(led)) & set(ids0 + ids1)  # ``second`` still holds the limbs of ids1
    for copy, n in ((second, 6), (third, 8), (led, 10)):
        assert copy == ExactLedger.from_rows(Q[:n], y[:n])


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


@pytest.fixture()
def ledger() -> ExactLedger:
    rng = np.random.default_rng(0)
    led = ExactLedger(4, 3)
    led.add(Quantizer().quantize(rng.uniform(-0.1, 0.1, (6, 4))), [0, 1, 2, 0, 1, 2])
    return led


def _q(*rows: list[float]) -> np.ndarray:
    return Quantizer().quantize(np.array(rows, dtype=float))


BAD_UPDATES = [
    ("float Q", "add", lambda: (np.zeros((1, 4)), [0]), "integer array"),
    ("wrong width", "add", lambda: (np.zeros((1, 5), np.int64), [0]), r"shape \(r, 4\)"),
    ("3-d Q", "add", lambda: (np.zeros((1, 1, 4), np.int64), [0]), "shape"),
    ("q beyond 2^30", "add", lambda: (np.full((1, 4), QMAX + 1, np.int64), [0]), "exceeds 2\\^30"),
    ("label count", "add", lambda: (np.zeros((2, 4), np.int64), [0]), "2 rows"),
    ("negative class", "add", lambda: (np.zeros((1, 4), np.int64), [-1]), "class indices"),
    ("float labels", "add", lambda: (np.zeros((1, 4), np.int64), [0.5]), "dtype"),
    ("narrow targets", "add", lambda: (np.zeros((1, 4), np.int64), np.zeros((1, 2), np.int64)), "columns"),
    ("targets beyond 2^30", "add", lambda: (np.zeros((1, 4), np.int64), np.full((1, 3), QMAX + 1, np.int64)), "2\\^30"),
    ("delete unseen class", "delete", lambda: (np.zeros((1, 4), np.int64), [7]), "never seen|class"),
    ("delete beyond class count", "delete", lambda: (np.zeros((3, 4), np.int64), [0, 0, 0]), "class 0"),
    ("delete more than held", "delete", lambda: (np.zeros((7, 4), np.int64), np.zeros((7, 3), np.int64)), "holding 6"),
    ("delete never-added row", "delete", lambda: (_q([1, 1, 1, 1]), [0]), r"S\[\d,\d\] negative"),
]


@pytest.mark.parametrize("name,op,make,message", BAD_UPDATES, ids=[b[0] for b in BAD_UPDATES])
def test_bad_update_is_rejected_and_changes_nothing(ledger: ExactLedger, name: str, op: str, make,
                                                    message: str) -> None:
    before, blob = ledger.digest(), ledger.to_bytes()
    Q, y = make()
    with pytest.raises(LedgerError, match=message):
        getattr(ledger, op)(Q, y)
    assert ledger.digest() == before
    assert ledger.to_bytes() == blob


def test_non_member_delete_is_its_own_error_type(ledger: ExactLedger) -> None:
    with pytest.raises(NonMemberDelete):
        ledger.delete(_q([1, 1, 1, 1]), [0])


def test_overflow_budget_is_enforced(ledger: ExactLedger) -> None:
    ledger._count = MAX_COUNT  # white-box: reaching 2^32 samples for real takes hours
    before = ledger.to_bytes()
    with pytest.raises(OverflowBudgetError, match="2\\^32"):
        ledger.add(np.zeros((1, 4), np.int64), [0])
    assert ledger.to_bytes() == before


def test_incompatible_merge_is_rejected(ledger: ExactLedger) -> None:
    with pytest.raises(LedgerError, match="incompatible"):
        ledger.merge(ExactLedger(5, 3))
    with pytest.raises(LedgerError, match="incompatible"):
        ledger.merge(ExactLedger(4, 3, frac_bits=20))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 48), n=st.integers(1, 300), k=st.sampled_from([20, 30]))
def test_gram_equals_the_previous_formula(seed: int, d: int, n: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    Q = rng.integers(-(1 << 30), (1 << 30) + 1, size=(n, d), dtype=np.int64)
    Q[rng.random((n, d)) < 0.1] = -(1 << 30)
    y = rng.integers(0, 4, n)
    led = ExactLedger.from_rows(Q, y, n_outputs=4, frac_bits=k)
    led.delete(Q[: n // 3], y[: n // 3])
    ref = _mirror_upper(wide.to_float64(wide.combine(shifted(led.parts().gram))) * 2.0 ** (-2 * k))
    assert np.array_equal(led.gram().view(np.int64), ref.view(np.int64))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 100), block=st.integers(1, 40))
def test_mirror_upper_copies_the_upper_triangle(seed: int, d: int, block: int) -> None:
    M = np.random.default_rng(seed).standard_normal((d, d))
    want = np.triu(M) + np.triu(M, 1).T
    assert np.array_equal(_mirror_upper(M, block=block), want)
