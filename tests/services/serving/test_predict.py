"""Predict inputs go through exactly the featurizer's contract (features.contract) and the head's
backbone; malformed bodies are refused with reason codes.

The store's rules: only superseding updates are served, exact supersedes fast at one version,
and the posterior of the last exact head carries variance across fast updates.

Predictions name only classes with retained samples, whatever the label space: the ledger
processor's head update (exact or fast, after deletes that empty whole classes) through the codec,
then serving's ``predict`` and the SDK's ``predict_features``, against an independent retrain
(numpy ridge solve from the retained rows) ranked over the classes the test itself knows to hold
samples."""

from __future__ import annotations

import ast
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.services.serving.support import D, dequantized, make_head
from unlearn.infra.settings import Settings
from unlearn.ledger import Quantizer, l2_normalize
from unlearn.ledger.bayes import predictive_variance
from unlearn.schemas.delta_codec import Delta, RowsEntry
from unlearn.schemas.head import HeadUpdate, decode_head, encode_head
from unlearn.services.client.predict import featurize_rows, predict_features
from unlearn.services.serving.predict import (
    MAX_INPUTS,
    HeadStore,
    PredictError,
    ServedHead,
    parse_predict_body,
    predict,
    prepare_inputs,
)
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime
from unlearn.streams.ledger.outputs import head_update

SERVING = Path(__file__).resolve().parents[3] / "services" / "serving"


def test_inputs_go_through_the_featurizer_quantization() -> None:
    s = Settings().with_(frac_bits=20)
    store = HeadStore()
    store.offer(make_head(1))
    sh = store.get("h")
    rows = [[3.0, -1.0, 0.5, 0.0, 2.0, 1.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]]
    kind, items, batched = parse_predict_body({"features": rows})
    assert kind == "features" and batched
    X = prepare_inputs(s, sh, kind, items)
    assert np.array_equal(X, dequantized(s, rows))  # normalized, on the 2^-20 grid
    assert np.array_equal(X * 2**20, np.rint(X * 2**20))
    assert parse_predict_body({"features": rows[0]})[2] is False
    with pytest.raises(PredictError) as e:
        prepare_inputs(s, sh, "features", [[1.0, 2.0]])
    assert e.value.status == 400 and e.value.reason == "dimension_mismatch"
    with pytest.raises(PredictError) as e:
        prepare_inputs(s.with_(normalize_features=False), sh, "features", [[2.0, 0, 0, 0, 0, 0]])
    assert e.value.reason == "feature_out_of_bound"
    for bad in ({}, {"features": [[1, "x"]]}, {"text": ""}, {"features": [1], "text": "a"}, {"image_png": "$$"},
                {"pixels": [1]}):
        with pytest.raises(PredictError):
            parse_predict_body(bad)
    # a head configured with a text backbone refuses feature vectors, as the featurizer does
    with pytest.raises(PredictError) as e:
        prepare_inputs(s.with_(head_backbones="h=minilm"), sh, "features", [rows[0]])
    assert e.value.reason == "backbone_mismatch"


def test_parse_predict_body_reasons() -> None:
    cases = {
        "bad_body": [[], {}, {"pixels": [1]}, {"features": [1], "text": "a"}, {"text": []},
                     {"text": ["a"] * (MAX_INPUTS + 1)}],
        "bad_features": [{"features": [[1, "x"]]}, {"features": [[]]}, {"features": [[True, 1.0]]}],
        "bad_text": [{"text": ""}, {"text": ["a", 3]}],
        "bad_base64": [{"image_png": "$$"}, {"image_png": 7}, {"image_png": ["é"]}],
    }
    for reason, bodies in cases.items():
        for body in bodies:
            with pytest.raises(PredictError) as e:
                parse_predict_body(body)
            assert (e.value.status, e.value.reason) == (400, reason), body
    assert parse_predict_body({"text": "hi"}) == ("text", ["hi"], False)
    assert parse_predict_body({"image_png": ["aGk="]}) == ("image_png", [b"hi"], True)
    assert len(parse_predict_body({"features": [[0.0]] * MAX_INPUTS})[1]) == MAX_INPUTS


def test_non_finite_features_are_refused_by_the_contract() -> None:
    store = HeadStore()
    store.offer(make_head(1, d=2))
    with pytest.raises(PredictError) as e:
        prepare_inputs(Settings(), store.get("h"), "features", [[float("inf"), 0.0]])
    assert (e.value.status, e.value.reason) == (400, "non_finite_feature")


def test_serving_imports_the_feature_contract_only_from_features() -> None:
    """Quantization (and the default backbones) come from unlearn.features.contract, never from the
    featurizer's internals or the ledger's Quantizer, so training and serving cannot drift apart."""
    for path in SERVING.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                stage = node.module.startswith(("unlearn.streams.featurizer", "unlearn.streams.ledger"))
                assert not stage, f"{path.name} imports {node.module}"
                if node.module == "unlearn.ledger":
                    assert not {a.name for a in node.names} & {"Quantizer", "l2_normalize"}, path.name


