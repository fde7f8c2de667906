"""Serving quantizes with the head's contract from the registry, not with its own settings: a
process configured with another UNLEARN_FRAC_BITS still serves the features the featurizer made."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.services.serving.support import Publisher, dequantized, http, make_head, wait_version
from unlearn.common.registry import publish_contract
from unlearn.infra.settings import Settings
from unlearn.schemas.head_contract import HeadContract
from unlearn.services.serving.http import ServingServer
from unlearn.services.serving.predict import HeadStore, PredictError, prepare_inputs

ROWS = [[3.0, -1.0, 0.5, 0.0, 2.0, 1.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]]


def contract(head: str = "h", **kw: object) -> HeadContract:
    base: dict = dict(head_id=head, version=1, dimension=6, backbone="features", input_kind="features",
                      normalization="l2", feature_bound=1.0, frac_bits=30, label_frac_bits=0, label_kind="class",
                      gamma=1.0, n_classes=3)
    return HeadContract(**{**base, **kw})


def test_prepare_inputs_follows_the_contract_over_the_settings() -> None:
    store = HeadStore()
    store.offer(make_head(1))
    sh = store.get("h")
    assert sh is not None
    own = Settings().with_(frac_bits=12, normalize_features=False, feature_bound=4.0)
    X = prepare_inputs(own, sh, "features", ROWS, contract())
    assert np.array_equal(X, dequantized(Settings().with_(frac_bits=30), ROWS))
    assert not np.array_equal(prepare_inputs(own, sh, "features", ROWS), X)  # no contract: the settings
    X20 = prepare_inputs(own, sh, "features", ROWS, contract(frac_bits=20, normalization="none", feature_bound=4.0))
    assert np.array_equal(X20, dequantized(Settings().with_(frac_bits=20, normalize_features=False, feature_bound=4.0),
                                           ROWS))
    with pytest.raises(PredictError) as e:
        prepare_inputs(own, sh, "text", ["hello"], contract())
    assert (e.value.status, e.value.reason) == (400, "backbone_mismatch")


def test_served_features_follow_the_registry(settings: Settings, publish: Publisher) -> None:
    publish_contract(settings, contract())
    v1 = make_head(1)
    publish(v1)
    expected = (dequantized(settings.with_(frac_bits=30), ROWS) @ v1.weights).tolist()
    with ServingServer(settings.with_(frac_bits=12)) as srv:
        wait_version(srv.url, "h", 1)
        deadline = time.monotonic() + 20
        while True:  # the registry follower catches up within moments of the heads follower
            status, out = http("POST", f"{srv.url}/v1/heads/h/predict", {"features": ROWS})
            assert status == 200, out
            scores = [p["scores"] for p in out["predictions"]]
            if scores == expected or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert scores == expected


def test_serving_uses_the_contract_version_its_head_update_names(settings: Settings, publish: Publisher) -> None:
    """A head update names the contract version it was built under (docs/registry.md); serving
    quantizes with that version, not with whatever the registry's latest is. (A real ``extend``
    changes only the label space; version 2 here changes the grid so the choice is visible.)"""
    from dataclasses import replace

    publish_contract(settings, contract())
    publish_contract(settings, contract(version=2, frac_bits=20, normalization="none", feature_bound=4.0))
    v1 = replace(make_head(1), contract_version=1)
    publish(v1)
    grid_v1 = dequantized(settings.with_(frac_bits=30), ROWS)
    grid_v2 = dequantized(settings.with_(frac_bits=20, normalize_features=False, feature_bound=4.0), ROWS)

    def served(srv: ServingServer, version: int, expected: list, contract_version: int) -> None:
        wait_version(srv.url, "h", version)
        deadline = time.monotonic() + 20
        while True:  # the registry follower catches up within moments of the heads follower
            status, out = http("POST", f"{srv.url}/v1/heads/h/predict", {"features": ROWS})
            assert status == 200, out
            scores = [p["scores"] for p in out["predictions"]]
            if (scores, out["contract_version"]) == (expected, contract_version) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert scores == expected and out["contract_version"] == contract_version
        status, summary = http("GET", f"{srv.url}/v1/heads/h")
        assert status == 200 and summary["contract_version"] == contract_version

    with ServingServer(settings.with_(frac_bits=12)) as srv:
        served(srv, 1, (grid_v1 @ v1.weights).tolist(), 1)
        v2 = replace(make_head(2, seed=1), contract_version=2)
        publish(v2)
        served(srv, 2, (grid_v2 @ v2.weights).tolist(), 2)
