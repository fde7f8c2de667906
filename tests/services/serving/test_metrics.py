"""Prometheus metrics: one registry per app (several apps in one process don't collide), counters
by route template, state gauges read from the store at scrape time."""

from __future__ import annotations

import prometheus_client

from tests.services.serving.support import http, make_head, metric_samples, sample
from unlearn.infra.settings import Settings
from unlearn.services.serving.http import ServingServer
from unlearn.services.serving.metrics import HEAD_UPDATE_RESULTS, Metrics
from unlearn.services.serving.predict import HeadStore

PREDICT = "/v1/heads/{head}/predict"


def test_metrics_unit_state_gauges_follow_the_store() -> None:
    store = HeadStore()
    m = Metrics()
    m.watch(store, None)
    s = metric_samples(m.render().decode())
    assert sample(s, "unlearn_serving_heads") == 0 and sample(s, "unlearn_serving_consumer_up") == 0
    assert sample(s, "unlearn_serving_consumer_lag_total") == 0
    for result in HEAD_UPDATE_RESULTS:  # exported at 0 from the start
        assert sample(s, "unlearn_serving_head_updates_total", result=result) == 0
    store.offer(make_head(3, "fast", 1))
    store.offer(make_head(1, "exact", 2, head="g"))
    m.head_update("accepted")
    m.observe(PREDICT, "POST", 200, 0.003)
    m.observe(PREDICT, "POST", 200, 20.0)
    s = metric_samples(m.render().decode())
    assert sample(s, "unlearn_serving_heads") == 2
    assert sample(s, "unlearn_serving_head_version", head="h", mode="fast") == 3
    assert sample(s, "unlearn_serving_head_version", head="g", mode="exact") == 1
    assert sample(s, "unlearn_serving_head_n_retained", head="h") == 30
    assert sample(s, "unlearn_serving_head_age_seconds", head="h") >= 0
    assert sample(s, "unlearn_serving_head_updates_total", result="accepted") == 1
    assert sample(s, "unlearn_serving_requests_total", route=PREDICT, method="POST", status="200") == 2
    assert sample(s, "unlearn_serving_request_duration_seconds_bucket", route=PREDICT, le="0.005") == 1
    assert sample(s, "unlearn_serving_request_duration_seconds_bucket", route=PREDICT, le="10.0") == 1
    assert sample(s, "unlearn_serving_request_duration_seconds_bucket", route=PREDICT, le="+Inf") == 2
    assert sample(s, "unlearn_serving_request_duration_seconds_count", route=PREDICT) == 2


def test_two_apps_in_one_process_keep_their_own_metrics() -> None:
    before = {m.name for m in prometheus_client.REGISTRY.collect()}
    sa, sb = HeadStore(), HeadStore()
    sa.offer(make_head(1))
    with ServingServer(Settings(), follow=False, store=sa) as a, ServingServer(Settings(), follow=False, store=sb) as b:
        for _ in range(3):
            assert http("GET", f"{a.url}/v1/heads/h")[0] == 200
        assert http("GET", f"{b.url}/v1/heads/h")[0] == 404
        status, text = http("GET", f"{a.url}/metrics")
        assert status == 200 and "# TYPE unlearn_serving_request_duration_seconds histogram" in text.splitlines()
        sa_ = metric_samples(text)
        sb_ = metric_samples(http("GET", f"{b.url}/metrics")[1])
    route = "/v1/heads/{head}"
    assert sample(sa_, "unlearn_serving_requests_total", route=route, method="GET", status="200") == 3
    assert sample(sa_, "unlearn_serving_requests_total", route=route, method="GET", status="404") is None
    assert sample(sb_, "unlearn_serving_requests_total", route=route, method="GET", status="404") == 1
    assert sample(sb_, "unlearn_serving_requests_total", route=route, method="GET", status="200") is None
    assert sample(sa_, "unlearn_serving_heads") == 1 and sample(sb_, "unlearn_serving_heads") == 0
    # the process-global registry is left alone
    assert {m.name for m in prometheus_client.REGISTRY.collect()} == before
    assert not any(n.startswith("unlearn_serving") for n in before)


def test_metrics_endpoint_content_type() -> None:
    import urllib.request

    with ServingServer(Settings(), follow=False) as srv, urllib.request.urlopen(f"{srv.url}/metrics") as resp:
        assert resp.headers["Content-Type"] == prometheus_client.CONTENT_TYPE_LATEST
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
