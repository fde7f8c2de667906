"""The serving service: store rules, inputs through the featurizer's pipeline, hot swaps under
traffic against a real broker, the HTTP API (OpenAPI, health, Prometheus metrics) and the CLI."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unlearn.infra.settings import Settings
from unlearn.ledger import Quantizer
from unlearn.ledger.bayes import predictive_variance
from unlearn.schemas.head_codec import HeadUpdate, encode_head
from unlearn.features.contract import quantize_feature_row
from unlearn.services.serving.app import (
    HeadStore,
    PredictError,
    ServingServer,
    openapi_spec,
    parse_predict_body,
    predict,
    prepare_inputs,
)

D, C = 6, 3


def make_head(version: int, mode: str = "exact", seed: int = 0, head: str = "h", d: int = D, c: int = C,
              posterior: bool | None = None, W: np.ndarray | None = None) -> HeadUpdate:
    rng = np.random.default_rng(seed)
    if W is None:
        W = rng.normal(size=(d, c))
    T = None
    if posterior if posterior is not None else mode == "exact":
        A = rng.normal(size=(d, d))
        T = np.linalg.inv(A @ A.T + np.eye(d))
    digest = f"{version:02x}{seed % 256:02x}".ljust(64, "a" if mode == "exact" else "f")
    return HeadUpdate(head, version, mode, digest, 10 * version, 10 * version, ((0, version),), 0.0, 1.0,
                      time.time(), W, T)


def dequantized(settings: Settings, rows: list[list[float]]) -> np.ndarray:
    """What the featurizer's q is, back on the real scale (the test's own reference)."""
    Q = np.stack([quantize_feature_row(np.asarray(r), settings.frac_bits, settings.feature_bound,
                                       settings.normalize_features) for r in rows])
    return Quantizer(settings.frac_bits, settings.feature_bound).dequantize(Q)


def http(method: str, url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status, ctype = resp.read(), resp.status, resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raw, status, ctype = exc.read(), exc.code, exc.headers.get("Content-Type", "")
    return status, (json.loads(raw) if "json" in ctype else raw.decode())


class Publisher:
    """Publishes head updates (as the ledger processor does) and waits for the broker's ack."""

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import Producer

        from unlearn.infra.profiles import producer_config

        self.settings = settings
        self.producer = Producer(producer_config(settings, **{"linger.ms": 0}))

    def __call__(self, *updates: HeadUpdate) -> None:
        for u in updates:
            self.producer.produce(self.settings.topic("heads"), key=u.head_id.encode(), value=encode_head(u))
        assert self.producer.flush(30) == 0


@pytest.fixture
def publish(settings: Settings) -> Any:
    pub = Publisher(settings)
    yield pub
    del pub.producer


