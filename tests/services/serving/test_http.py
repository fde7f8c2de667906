"""The HTTP API against a real broker: head updates picked up mid traffic, no response ever mixes
two heads under concurrent swaps, text inputs through the head's backbone, health and metrics."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from tests.services.serving.support import (
    C,
    D,
    Publisher,
    dequantized,
    http,
    make_head,
    metric_samples,
    sample,
    wait_version,
)
from unlearn.infra.settings import Settings
from unlearn.ledger.bayes import predictive_variance
from unlearn.services.serving.http import ServingServer


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
        # ready = every partition's end seen (partition EOF): on Apache Kafka that comes with the
        # next, empty fetch, up to fetch.wait.max.ms (0.5 s) after the last record
        deadline = time.monotonic() + 10
        while True:
            status, health = http("GET", f"{srv.url}/healthz")
            if health["ready"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == 200 and health["status"] == "ok" and health["ready"] and health["heads"] == 1
        status, spec = http("GET", f"{srv.url}/openapi.json")
        assert status == 200 and "/healthz" in spec["paths"]
        deadline = time.monotonic() + 10
        while True:  # the consumer lag gauge is refreshed every 0.5 s
            status, metrics = http("GET", f"{srv.url}/metrics")
            assert status == 200
            lines = metrics.splitlines()
            if sample(metric_samples(metrics), "unlearn_serving_consumer_lag_total") == 0 \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        s = metric_samples(metrics)
        route = "/v1/heads/{head}/predict"
        n_ok = sample(s, "unlearn_serving_requests_total", route=route, method="POST", status="200")
        assert n_ok == len(seen) + 1
        assert sample(s, "unlearn_serving_head_version", head="h", mode="exact") == 2
        assert sample(s, "unlearn_serving_head_updates_total", result="stale") == 1
        assert sample(s, "unlearn_serving_head_updates_total", result="accepted") == 3
        assert sample(s, "unlearn_serving_consumer_lag_total") == 0
        assert sample(s, "unlearn_serving_consumer_up") == 1
        assert sample(s, "unlearn_serving_request_duration_seconds_bucket", route=route, le="+Inf") == n_ok + 2
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
