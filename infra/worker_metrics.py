"""Prometheus metrics of the stream workers (``unlearn featurizer``, ``unlearn ledger``), one
module for both stages so they name and expose the same things the same way (docs/operations.md).

Each worker owns a :class:`WorkerMetrics` on its own :class:`~prometheus_client.CollectorRegistry`
(several workers in one process, as in tests and the demo, keep their own counts). What it holds:

- ``unlearn_<stage>_consumer_lag{topic,partition}``: records not yet consumed, from librdkafka's
  own statistics (``stats_cb``, every ``STATS_INTERVAL_MS``) on the poll thread: no extra broker
  round trip and no second client. Only while /metrics is served (the statistics cost a JSON
  parse per interval).
- ``unlearn_<stage>_events_total{outcome}`` and other ``_total`` counters read at scrape time from
  the worker's own counters dict, so there is one count, not a copy to keep in step.
- ``unlearn_<stage>_batch_duration_seconds``: a histogram of one poll's work.
- ``unlearn_<stage>_checkpoint_age_seconds{topic,partition}``: how long processed work has waited
  to be made durable (seconds since the last checkpoint while some waits; 0 when none does), read
  at scrape time from a callback the stage gives.
- stage-specific histograms made with :meth:`WorkerMetrics.histogram`.

``serve(port)`` exposes the registry on ``/metrics`` (prometheus_client's WSGI server on a daemon
thread); without it the metrics are kept and nothing listens.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = ["BATCH_BUCKETS", "LAG_BUCKETS", "STATS_INTERVAL_MS", "WorkerMetrics"]

log = logging.getLogger("unlearn.metrics")

#: librdkafka statistics period while /metrics is served: the freshness of the lag gauges.
STATS_INTERVAL_MS = 2000
#: One poll's work: 1 ms .. 60 s.
BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: End-to-end lags (a delete until its head is published): 10 ms .. 10 min.
LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class WorkerMetrics:
    """A stream worker's metrics (module docstring); ``stage`` is ``featurizer`` or ``ledger``."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.registry = CollectorRegistry()
        self.batch_duration = self.histogram("batch_duration_seconds", "Seconds one poll's batch took to process.",
                                             BATCH_BUCKETS)
        self._lag: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._served = False
        self._server: Any = None
        self.port: int | None = None
        self._collector = _Counters(stage, self)
        self.registry.register(self._collector)

    def histogram(self, name: str, documentation: str, buckets: tuple[float, ...] = LAG_BUCKETS) -> Histogram:
        """A histogram ``unlearn_<stage>_<name>`` on this registry (``name`` carries the unit)."""
        return Histogram(f"unlearn_{self.stage}_{name}", documentation, buckets=buckets, registry=self.registry)

    def count(self, counters: Mapping[str, int], outcomes: Mapping[str, str],
              names: Mapping[str, str] | None = None) -> None:
        """Export ``counters`` (the worker's own dict, read at scrape time): a key of ``outcomes``
        as ``unlearn_<stage>_events_total{outcome=<its value>}``, any other as
        ``unlearn_<stage>_<name>_total`` (``names[key]``, else the key itself)."""
        names = dict(names or {})
        clash = [k for k in counters if names.get(k, k) == "events" and k not in outcomes]
        if clash:
            raise ValueError(f"counter(s) {clash} would be named like the events family: rename them")
        self._collector.counters, self._collector.outcomes, self._collector.names = counters, outcomes, names

    def checkpoint_ages(self, ages: Callable[[], Mapping[tuple[str, int], float]]) -> None:
        """Export ``ages()`` ((topic, partition) -> seconds since its last checkpoint) at every scrape."""
        self._collector.ages = ages

    def timed(self) -> _Timer:
        """``with metrics.timed():`` observes the block's duration in ``batch_duration_seconds``."""
        return _Timer(self.batch_duration)

    # ------------------------------------------------------------------ consumer lag
    def consumer_settings(self) -> dict[str, Any]:
        """librdkafka settings that feed the lag gauges: empty unless /metrics is served."""
        if not self._served:
            return {}
        return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self.on_statistics}

    def on_statistics(self, raw: str) -> None:
        """librdkafka's statistics JSON: the lag of every partition this consumer fetches."""
        try:
            stats = json.loads(raw)
            lag = {}
            for topic, t in stats.get("topics", {}).items():
                for p, ps in t.get("partitions", {}).items():
                    n = ps.get("consumer_lag", -1)
                    # -1: partition "-1" (librdkafka's own), unassigned, or no position yet
                    if int(p) >= 0 and n >= 0 and ps.get("fetch_state") not in ("none", "stopped"):
                        lag[(topic, int(p))] = int(n)
        except (ValueError, TypeError, AttributeError) as exc:
            log.debug("unreadable librdkafka statistics: %s", exc)
            return
        with self._lock:
            self._lag = lag

    def lag(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> records not yet consumed, as of the last statistics."""
        with self._lock:
            return dict(self._lag)

    # ------------------------------------------------------------------ serving /metrics
    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on host:port (0: a free one) from now on; returns the bound port.
        Call before the consumer is made, so its statistics feed the lag gauges."""
        server, _thread = start_http_server(port, host, registry=self.registry)
        self._server, self._served = server, True
        self.port = int(server.server_address[1])
        log.info("unlearn %s metrics url=http://%s:%d/metrics", self.stage, host, self.port)
        return self.port

    def close(self) -> None:
        """Stop serving /metrics (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Timer:
    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self.t0 = 0.0

    def __enter__(self) -> _Timer:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.histogram.observe(time.perf_counter() - self.t0)


class _Counters(Collector):
    """The scrape-time families: counters from the worker's dict, lag and checkpoint-age gauges."""

    def __init__(self, stage: str, metrics: WorkerMetrics) -> None:
        self.stage = stage
        self.metrics = metrics
        self.counters: Mapping[str, int] = {}
        self.outcomes: Mapping[str, str] = {}
        self.names: Mapping[str, str] = {}
        self.ages: Callable[[], Mapping[tuple[str, int], float]] = dict

    def collect(self) -> Iterator[Metric]:
        p = f"unlearn_{self.stage}"
        counters = dict(self.counters)  # one consistent copy (the worker thread writes it)
        events = CounterMetricFamily(f"{p}_events", "Events by outcome.", labels=["outcome"])
        for key, outcome in self.outcomes.items():
            events.add_metric([outcome], counters.get(key, 0))
        yield events
        for key, value in sorted(counters.items()):
            if key not in self.outcomes:
                name = self.names.get(key, key)
                yield CounterMetricFamily(f"{p}_{name}", f"{name} since the process started.", value=value)
        lag = GaugeMetricFamily(f"{p}_consumer_lag", "Records not yet consumed, per topic partition "
                                "(librdkafka statistics).", labels=["topic", "partition"])
        for (topic, part), n in sorted(self.metrics.lag().items()):
            lag.add_metric([topic, str(part)], n)
        yield lag
        age = GaugeMetricFamily(f"{p}_checkpoint_age_seconds", "Seconds since the partition's last checkpoint "
                                "while processed work waits for the next (0: none waits).",
                                labels=["topic", "partition"])
        try:
            ages = dict(self.ages())
        except RuntimeError:  # changed size during a rebalance: the next scrape reads it
            ages = {}
        for (topic, part), seconds in sorted(ages.items()):
            age.add_metric([topic, str(part)], max(0.0, seconds))
        yield age
