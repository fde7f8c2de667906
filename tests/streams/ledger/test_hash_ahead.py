"""The retained rows' hash summed on a helper thread while the ledger applies the rows
(streams/ledger/hash_ahead.py): after any sequence of entries, large and small, applied and
refused, it is the hash of exactly the rows the ledger retains."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.ledger import ExactLedger, MultisetHash, Quantizer, l2_normalize
from unlearn.schemas.delta_codec import Delta, RowsEntry
from unlearn.streams.ledger.hash_ahead import AHEAD_MIN_ROWS, HashAhead
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime

CFG = HeadConfig(gamma=1.0, reset_every=1000, drift_threshold=1e-9)
D = 5


def _entry(sign: int, Q: np.ndarray, y: np.ndarray, ids: list[int]) -> RowsEntry:
    return RowsEntry(sign, [f"e{sign}{i}" for i in ids], [f"s{i}" for i in ids], ["u"] * len(ids), y, Q)


# one step: (kind, number of rows); sizes around AHEAD_MIN_ROWS so both paths run
_steps = st.lists(st.tuples(st.sampled_from(["add", "delete", "non_member"]),
                            st.integers(1, 2 * AHEAD_MIN_ROWS)), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(steps=_steps, seed=st.integers(0, 2**16), read_every=st.integers(1, 4))
def test_the_hash_is_of_the_retained_rows_whatever_is_summed_ahead(steps: list[tuple[str, int]], seed: int,
                                                                   read_every: int) -> None:
    rng = np.random.default_rng(seed)
    pool = 8 * AHEAD_MIN_ROWS * len(steps)
    Q = Quantizer().quantize(l2_normalize(rng.normal(size=(pool, D))))
    y = rng.integers(0, 3, pool)
    head = HeadRuntime.new("h", Delta("h", "x", D, 30, 0, ()), CFG)
    retained: list[int] = []
    fresh = iter(range(pool))
    for i, (kind, n) in enumerate(steps):
        if kind == "add":
            ids = [next(fresh) for _ in range(n)]
        elif kind == "delete" and retained:
            ids = list(rng.choice(retained, size=min(n, len(retained)), replace=False))
        else:  # rows never added, of a class never added: the ledger refuses the entry, and its
            ids = [next(fresh) for _ in range(n)]  # sum (started ahead when large) is never folded
            kind = "non_member"
        sign = 1 if kind == "add" else -1
        labels = y[ids] if kind != "non_member" else np.full(len(ids), 7)
        out = head.apply(Delta("h", f"x/{i}", D, 30, 0, (_entry(sign, Q[ids], labels, ids),)), i, 0)
        assert bool(out.rejections) == (kind == "non_member")
        if kind == "add":
            retained += ids
        elif kind == "delete":
            retained = [r for r in retained if r not in set(ids)]
        if i % read_every == 0 or out.deletes:
            expected = MultisetHash.of_rows(Q[retained].reshape(-1, D), y[retained])
            assert head.multiset == expected
    assert head.multiset == MultisetHash.of_rows(Q[retained].reshape(-1, D), y[retained])
    assert head.ledger.digest() == ExactLedger.from_rows(Q[retained].reshape(-1, D), y[retained],
                                                         n_outputs=head.ledger.n_outputs).digest()


def test_a_refused_large_entry_started_ahead_is_dropped_unfolded() -> None:
    Q = Quantizer().quantize(l2_normalize(np.random.default_rng(1).normal(size=(2 * AHEAD_MIN_ROWS, D))))
    y = np.zeros(len(Q), np.int64)
    hashed = HashAhead(MultisetHash(D))
    entry = _entry(+1, Q, y, list(range(len(Q))))
    started = hashed.start(entry)
    assert started is not None  # large enough to go to the helper thread
    hashed.dropped(started)
    assert hashed.value == MultisetHash(D)
    small = _entry(+1, Q[:1], y[:1], [0])
    assert hashed.start(small) is None  # hashed at once by ``applied``
    hashed.applied(small, None)
    assert hashed.value == MultisetHash.of_rows(Q[:1], y[:1])
    unknown = HashAhead(None)
    assert unknown.start(entry) is None
    unknown.applied(entry, None)
    assert unknown.value is None
