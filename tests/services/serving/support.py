"""Helpers shared by the serving tests: head updates, the featurizer's q as a reference, an HTTP
client, a publisher of head updates and a wait for a served version."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from unlearn.features.contract import quantize_feature_row
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.ledger import Quantizer
from unlearn.schemas.head import HeadUpdate, encode_head

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
    return HeadUpdate(head, version, mode, digest, 10 * version, 10 * version, ((0, version),), 0.0, 1.0,  # type: ignore[arg-type]
                      time.time(), W, T)


def dequantized(settings: Settings, rows: list[list[float]]) -> np.ndarray:
    """What the featurizer's q is, back on the real scale (the test's own reference)."""
    heads = HeadSettings.of(settings)
    Q = np.stack([quantize_feature_row(np.asarray(r), heads.frac_bits, heads.feature_bound, heads.normalize_features)
                  for r in rows])
    return Quantizer(heads.frac_bits, heads.feature_bound).dequantize(Q)


def http(method: str, url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status, ctype = resp.read(), resp.status, resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raw, status, ctype = exc.read(), exc.code, exc.headers.get("Content-Type", "")
    return status, (json.loads(raw) if "json" in ctype else raw.decode())


def metric_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels) -> value of a Prometheus exposition (parsed, so label order is free)."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def sample(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


class Publisher:
    """Publishes head updates (as the ledger processor does) and waits for the broker's ack."""

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import Producer

        from unlearn.common.families import heads_family
        from unlearn.runtime.clients import producer_config
        from unlearn.runtime.topics import ensure_topic

        self.settings = settings
        self.producer = Producer(producer_config(settings, **{"linger.ms": 0}))
        self.topic = heads_family(settings.topic_prefix).topic(0, 0)  # as the ledger of deltas partition 0
        ensure_topic(settings, self.topic)

    def __call__(self, *updates: HeadUpdate) -> None:
        for u in updates:
            self.producer.produce(self.topic, key=u.head_id.encode(), value=encode_head(u))
        assert self.producer.flush(30) == 0

    def raw(self, key: bytes, value: bytes | None) -> None:
        """A record that is not a head update (garbage, a tombstone)."""
        self.producer.produce(self.topic, key=key, value=value)
        assert self.producer.flush(30) == 0


def wait_version(url: str, head: str, version: int, mode: str | None = None, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        status, last = http("GET", f"{url}/v1/heads/{head}")
        if status == 200 and last["version"] >= version and (mode is None or last["mode"] == mode):
            return last
        time.sleep(0.05)
    raise AssertionError(f"serving never showed {head} version {version} {mode or ''}: {last}")
