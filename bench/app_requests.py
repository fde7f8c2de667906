"""Requests as an upstream app makes them, for the benchmarks: one request (:func:`request`, no
SDK), where it goes (:func:`target`: ``requests``, or the head's by-head partition) and a steady
flow of adds (:class:`AddLoad`) while something else is measured (``bench.pipeline_bench
--load-rate``)."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import numpy as np
import orjson

from bench import topic_bytes
from unlearn.common.by_head import head_partition, routed_topic_name
from unlearn.infra.settings import Settings
from unlearn.runtime import clients


def request(i: int, op: str, head: str, f: np.ndarray | None = None, y: int = 0,
            dtype: str | None = None) -> tuple[bytes, bytes]:
    """(key, value) of one request, built as an upstream app in any language would (no SDK);
    an add's features as JSON numbers, or as ``features_bin`` of ``dtype``."""
    subject = f"user{i % 997}"
    body: dict[str, Any] = {"schema": "unlearn.request/v1", "event_id": f"{head}.{op}{i}", "op": op, "head_id": head,
                            "client_id": f"c{i % 4}", "subject_id": subject, "sample_id": f"s{i}"}
    if op == "add":
        assert f is not None
        body["label"] = y
        if dtype is None:
            body["input"] = {"kind": "features", "values": f.tolist()}
        else:
            data = base64.b64encode(f.astype(dtype).tobytes()).decode("ascii")
            body["input"] = {"kind": "features_bin", "dtype": dtype, "data": data}
    return subject.encode(), orjson.dumps(body)


def target(s: Settings, head: str, direct: bool) -> dict[str, Any]:
    """Where a producer sends ``head``'s requests: ``requests`` (the featurizer routes them), or
    with ``direct`` its by-head partition (a producer that routes by head itself, docs/client.md)."""
    if not direct:
        return {"topic": s.topic("requests")}
    return {"topic": routed_topic_name(s.topic("requests")), "partition": head_partition(head, s.partitions)}



def load_heads(head: str, n: int, spread: int = 0) -> list[str]:
    """``head`` and ``n - 1`` other heads a load spreads its adds over (several heads per partition
    and across partitions, as a deployment has them). With ``spread`` (a partition count) the
    names are chosen so that the heads land on as many different by-head partitions as they can."""
    heads = [head]
    j = 1
    while len(heads) < n:
        name = f"{head}.load{j}"
        used = {head_partition(h, spread) for h in heads} if spread else set()
        if not spread or len(used) >= spread or head_partition(name, spread) not in used:
            heads.append(name)
        j += 1
    return heads


class AddLoad(threading.Thread):
    """Adds of new samples to ``head`` at ``rate`` per second from a producer of its own, paced in
    10 ms steps, until :meth:`stop` (which returns how many were produced, and at what rate). With
    ``heads`` > 1 the adds go round-robin to ``head`` and ``heads - 1`` others (``load_heads``;
    ``spread``: on different by-head partitions)."""

    def __init__(self, s: Settings, head: str, dim: int, classes: int, rate: float, dtype: str | None,
                 first_id: int, pids: dict[str, int | None], direct: bool = False, heads: int = 1,
                 spread: bool = False) -> None:
        super().__init__(daemon=True)
        self.heads = load_heads(head, heads, s.partitions if spread else 0)
        self.to = [target(s, h, direct) for h in self.heads]
        self.pids = {k: v for k, v in pids.items() if v}
        self.cpu0: dict[str, float] = {}
        self.s, self.head, self.dim, self.classes, self.rate = s, head, dim, classes, rate
        self.dtype, self.first_id = dtype, first_id
        self.halt = threading.Event()
        self.produced = 0
        self.t_mark = 0.0
        self.elapsed = 0.0

    def run(self) -> None:
        rng = np.random.default_rng(1)
        pool = rng.normal(size=(512, self.dim))
        p = clients.producer(self.s, **{"linger.ms": 5})
        t0 = time.monotonic()
        while not self.halt.is_set():
            due = int((time.monotonic() - t0) * self.rate) - self.produced
            for _ in range(max(0, due)):
                i = self.first_id + self.produced
                h = self.produced % len(self.heads)
                key, val = request(i, "add", self.heads[h], pool[i % len(pool)], int(i % self.classes), self.dtype)
                p.produce(key=key, value=val, **self.to[h])
                self.produced += 1
            p.poll(0)
            time.sleep(0.01)
        self.elapsed = time.monotonic() - t0
        p.flush(30)

    def mark(self) -> None:
        """Start of the measured window (the load is steady): CPU counters now."""
        self.cpu0, self.t_mark = topic_bytes.cpu_now(self.pids), time.monotonic()

    def stop(self) -> dict[str, Any]:
        """Stop producing; the adds produced, their rate, and each process's share of the box's
        CPU (in cores) since :meth:`mark`: the featurizer, the ledger, this benchmark, and the
        rest of the box (the broker, mostly)."""
        cpu1, dt = topic_bytes.cpu_now(self.pids), time.monotonic() - self.t_mark
        self.halt.set()
        self.join(60)
        cores = {k: v / dt for k, v in topic_bytes.cpu_spent(self.cpu0, cpu1).items()}
        return {"adds": self.produced, "rate": self.produced / self.elapsed if self.elapsed else 0.0,
                "cores": cores}
