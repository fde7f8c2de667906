"""The Open Inference Protocol v2 on ``unlearn serve``, called with the client teams already run
(tritonclient[http], pinned): server and model metadata, readiness, and batch inference whose
scores, predicted classes and variances are exactly those ``/v1`` answers for the same rows, in
both encodings (binary tensor data, tritonclient's default, and JSON); versions that are not
served and malformed requests are refused with ``{"error": ...}`` and the right status."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.services.serving.support import C, D, http, make_head
from unlearn.infra.settings import Settings
from unlearn.schemas.head_contract import HeadContract
from unlearn.services.serving.http import ServingServer
from unlearn.services.serving.predict import HeadStore

VERSION = 7


@pytest.fixture
def served() -> Iterator[tuple[ServingServer, triton.InferenceServerClient]]:
    store = HeadStore()
    store.offer(make_head(VERSION, seed=3))
    # class 1 holds no retained sample: its scores are NaN / null, and it is never predicted
    store.offer(dataclasses.replace(make_head(VERSION, seed=4, head="masked"),
                                    retained_classes=np.array([True, False, True])))
    store.offer(make_head(2, head="nopost", posterior=False))  # no posterior: variance NaN
    with ServingServer(Settings(), follow=False, store=store) as srv:
        client = triton.InferenceServerClient(url=srv.url.removeprefix("http://"), network_timeout=10)
        try:
            yield srv, client
        finally:
            client.close()


def _v1(url: str, head: str, X: np.ndarray) -> dict:
    status, out = http("POST", f"{url}/v1/heads/{head}/predict", {"features": X.tolist()})
    assert status == 200, out
    return out


def _infer(client: triton.InferenceServerClient, head: str, X: np.ndarray, binary: bool,
           version: str = "") -> triton.InferResult:
    inp = triton.InferInput("features", list(X.shape), "FP32")
    inp.set_data_from_numpy(X, binary_data=binary)
    outs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("scores", "predicted_class", "variance")]
    return client.infer(head, [inp], model_version=version, outputs=outs, request_id="r-1")


def test_server_metadata_and_health(served: tuple[ServingServer, triton.InferenceServerClient]) -> None:
    _, client = served
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "unlearn-stream" and "binary_tensor_data" in meta["extensions"]


def test_model_metadata_declares_inputs_outputs_and_the_head_version(
        served: tuple[ServingServer, triton.InferenceServerClient]) -> None:
    _, client = served
    meta = client.get_model_metadata("h")
    assert meta["name"] == "h" and meta["versions"] == [str(VERSION)]
    assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, D]}]
    assert meta["outputs"] == [{"name": "scores", "datatype": "FP64", "shape": [-1, C]},
                               {"name": "predicted_class", "datatype": "INT64", "shape": [-1]},
                               {"name": "variance", "datatype": "FP64", "shape": [-1]}]
    assert client.get_model_metadata("h", str(VERSION)) == meta
    assert client.is_model_ready("h") and client.is_model_ready("h", str(VERSION))
    assert not client.is_model_ready("h", str(VERSION - 1)) and not client.is_model_ready("nope")
    with pytest.raises(InferenceServerException, match="version '6' is not served"):
        client.get_model_metadata("h", str(VERSION - 1))
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.get_model_metadata("nope")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("head", ["h", "masked", "nopost"])
def test_batch_infer_equals_v1_predictions(served: tuple[ServingServer, triton.InferenceServerClient],
                                           binary: bool, head: str) -> None:
    srv, client = served
    X = np.random.default_rng(11).normal(size=(40, D)).astype(np.float32)
    res = _infer(client, head, X, binary)
    v1 = _v1(srv.url, head, X.astype(np.float64))  # the same rows: FP32 values, exactly, as JSON doubles
    resp = res.get_response()
    assert resp["model_name"] == head and resp["model_version"] == str(v1["version"]) and resp["id"] == "r-1"
    scores, predicted, variance = (res.as_numpy(n) for n in ("scores", "predicted_class", "variance"))
    assert scores.shape == (40, C) and predicted.shape == (40,) and variance.shape == (40,)
    want_scores = np.array([[np.nan if v is None else v for v in p["scores"]] for p in v1["predictions"]])
    np.testing.assert_array_equal(scores, want_scores)  # bit for bit, NaN where /v1 says null
    assert predicted.tolist() == [p["predicted_class"] for p in v1["predictions"]]
    want_var = [np.nan if p["variance"] is None else p["variance"] for p in v1["predictions"]]
    np.testing.assert_array_equal(variance, np.array(want_var))
    if head == "masked":
        assert np.isnan(scores[:, 1]).all() and 1 not in predicted.tolist()
    assert np.isnan(variance).all() == (head == "nopost")


def test_infer_at_the_served_version_and_refusals(served: tuple[ServingServer, triton.InferenceServerClient]) -> None:
    srv, client = served
    X = np.ones((2, D), np.float32)
    assert _infer(client, "h", X, True, version=str(VERSION)).get_response()["model_version"] == str(VERSION)
    with pytest.raises(InferenceServerException, match="not served"):
        _infer(client, "h", X, True, version="1")
    with pytest.raises(InferenceServerException, match="dimension_mismatch"):
        _infer(client, "h", np.ones((2, D + 1), np.float32), True)
    url = f"{srv.url}/v2/models/h/infer"
    ok = {"name": "features", "shape": [1, D], "datatype": "FP32", "data": [0.5] * D}
    for body, status in (({"inputs": [{**ok, "name": "pixels"}]}, 400),
                         ({"inputs": [{**ok, "datatype": "INT8"}]}, 400),
                         ({"inputs": [{**ok, "shape": [2, D]}]}, 400),
                         ({"inputs": [{**ok, "shape": [1, -D]}]}, 400),
                         ({"inputs": [{**ok, "data": ["x"] * D}]}, 400),
                         ({"inputs": [{**ok, "data": [1e300] * D}]}, 400),  # inf as FP32: non-finite
                         ({"inputs": [ok], "outputs": [{"name": "logits"}]}, 400),
                         ({"inputs": [ok], "id": 5}, 400),
                         ({"inputs": []}, 400)):
        got, err = http("POST", url, body)
        assert got == status and set(err) == {"error"} and isinstance(err["error"], str), (body, got, err)
    got, err = http("POST", f"{srv.url}/v2/models/nope/infer", {"inputs": [ok]})
    assert got == 404 and "unknown model" in err["error"]
    assert http("GET", f"{srv.url}/v2/models/h?x=1")[0] == 400
    # JSON data may be nested, as OIP allows; selected outputs come back alone, in the order asked
    body = {"inputs": [{**ok, "data": [[0.5] * D]}], "outputs": [{"name": "variance"}]}
    got, out = http("POST", url, body)
    assert got == 200 and [o["name"] for o in out["outputs"]] == ["variance"]


def test_a_text_head_takes_bytes_and_answers_as_v1() -> None:
    """Metadata follows the head's contract: a text head takes BYTES ``text`` (UTF-8), embedded by
    its backbone exactly as /v1 embeds it; a features tensor is refused, as on /v1."""
    from unlearn.features.backbones import backbone_info
    from unlearn.services.serving.oip import input_kind_of

    d = backbone_info("minilm").dim
    assert d is not None
    contract = HeadContract(head_id="t", version=1, dimension=d, backbone="minilm", input_kind="text",
                            normalization="l2", feature_bound=1.0, frac_bits=30, label_frac_bits=0,
                            label_kind="class", gamma=1.0, n_classes=C)
    store = HeadStore()
    store.offer(make_head(1, head="t", d=d))
    served_t = store.get("t")
    assert served_t is not None and input_kind_of(Settings(), served_t, {"t": contract}) == "text"
    texts = ["the cat sat on the mat", "stock prices fell sharply", "ünïcödé wörks too"]
    with ServingServer(Settings(), follow=False, store=store, contracts={"t": contract}) as srv:
        client = triton.InferenceServerClient(url=srv.url.removeprefix("http://"), network_timeout=60)
        try:
            meta = client.get_model_metadata("t")
            got = {}
            for binary in (True, False):
                inp = triton.InferInput("text", [len(texts)], "BYTES")
                inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary_data=binary)
                got[binary] = client.infer("t", [inp]).as_numpy("scores")
        finally:
            client.close()
        status, v1 = http("POST", f"{srv.url}/v1/heads/t/predict", {"text": texts}, timeout=60)
        refused, err = http("POST", f"{srv.url}/v2/models/t/infer",
                            {"inputs": [{"name": "features", "shape": [1, d], "datatype": "FP32", "data": [1.0] * d}]})
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert status == 200
    want = np.array([[np.nan if v is None else v for v in p["scores"]] for p in v1["predictions"]])
    np.testing.assert_array_equal(got[True], want)
    np.testing.assert_array_equal(got[False], want)
    assert refused == 400 and "backbone_mismatch" in err["error"]