def wait_version(url: str, head: str, version: int, mode: str | None = None, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        status, last = http("GET", f"{url}/v1/heads/{head}")
        if status == 200 and last["version"] >= version and (mode is None or last["mode"] == mode):
            return last
        time.sleep(0.05)
    raise AssertionError(f"serving never showed {head} version {version} {mode or ''}: {last}")


# --------------------------------------------------------------------------- no broker
def test_store_accepts_only_newer_versions_and_exact_supersedes_fast() -> None:
    store = HeadStore()
    f1, e1, f2, e2 = make_head(1, "fast", 1), make_head(1, "exact", 2), make_head(2, "fast", 3), make_head(2, "exact", 4)
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


def test_inputs_go_through_the_featurizer_quantization() -> None:
    s = Settings(frac_bits=20)
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
    spec = openapi_spec()
    assert spec["openapi"].startswith("3.") and "/v1/heads/{head}/predict" in spec["paths"]


# --------------------------------------------------------------------------- against the broker
def test_head_update_mid_traffic_is_picked_up_and_api(settings: Settings, publish: Publisher) -> None:
    rows = [[0.3, -0.2, 0.9, 0.1, -0.5, 0.05], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]]
    X = dequantized(settings, rows)
    v1 = make_head(1, "exact", seed=1)
    publish(v1)
    with ServingServer(settings) as srv:
        wait_version(srv.url, "h", 1)
        status, out = http("POST", f"{srv.url}/v1/heads/h/predict", {"features": rows})
        assert status == 200
        assert [p["scores"] for p in out["predictions"]] == (X @ v1.weights).tolist()
        assert [p["variance"] for p in out["predictions"]] == predictive_variance(X, v1.posterior).tolist()
        assert out["variance"]["source"] == "current_head" and out["digest"] == v1.digest

        # traffic in a thread while new versions are published
        seen: list[tuple[int, str, list]] = []
        stop = threading.Event()

        def traffic() -> None:
            while not stop.is_set():
                st, o = http("POST", f"{srv.url}/v1/heads/h/predict", {"features": rows})
                assert st == 200
                seen.append((o["version"], o["mode"], o["predictions"]))

        def traffic_saw(key: tuple[int, str], n: int = 3) -> None:
            deadline = time.monotonic() + 20
            while sum(1 for v, m, _ in seen if (v, m) == key) < n:
                assert time.monotonic() < deadline and t.is_alive(), f"traffic never saw {key}"
                time.sleep(0.01)

        t = threading.Thread(target=traffic)
        t.start()
        traffic_saw((1, "exact"))
        v2f = make_head(2, "fast", seed=2)
        v2e = make_head(2, "exact", seed=3)
        publish(v2f)
        traffic_saw((2, "fast"))
        publish(v2e, make_head(1, "exact", seed=4))  # the stale v1 after it is ignored
        traffic_saw((2, "exact"))
        stop.set()
        t.join(10)
        by_key = {(1, "exact"): v1, (2, "fast"): v2f, (2, "exact"): v2e}
        order = [(v, m) for v, m, _ in seen]
        assert set(order) == set(by_key), "every published head was served"
        assert order == sorted(order, key=lambda k: (k[0], k[1] == "exact")), "never went back to an older head"
        for v, m, preds in seen:
            u = by_key[(v, m)]
            assert [p["scores"] for p in preds] == (X @ u.weights).tolist(), "scores exactly as that head implies"
            T = v1.posterior if (v, m) == (2, "fast") else u.posterior  # fast v2: last exact posterior
            assert [p["variance"] for p in preds] == predictive_variance(X, T).tolist()

        # the rest of the API
        status, h = http("GET", f"{srv.url}/v1/heads/h")
        assert status == 200 and (h["version"], h["mode"], h["digest"]) == (2, "exact", v2e.digest)
        assert h["n_retained"] == 20 and h["age_seconds"] >= 0 and h["d"] == D and h["c"] == C
        status, hw = http("GET", f"{srv.url}/v1/heads/h?weights=1")
        assert np.array_equal(np.array(hw["weights"]), v2e.weights)
        assert http("GET", f"{srv.url}/v1/heads")[1]["heads"][0]["head_id"] == "h"
        status, err = http("POST", f"{srv.url}/v1/heads/nope/predict", {"features": rows})
        assert status == 404 and err["error"] == "unknown_head"
        status, err = http("POST", f"{srv.url}/v1/heads/h/predict", {"features": [[1, 2]]})
        assert status == 400 and err["error"] == "dimension_mismatch"
        status, health = http("GET", f"{srv.url}/healthz")
        assert status == 200 and health["status"] == "ok" and health["ready"] and health["heads"] == 1
        status, spec = http("GET", f"{srv.url}/openapi.json")
        assert status == 200 and "/healthz" in spec["paths"]
        deadline = time.monotonic() + 10
        while True:  # the consumer lag gauge is refreshed every 0.5 s
            status, metrics = http("GET", f"{srv.url}/metrics")
            assert status == 200
            lines = metrics.splitlines()
            if "unlearn_serving_consumer_lag_total 0" in lines or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        n_ok = sum(int(float(l.rsplit(" ", 1)[1])) for l in lines if l.startswith(
            'unlearn_serving_requests_total{route="/v1/heads/{head}/predict",method="POST",status="200"}'))
        assert n_ok == len(seen) + 1
        assert 'unlearn_serving_head_version{head="h",mode="exact"} 2' in lines
        assert 'unlearn_serving_head_updates_total{result="stale"} 1' in lines
        assert 'unlearn_serving_head_updates_total{result="accepted"} 3' in lines
        assert "unlearn_serving_consumer_lag_total 0" in lines
        assert any(l.startswith('unlearn_serving_request_duration_seconds_bucket{route="/v1/heads/{head}/predict",le="+Inf"}')
                   for l in lines)
        assert "# TYPE unlearn_serving_request_duration_seconds histogram" in lines


