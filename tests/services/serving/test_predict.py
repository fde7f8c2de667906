"""Predict inputs go through exactly the featurizer's contract (features.contract) and the head's
backbone; malformed bodies are refused with reason codes."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from tests.services.serving.support import dequantized, make_head
from unlearn.infra.settings import Settings
from unlearn.services.serving.predict import MAX_INPUTS, HeadStore, PredictError, parse_predict_body, prepare_inputs

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
                assert not node.module.startswith("unlearn.streams"), f"{path.name} imports {node.module}"
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
