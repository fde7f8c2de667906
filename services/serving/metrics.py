"""The serving app's Prometheus metrics (:class:`Metrics`), one registry per app.

Each app owns a :class:`~prometheus_client.CollectorRegistry` instead of the process-global one,
so several apps in one process (tests, the demo) neither collide on metric names nor mix their
counts. Request and head-update counters are updated as things happen; the gauges that describe
state (served heads, consumer lag, consumer up) are read from the store and the follower at
scrape time by :class:`_StateCollector`, so they can never drift from what is served.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from unlearn.services.serving.predict import HeadStore

__all__ = [
    "HEAD_UPDATE_RESULTS",
    "LATENCY_BUCKETS",
    "Metrics",
    "WatchedFollower",
]


#: Request latency buckets in seconds: 0.5 ms .. 10 s.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Outcomes of a record read from the heads topic (all exported from the start, at 0).
HEAD_UPDATE_RESULTS = ("accepted", "stale", "invalid")


class WatchedFollower(Protocol):
    """What the state gauges read from the heads follower (kept structural: no import cycle)."""

    @property
    def running(self) -> bool: ...

    def lag(self) -> dict[int | str, int]: ...


class Metrics:
    """The serving app's metrics on its own registry; ``render()`` is the ``/metrics`` body."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("unlearn_serving_requests_total", "HTTP requests by route, method and status.",
                                ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("unlearn_serving_request_duration_seconds", "HTTP request latency.",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.head_updates = Counter("unlearn_serving_head_updates_total",
                                    "Head updates read from the heads topic, by outcome.", ["result"],
                                    registry=self.registry)
        for result in HEAD_UPDATE_RESULTS:
            self.head_updates.labels(result=result)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one request; ``route`` is the route template, so head ids don't blow up cardinality."""
        self.requests.labels(route=route, method=method, status=str(status)).inc()
        self.latency.labels(route=route).observe(seconds)

    def head_update(self, result: str) -> None:
        """Count one record of the heads topic by outcome (accepted / stale / invalid)."""
        self.head_updates.labels(result=result).inc()

    def watch(self, store: HeadStore, follower: WatchedFollower | None) -> None:
        """Export the state gauges of ``store`` and ``follower`` (read at every scrape)."""
        self.registry.register(_StateCollector(store, follower))

    def render(self) -> bytes:
        """The exposition of this registry, in the format ``content_type`` names."""
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Gauges computed from the store and the follower when scraped (no copies to keep in sync)."""

    def __init__(self, store: HeadStore, follower: WatchedFollower | None) -> None:
        self.store = store
        self.follower = follower

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        lag = self.follower.lag() if self.follower is not None else {}
        g = GaugeMetricFamily("unlearn_serving_consumer_lag",
                              "Messages of the heads topic not yet read, per partition.", labels=["partition"])
        for p, n in sorted(lag.items()):
            g.add_metric([str(p)], n)
        yield g
        yield GaugeMetricFamily("unlearn_serving_consumer_lag_total", "Messages of the heads topic not yet read.",
                                value=sum(lag.values()))
        up = 1 if (self.follower is not None and self.follower.running) else 0
        yield GaugeMetricFamily("unlearn_serving_consumer_up", "1 while the heads consumer thread runs.", value=up)

        heads = sorted(self.store.all().items())
        yield GaugeMetricFamily("unlearn_serving_heads", "Heads being served.", value=len(heads))
        version = GaugeMetricFamily("unlearn_serving_head_version", "Version of the served head.",
                                    labels=["head", "mode"])
        retained = GaugeMetricFamily("unlearn_serving_head_n_retained", "Retained samples behind the served head.",
                                     labels=["head"])
        age = GaugeMetricFamily("unlearn_serving_head_age_seconds", "Seconds since the served head was published.",
                                labels=["head"])
        for hid, sh in heads:
            version.add_metric([hid, sh.update.mode], sh.update.version)
            retained.add_metric([hid], sh.update.n_retained)
            age.add_metric([hid], max(0.0, now - sh.update.created_ts))
        yield version
        yield retained
        yield age