def test_concurrent_requests_never_see_a_mixed_head(settings: Settings, publish: Publisher) -> None:
    import aiohttp

    rng = np.random.default_rng(7)
    WA = rng.normal(size=(D, C))
    WB = WA + 1.0 + rng.uniform(0.1, 1.0, size=(D, C))  # differs from WA in every entry
    heads = {v: make_head(v, "exact", seed=v, W=WA if v % 2 else WB) for v in range(1, 31)}
    rows = rng.normal(size=(8, D)).tolist()
    X = dequantized(settings, rows)
    expect = {v: ((X @ u.weights).tolist(), predictive_variance(X, u.posterior).tolist(), u.digest)
              for v, u in heads.items()}
    assert not np.any(X @ WA == X @ WB)
    publish(heads[1])

    async def client(session: aiohttp.ClientSession, url: str, stop: asyncio.Event, out: list) -> None:
        while not stop.is_set():
            async with session.post(url, json={"features": rows}) as resp:
                assert resp.status == 200
                out.append(await resp.json())

    async def run(url: str) -> list:
        out: list = []
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(client(session, url, stop, out)) for _ in range(8)]
            loop = asyncio.get_running_loop()
            for v in range(2, 31):  # swap heads under the concurrent load
                await loop.run_in_executor(None, publish, heads[v])
                await asyncio.sleep(0.02)
            await loop.run_in_executor(None, wait_version, url.rsplit("/v1", 1)[0], "h", 30)
            await asyncio.sleep(0.1)
            stop.set()
            await asyncio.gather(*tasks)
        return out

    with ServingServer(settings) as srv:
        wait_version(srv.url, "h", 1)
        responses = asyncio.run(run(f"{srv.url}/v1/heads/h/predict"))
    versions = set()
    for o in responses:
        scores, var, digest = expect[o["version"]]
        assert [p["scores"] for p in o["predictions"]] == scores, f"torn head at version {o['version']}"
        assert [p["variance"] for p in o["predictions"]] == var and o["digest"] == digest
        versions.add(o["version"])
    assert len(responses) > 50 and len(versions) > 5
    assert {v % 2 for v in versions} == {0, 1}, "both heads were served"


def test_text_inputs_use_the_head_backbone(settings: Settings, publish: Publisher) -> None:
    from unlearn.features.backbones import get_backbone

    d = 384
    u = make_head(1, "exact", seed=3, d=d, c=2, head="tweets")
    publish(u)
    texts = ["what a lovely day", "this is terrible"]
    feats = get_backbone("minilm", "cpu").encode(texts)
    X = dequantized(settings, [f.tolist() for f in feats])
    with ServingServer(settings) as srv:
        wait_version(srv.url, "tweets", 1)
        status, out = http("POST", f"{srv.url}/v1/heads/tweets/predict", {"text": texts}, timeout=60)
        assert status == 200, out
        assert [p["scores"] for p in out["predictions"]] == (X @ u.weights).tolist()
        status, out = http("POST", f"{srv.url}/v1/heads/tweets/predict", {"features": [0.1] * d})
        assert status == 200 and out["batched"] is False  # a features head id is not configured: allowed


def test_serve_cli_starts_and_stops(settings: Settings, publish: Publisher, tmp_path: Path) -> None:
    import socket

    from unlearn.infra.processes import ServiceProcess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    publish(make_head(5, "exact", seed=5))
    proc = ServiceProcess("serve", ["serve", "--port", str(port)], settings, tmp_path).start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if http("GET", f"{url}/healthz", timeout=2)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, proc.log_tail()
            time.sleep(0.1)
        assert wait_version(url, "h", 5)["mode"] == "exact"
    finally:
        code = proc.stop()
    assert code == 0, proc.log_tail()
    assert "serving on http://127.0.0.1:" in proc.log_path.read_text()
