"""Predictions name only classes with retained samples, whatever the label space: the ledger
processor's head update (exact or fast, after deletes that empty whole classes) through the codec,
then serving's ``predict`` and the SDK's ``predict_features``, against an independent retrain
(numpy ridge solve from the retained rows) ranked over the classes the test itself knows to hold
samples."""

from __future__ import annotations

import time

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unlearn.ledger import Quantizer, l2_normalize
from unlearn.schemas.delta_codec import Delta, RowsEntry
from unlearn.schemas.head import HeadUpdate, decode_head, encode_head
from unlearn.services.client.predict import featurize_rows, predict_features
from unlearn.services.serving.predict import ServedHead, predict
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime
from unlearn.streams.ledger.outputs import head_update

GAMMA = 0.5
CFG = HeadConfig(gamma=GAMMA, reset_every=1000, drift_threshold=1.0)


def published(rt: HeadRuntime) -> HeadUpdate:
    """What the ledger processor publishes for ``rt`` (with its posterior, the default), through the codec."""
    return decode_head(encode_head(head_update(rt, posterior=True)))


def retrain(rows: list[tuple[np.ndarray, int]], d: int, c: int) -> np.ndarray:
    """W = (F^T F + gamma I)^-1 F^T Y from the retained rows alone (float64, numpy)."""
    F = np.stack([q for q, _ in rows]).astype(np.float64) * 2.0 ** -30
    Y = np.zeros((len(rows), c))
    Y[np.arange(len(rows)), [y for _, y in rows]] = 1.0
    return np.linalg.solve(F.T @ F + GAMMA * np.eye(d), F.T @ Y)


@st.composite
def histories(draw: st.DrawFn) -> tuple[int, int, list[list[tuple[int, int]]], list[int]]:
    """(d, c, messages, labels): each message a list of (row index, +1/-1) ops on rows whose
    labels come from a few classes of a label space of c; every sample of some classes, and a few
    others, end deleted."""
    d = draw(st.integers(2, 6))
    c = draw(st.integers(1, 40))
    used = draw(st.lists(st.integers(0, c - 1), min_size=1, max_size=min(c, 5), unique=True))
    n = draw(st.integers(1, 14))
    labels = [draw(st.sampled_from(used)) for _ in range(n)]
    # delete every sample of some classes (a column that held data and holds none now) and a few more
    emptied = set(draw(st.lists(st.sampled_from(used), max_size=len(used), unique=True)))
    deleted = [i for i in range(n) if labels[i] in emptied or draw(st.integers(0, 3)) == 0]
    ops = [(i, +1) for i in range(n)] + [(i, -1) for i in deleted]
    cuts = sorted(draw(st.lists(st.integers(1, len(ops)), max_size=4)))
    messages = [ops[a:b] for a, b in zip([0, *cuts], [*cuts, len(ops)]) if ops[a:b]]
    return d, c, messages, labels


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.integers(0, 2**32 - 1))
def test_the_prediction_is_a_retained_class_and_the_argmax_of_a_retrain(
        history: tuple[int, int, list[list[tuple[int, int]]], list[int]], seed: int) -> None:
    d, c, messages, labels = history
    rng = np.random.default_rng(seed)
    Q = Quantizer().quantize(l2_normalize(rng.normal(size=(len(labels), d))))
    rt: HeadRuntime | None = None
    alive: dict[int, tuple[np.ndarray, int]] = {}
    for m, ops in enumerate(messages):
        entries = []
        for sign in (+1, -1):
            idx = [i for i, s in ops if s == sign]
            if idx:
                entries.append(RowsEntry(sign, [f"e{sign}{i}" for i in idx], [f"s{i}" for i in idx], ["u"] * len(idx),
                                         np.array([labels[i] for i in idx], np.int64), Q[idx]))
        delta = Delta("h", f"requests/0@{m}", d, 30, 0, tuple(entries), c, 1)
        if rt is None:
            rt = HeadRuntime.new("h", delta, CFG)
        rt.apply(delta, m, 0)
        rt.sync()  # small messages are tracked (a fast head), larger ones rebuild it (exact)
        for i, s in ops:
            if s > 0:
                alive[i] = (Q[i], labels[i])
            else:
                del alive[i]
    assert rt is not None
    head = published(rt)
    assert head.c == c
    classes = sorted({y for _, y in alive.values()})  # the test's own count, not the ledger's
    assert head.retained_classes is not None and np.flatnonzero(head.retained_classes).tolist() == classes

    X = featurize_rows(rng.normal(size=(16, d)))
    out = predict(ServedHead(head, time.time(), None, None, None), X, top_k=3)
    sdk = predict_features(head, X, top_k=3, normalize=False)  # X is already on the grid
    if not classes:
        assert all(p["predicted_class"] is None and p["top_classes"] == [] for p in out["predictions"])
        assert all(s is None for p in out["predictions"] for s in p["scores"])
        assert (sdk.predicted == -1).all()
        return
    ref = X @ retrain(list(alive.values()), d, c)
    for i, p in enumerate(out["predictions"]):
        assert p["predicted_class"] in classes and sdk.predicted[i] == p["predicted_class"]
        assert [j for j, s in enumerate(p["scores"]) if s is not None] == classes  # the others are absent
        assert p["top_classes"] == sdk.top[i].tolist() and len(p["top_classes"]) == min(3, len(classes))
        assert p["top_classes"][0] == p["predicted_class"] and set(p["top_classes"]) <= set(classes)
        best = sorted(classes, key=lambda j: -ref[i, j])
        gap = ref[i, best[0]] - ref[i, best[1]] if len(best) > 1 else np.inf
        if gap > 1e-9 * (1.0 + np.abs(ref[i, classes]).max()):  # not a float tie between two classes
            assert p["predicted_class"] == best[0], (p, ref[i].tolist())
