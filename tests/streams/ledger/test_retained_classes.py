"""What a head update says about its own data: which classes hold retained samples (from the
ledger's exact per-class counts, fast updates included) and what ``drift`` means (0.0 on an exact
update; the fast path's measured error on a fast one, never the 1.0 of a rebuilt head)."""

from __future__ import annotations

import numpy as np

from unlearn.ledger import Quantizer, l2_normalize
from unlearn.schemas.delta_codec import Delta, RowsEntry
from unlearn.schemas.head import HeadUpdate, decode_head, encode_head
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime
from unlearn.streams.ledger.worker import head_update

D = 8
CFG = HeadConfig(gamma=1.0, reset_every=1000, drift_threshold=1.0)  # no drift-triggered resets


def entry(sign: int, tag: str, labels: list[int] | np.ndarray, seed: int) -> RowsEntry:
    Q = Quantizer().quantize(l2_normalize(np.random.default_rng(seed).normal(size=(len(labels), D))))
    ids = [f"{tag}{i}" for i in range(len(labels))]
    return RowsEntry(sign, [f"e-{i}" for i in ids], ids, ["u"] * len(ids), np.asarray(labels, np.int64), Q)


def neg(e: RowsEntry) -> RowsEntry:
    return RowsEntry(-1, e.event_ids, e.sample_ids, e.subject_ids, e.labels, e.q)


def delta(src: int, *entries: RowsEntry, classes: int = 10) -> Delta:
    return Delta("h", f"requests/0@{src}", D, 30, 0, tuple(entries), classes, 1)


def update(rt: HeadRuntime) -> HeadUpdate:
    """The update the worker publishes for ``rt`` (with its posterior, the default), through the codec."""
    return decode_head(encode_head(head_update(rt, posterior=True)))


def test_retained_classes_follow_the_exact_counts_through_deletes_fast_and_exact() -> None:
    a = entry(+1, "a", [0, 1, 2, 2], seed=1)
    rt = HeadRuntime.new("h", delta(1, a), CFG)
    rt.apply(delta(1, a), 0, 0)
    rt.sync()  # 4 rows >= d/2: rebuilt, exact
    u = update(rt)
    assert u.mode == "exact" and u.c == 10
    assert np.flatnonzero(u.retained_classes).tolist() == [0, 1, 2]
    gone = RowsEntry(-1, a.event_ids[2:], a.sample_ids[2:], a.subject_ids[2:], a.labels[2:], a.q[2:])
    rt.apply(delta(2, gone), 1, 0)  # every sample of class 2 deleted
    rt.sync()  # 2 rows < d/2: tracked, fast
    u = update(rt)
    assert u.mode == "fast" and np.flatnonzero(u.retained_classes).tolist() == [0, 1]
    rt.apply(delta(3, neg(RowsEntry(1, a.event_ids[:2], a.sample_ids[:2], a.subject_ids[:2], a.labels[:2],
                                    a.q[:2]))), 2, 0)
    rt.sync()
    u = update(rt)
    assert u.n_retained == 0 and u.retained_classes is not None and not u.retained_classes.any()


def test_a_head_of_target_vectors_marks_no_classes() -> None:
    Q = entry(+1, "v", [0, 0], seed=2).q
    vec = RowsEntry(1, ["e1", "e2"], ["v1", "v2"], ["u", "u"], np.array([[3, -1, 0], [0, 2, 5]], np.int64), Q)
    rt = HeadRuntime.new("h", Delta("h", "requests/0@1", D, 30, 0, (vec,)), CFG)
    rt.apply(Delta("h", "requests/0@1", D, 30, 0, (vec,)), 0, 0)
    rt.sync()
    assert rt.retained_classes() is None and update(rt).retained_classes is None


def test_drift_is_zero_on_exact_updates_and_measured_only_on_a_tracked_fast_head() -> None:
    first = entry(+1, "a", list(range(10)) * 2, seed=3)  # 20 rows >= d/2: rebuilt, not tracked
    rt = HeadRuntime.new("h", delta(1, first), CFG)
    rt.apply(delta(1, first), 0, 0)
    rt.sync()
    # the rebuild replaced an all-zero head that never took a row: the old code published drift 1.0
    assert rt.mode == "exact" and rt.fast_drift == 0.0 and update(rt).drift == 0.0
    for i in range(3):  # small updates: the fast head tracks them
        e = entry(+1, f"b{i}", [i], seed=10 + i)
        rt.apply(delta(2 + i, e), 1 + i, 0)
        rt.sync()
    assert rt.mode == "fast"
    rt.reset("timer")  # replaces a fast head that had taken every row: measured
    measured = rt.fast_drift
    assert 0.0 < measured < 1e-9
    assert update(rt).drift == 0.0  # exact: the canonical solve itself
    e = entry(+1, "c", [4], seed=20)
    rt.apply(delta(9, e), 9, 0)
    rt.sync()
    assert rt.mode == "fast" and update(rt).drift == measured
    big = entry(+1, "d", list(range(10)), seed=21)
    rt.apply(delta(10, big), 10, 0)
    rt.sync()  # rebuilt (coalesced rows): the stale fast head is not measured
    assert rt.mode == "exact" and rt.fast_drift == measured
    again = HeadRuntime.from_snapshot(rt.state(), CFG)  # snapshots keep it
    assert again.fast_drift == measured
