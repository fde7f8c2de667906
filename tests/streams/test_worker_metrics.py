"""Prometheus /metrics of the stream workers (infra/worker_metrics.py): the parts on their own
(librdkafka statistics -> lag per partition, the worker's counters as ``_total`` counters,
checkpoint ages, batch latency), then a running ``unlearn featurizer`` and ``unlearn ledger``
scraped over HTTP after adds and a delete sent with the SDK. Last, docs/operations.md, its alert
rules and the sample Grafana dashboard name only metrics that the processes export (the
featurizer's, the ledger's and serving's), so a renamed metric cannot leave a dashboard or an alert
silently empty."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.services.serving.support import metric_samples, sample
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.infra.worker_metrics import WorkerMetrics
from unlearn.services.serving.metrics import Metrics
from unlearn.services.serving.predict import HeadStore

D = 4


def test_statistics_counters_and_ages_become_metrics() -> None:
    m = WorkerMetrics("ledger")
    assert m.consumer_settings() == {}  # nothing listens: librdkafka keeps its statistics off
    stats = {"topics": {"deltas": {"partitions": {
        "0": {"consumer_lag": 5, "fetch_state": "active"},
        "1": {"consumer_lag": -1, "fetch_state": "active"},  # no position yet: no gauge
        "2": {"consumer_lag": 9, "fetch_state": "none"},  # not fetched (unassigned)
        "-1": {"consumer_lag": 3, "fetch_state": "none"}}}}}  # librdkafka's internal partition
    m.on_statistics(json.dumps(stats))
    m.on_statistics("not json")  # ignored: the last good statistics stay
    counters = {"applied": 3, "skipped": 1, "deadletters": 2}
    m.count(counters, {"applied": "applied", "skipped": "skipped_redelivered"})
    m.checkpoint_ages(lambda: {("deltas", 0): 1.5})
    with m.timed():
        pass
    got = metric_samples(generate_latest(m.registry).decode())
    lags = {k: v for k, v in got.items() if k[0] == "unlearn_ledger_consumer_lag"}
    assert lags == {("unlearn_ledger_consumer_lag", frozenset({("topic", "deltas"), ("partition", "0")})): 5}
    assert sample(got, "unlearn_ledger_events_total", outcome="applied") == 3
    assert sample(got, "unlearn_ledger_events_total", outcome="skipped_redelivered") == 1
    assert sample(got, "unlearn_ledger_deadletters_total") == 2
    assert sample(got, "unlearn_ledger_checkpoint_age_seconds", topic="deltas", partition="0") == 1.5
    assert sample(got, "unlearn_ledger_batch_duration_seconds_count") == 1
    counters["applied"] += 4  # read at scrape time: no copy to keep in step
    got = metric_samples(generate_latest(m.registry).decode())
    assert sample(got, "unlearn_ledger_events_total", outcome="applied") == 7


def test_a_counter_named_like_the_events_family_is_renamed_or_refused() -> None:
    m = WorkerMetrics("featurizer")
    with pytest.raises(ValueError, match="events"):
        m.count({"events": 1, "accepted": 1}, {"accepted": "accepted"})
    m.count({"events": 2, "accepted": 1}, {"accepted": "accepted"}, {"events": "events_judged"})
    families = [f.name for f in m.registry.collect()]
    assert len(families) == len(set(families)) and "unlearn_featurizer_events_judged" in families


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        return metric_samples(resp.read().decode())


def _names(got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in got.items() if n == name}


@pytest.mark.broker
def test_running_featurizer_and_ledger_serve_metrics(settings: Settings, tmp_path: Path) -> None:
    from unlearn.services.client.sdk import UnlearnClient

    s = settings.with_(data_dir=str(tmp_path / "data"), checkpoint_every_seconds=1.0, reset_every_seconds=1.0,
                       batch_max_ms=20)
    fport, lport = _free_port(), _free_port()
    feat = ServiceProcess("featurizer", ["featurizer", "--metrics-port", str(fport)], s, tmp_path).start()
    led = ServiceProcess("ledger", ["ledger", "--worker-id", "w0", "--metrics-port", str(lport)], s, tmp_path).start()
    try:
        F = np.random.default_rng(3).normal(size=(6, D))
        with UnlearnClient(s, client_id="metrics-test") as client:
            for i in range(6):
                client.add("mh", f"u{i}", f"x{i}", i % 2, features=F[i])
            receipt = client.delete("mh", "x0", "u0").wait_receipt(120)
        assert receipt.status == "applied"
        deadline = time.monotonic() + 60
        while True:
            f, g = _scrape(fport), _scrape(lport)
            if (sample(g, "unlearn_ledger_delete_to_head_published_seconds_count") == 1
                    and _names(f, "unlearn_featurizer_consumer_lag") and _names(g, "unlearn_ledger_consumer_lag")
                    and _names(g, "unlearn_ledger_checkpoint_age_seconds")
                    and sample(g, "unlearn_ledger_checkpoint_duration_seconds_count")):
                break
            assert time.monotonic() < deadline, (f, g, feat.log_tail(), led.log_tail())
            time.sleep(0.5)
        # the featurizer: 7 requests accepted, none dead-lettered, in timed batches, its offsets committed
        assert sample(f, "unlearn_featurizer_events_total", outcome="accepted") == 7
        assert sample(f, "unlearn_featurizer_events_total", outcome="dead_lettered") == 0
        timed_batches = sample(f, "unlearn_featurizer_batch_duration_seconds_count")  # a count, not a time
        assert timed_batches not in (None, 0)
        flag = _names(f, "unlearn_featurizer_consumer_lag")
        assert s.topic("requests") in {dict(k)["topic"] for k in flag} and all(v >= 0 for v in flag.values())
        assert _names(f, "unlearn_featurizer_checkpoint_age_seconds")
        # the ledger: the delete applied once, its lag to the published head measured, lag per deltas partition
        assert sample(g, "unlearn_ledger_deletes_applied_total") == 1
        assert (sample(g, "unlearn_ledger_events_total", outcome="applied") or 0) >= 1  # deltas messages
        assert (sample(g, "unlearn_ledger_head_updates_total") or 0) >= 1
        assert 0 < (sample(g, "unlearn_ledger_delete_to_head_published_seconds_sum") or 0) < 60
        # each checkpoint timed twice: its pause is a part of its duration
        assert sample(g, "unlearn_ledger_checkpoint_pause_seconds_count") == sample(
            g, "unlearn_ledger_checkpoint_duration_seconds_count")
        assert (sample(g, "unlearn_ledger_checkpoint_pause_seconds_sum") or 0) <= (
            sample(g, "unlearn_ledger_checkpoint_duration_seconds_sum") or 0)
        lag = _names(g, "unlearn_ledger_consumer_lag")
        assert {dict(k)["topic"] for k in lag} == {s.topic("deltas")} and all(v >= 0 for v in lag.values())
    finally:
        feat.stop()
        led.stop()
    assert feat.proc.returncode == 0, feat.log_tail()
    assert led.proc.returncode == 0, led.log_tail()


# ------------------------------------------------------------------ the operations doc
ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


def _exported(registry: CollectorRegistry) -> set[str]:
    return {fam.name + suffix for fam in registry.collect() for suffix in SUFFIXES}


def test_every_metric_the_operations_doc_and_dashboard_name_is_exported() -> None:
    from unlearn.streams.featurizer.service import FeaturizerService
    from unlearn.streams.ledger.worker import LedgerWorker

    s = Settings.from_env(bootstrap="127.0.0.1:1", topic_prefix="t.ops.")  # nothing connects
    serving = Metrics()
    serving.watch(HeadStore(), None)
    ledger = LedgerWorker(s, "w0")
    try:
        exported = (_exported(FeaturizerService(s).metrics.registry) | _exported(ledger.metrics.registry)
                    | _exported(serving.registry))
    finally:
        ledger.consumer.close()
    doc = (ROOT / "docs" / "operations.md").read_text()
    dashboard = json.loads((ROOT / "docs" / "grafana" / "unlearn-stream.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    named = {m for m in re.findall(r"unlearn_[a-z0-9_]+", doc + " " + exprs) if not m.endswith("_")}
    assert named and named <= exported, sorted(named - exported)
    for family in ("consumer_lag", "events_total", "batch_duration_seconds_bucket", "checkpoint_age_seconds"):
        assert {f"unlearn_featurizer_{family}", f"unlearn_ledger_{family}"} <= exported
    assert "unlearn_ledger_delete_to_head_published_seconds_bucket" in named  # the dashboard shows it