def test_backbone_resolution_follows_the_contract() -> None:
    store = HeadStore()
    store.offer(make_head(1, d=2))
    sh = store.get("h")
    with pytest.raises(PredictError) as e:  # a configured backbone that does not exist: the server's fault
        prepare_inputs(Settings().with_(head_backbones="h=no-such-backbone"), sh, "features", [[1.0, 0.0]])
    assert (e.value.status, e.value.reason) == (500, "backbone_unavailable")
    with pytest.raises(PredictError) as e:  # a head configured with a text backbone refuses an image
        prepare_inputs(Settings().with_(head_backbones="h=minilm"), sh, "image_png", [b"\x89PNG"])
    assert (e.value.status, e.value.reason) == (400, "backbone_mismatch")


def test_store_accepts_only_newer_versions_and_exact_supersedes_fast() -> None:
    store = HeadStore()
    f1, e1 = make_head(1, "fast", 1), make_head(1, "exact", 2)
    f2, e2 = make_head(2, "fast", 3), make_head(2, "exact", 4)
    assert store.offer(f1) == "accepted" and store.get("h").posterior is None
    assert store.offer(e1) == "accepted" and store.get("h").posterior_source == "current_head"
    assert store.offer(make_head(1, "fast", 9)) == "stale"  # fast never replaces exact of the same version
    assert store.offer(make_head(1, "exact", 9)) == "stale"  # same (version, mode): first one stays
    assert store.get("h").update is e1
    assert store.offer(f2) == "accepted"
    sh = store.get("h")
    # no posterior on the fast head: the last exact one (version 1) is used, and said so
    assert sh.update is f2 and sh.posterior is e1.posterior and sh.posterior_version == 1
    assert sh.posterior_source == "last_exact_head"
    X = np.random.default_rng(0).normal(size=(4, D)) / 3
    out = predict(sh, X, sigma2=2.0)
    assert out["version"] == 2 and out["mode"] == "fast" and out["digest"] == f2.digest
    assert out["variance"]["source"] == "last_exact_head" and out["variance"]["posterior_version"] == 1
    assert "version 1" in out["variance"]["note"]
    want = predictive_variance(X, e1.posterior, 2.0)
    assert [p["variance"] for p in out["predictions"]] == want.tolist()
    assert [p["scores"] for p in out["predictions"]] == (X @ f2.weights).tolist()
    assert [p["predicted_class"] for p in out["predictions"]] == np.argmax(X @ f2.weights, axis=1).tolist()
    assert store.offer(e1) == "stale"
    assert store.offer(e2) == "accepted" and store.get("h").posterior_version == 2
    # a head that never carried a posterior: variance unavailable, explained
    store.offer(make_head(1, "fast", 5, head="g"))
    out = predict(store.get("g"), X)
    assert out["variance"]["available"] is False and all(p["variance"] is None for p in out["predictions"])


def test_store_order_is_head_update_supersedes() -> None:
    """The store has no ordering of its own: it accepts exactly what ``HeadUpdate.supersedes`` says."""
    updates = [make_head(v, m, seed=10 * v + (m == "exact")) for v in (1, 2, 3) for m in ("fast", "exact")]
    for cur in updates:
        for new in updates:
            store = HeadStore()
            store.offer(cur)
            assert (store.offer(new) == "accepted") == new.supersedes(cur)


def test_a_fast_head_without_a_digest_is_served_with_a_null_digest() -> None:
    """Fast head updates carry no ledger digest (it is computed at resets): serving shows null and
    still names the digest of the exact head whose posterior gives the variance."""
    store = HeadStore()
    e1 = make_head(1, "exact", 1)
    bare = replace(make_head(2, "fast", 2), digest=None)
    assert store.offer(e1) == "accepted" and store.offer(bare) == "accepted"
    sh = store.get("h")
    assert sh is not None and sh.summary()["digest"] is None
    out = predict(sh, np.zeros((1, D)))
    assert out["digest"] is None and out["mode"] == "fast"
    assert out["variance"]["posterior_digest"] == e1.digest and out["variance"]["posterior_version"] == 1


def test_posterior_of_another_dimension_is_not_carried_over() -> None:
    store = HeadStore()
    store.offer(make_head(1, "exact", 1))
    assert store.offer(make_head(2, "fast", 2, d=D + 1)) == "accepted"
    sh = store.get("h")
    assert sh.posterior is None and sh.posterior_source is None and sh.posterior_version is None


def test_summary_and_snapshot() -> None:
    store = HeadStore()
    u = make_head(3, "exact", 1)
    store.offer(u, now=u.created_ts + 2.0)
    assert len(store) == 1 and list(store.all()) == ["h"]
    s = store.get("h").summary(now=u.created_ts + 5.0)
    assert (s["head_id"], s["version"], s["mode"], s["d"], s["c"]) == ("h", 3, "exact", D, 3)
    assert s["age_seconds"] == 5.0 and s["received_age_seconds"] == 3.0
    assert s["has_posterior"] and s["posterior_version"] == 3 and s["offsets"] == [[0, 3]]
    snap = store.all()
    store.offer(make_head(4, "exact", 2))
    assert snap["h"].update is u  # a snapshot is a copy: later swaps do not show through

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
