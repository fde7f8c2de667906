"""End-to-end pipeline benchmark on the local broker: throughput and delete-to-head latency.

    python -m bench.pipeline_bench [--quick] [--n N] [--dim 768] [--classes 10] [--json PATH]

Starts tansu, one featurizer and one ledger worker as real processes (as `make demo` does), then:
1. throughput: N add requests (features passthrough, d x c) produced as fast as possible; the
   time from the first produce to the head covering all N (events/s end to end);
2. delete-to-head latency: deletes produced one by one at a steady rate (--rate per second); for
   each, the time from its produce call to the arrival of the first head update whose version
   excludes it (the receipt names that version) -- p50/p99;
3. the same for a burst (all deletes produced at once), where queueing dominates.
Then the featurizer's backbone throughput (text, image) from bench.featurizer_bench. Prints the
machine and settings with the numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from unlearn.infra.broker import LocalBroker
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.profiles import consumer_config, producer_config
from unlearn.infra.settings import Settings
from unlearn.infra.topic_family import heads_family
from unlearn.infra.topic_reader import LogRecord, TopicFollower
from unlearn.infra.topics import create_topics
from unlearn.schemas.delta_codec import decode_delta
from unlearn.schemas.head_codec import decode_head
from unlearn.schemas.receipts import decode_receipt


class Watcher(threading.Thread):
    """Arrival times of head versions and of receipts (by event id)."""

    def __init__(self, s: Settings, head: str) -> None:
        super().__init__(daemon=True)
        self.s, self.head = s, head
        self.version_at: dict[int, float] = {}
        self.n_at: list[tuple[float, int]] = []
        self.receipt: dict[str, int] = {}
        self.delta_ts: dict[str, float] = {}  # event id -> produce timestamp of the delta covering it
        self.head_ts: dict[int, float] = {}  # version -> produce timestamp of its first update
        self.ready = threading.Event()
        self.halt = threading.Event()

    def _on_head(self, r: LogRecord) -> None:
        now = time.time()
        h = decode_head(r.value or b"")
        if h.head_id == self.head:
            self.version_at.setdefault(h.version, now)
            self.head_ts.setdefault(h.version, r.timestamp_ms / 1000.0)
            self.n_at.append((now, h.n_retained))

    def run(self) -> None:
        c = Consumer(consumer_config(self.s, f"{self.s.topic_prefix}bench-watch"))
        tps = []
        md = c.list_topics(timeout=30)  # the whole cluster's: naming a topic would auto-create it
        for t in ("receipts", "deltas"):
            name = self.s.topic(t)
            tps += [TopicPartition(name, p, 0) for p in md.topics[name].partitions]
        c.assign(tps)
        heads = TopicFollower(self.s, heads_family(self.s.topic_prefix), self._on_head, role="bench-heads",
                              poll_interval=0.01).start(wait_assigned=30)
        self.ready.set()
        deltas_topic = self.s.topic("deltas")
        while not self.halt.is_set():
            m = c.poll(0.01)
            if m is None or m.error():
                continue
            if m.topic() == deltas_topic:
                ts = m.timestamp()[1] / 1000.0
                for e in decode_delta(m.value()).event_ids:
                    self.delta_ts.setdefault(e, ts)
            else:
                r = decode_receipt(m.value())
                if r.status == "applied" and r.head_version is not None:
                    self.receipt[r.event_id] = r.head_version
        heads.stop()
        c.close()

    def wait(self, pred: Any, timeout: float) -> None:
        deadline = time.time() + timeout
        while not pred():
            if time.time() > deadline:
                raise TimeoutError("pipeline did not get there in time (see the worker logs)")
            time.sleep(0.01)


def request(i: int, op: str, head: str, f: np.ndarray | None = None, y: int = 0) -> tuple[bytes, bytes]:
    subject = f"user{i % 997}"
    body: dict[str, Any] = {"schema": "unlearn.request/v1", "event_id": f"{op}{i}", "op": op, "head_id": head,
                            "client_id": f"c{i % 4}", "subject_id": subject, "sample_id": f"s{i}"}
    if op == "add":
        body["label"] = y
        body["input"] = {"kind": "features", "values": f.tolist()}
    return subject.encode(), orjson.dumps(body)


def percentiles(xs: list[float]) -> dict[str, float]:
    a = np.array(xs) * 1000
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max()), "n": len(xs)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    head = "bench"
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                       "python": platform.python_version(), "broker": "tansu (memory)"},
                           "config": vars(args).copy()}
    with tempfile.TemporaryDirectory() as tmp, LocalBroker() as broker:
        s = Settings.from_env(bootstrap=broker.bootstrap, topic_prefix="bench.", data_dir=tmp,
                              publish_posterior=args.posterior)
        out["config"]["settings"] = {k: getattr(s, k) for k in (
            "partitions", "batch_max_events", "batch_max_ms", "checkpoint_every_messages",
            "checkpoint_every_seconds", "reset_every_events", "reset_every_seconds", "publish_posterior")}
        create_topics(s)
        procs = [ServiceProcess("featurizer", ["featurizer"], s, tmp).start(),
                 ServiceProcess("ledger", ["ledger"], s, tmp).start()]
        w = Watcher(s, head)
        w.start()
        w.ready.wait(30)
        p = Producer(producer_config(s, **{"linger.ms": 5}))
        try:
            # warm-up: the head exists and both workers joined their groups
            k, v = request(-1, "add", head, rng.normal(size=args.dim), 0)
            p.produce(s.topic("requests"), key=k, value=v)
            p.flush()
            w.wait(lambda: bool(w.n_at), 120)
            X = rng.normal(size=(args.n, args.dim))
            y = rng.integers(0, args.classes, args.n)
            msgs = [request(i, "add", head, X[i], int(y[i])) for i in range(args.n)]
            t0 = time.time()
            for key, val in msgs:
                p.produce(s.topic("requests"), key=key, value=val)
                p.poll(0)
            p.flush()
            t_produced = time.time()
            w.wait(lambda: bool(w.n_at) and w.n_at[-1][1] >= args.n + 1, 900)
            t_done = time.time()
            out["throughput"] = {"events": args.n, "produce_s": t_produced - t0, "end_to_end_s": t_done - t0,
                                 "events_per_s": args.n / (t_done - t0)}
            print(f"throughput: {args.n} adds at d={args.dim}, c={args.classes}: "
                  f"{args.n / (t_done - t0):,.0f} events/s end to end "
                  f"({t_done - t0:.1f} s; produced in {t_produced - t0:.1f} s)")

            def deletes(ids: list[int], gap: float) -> dict[str, float]:
                sent: dict[str, float] = {}
                for i in ids:
                    key, val = request(i, "delete", head)
                    sent[f"delete{i}"] = time.time()
                    p.produce(s.topic("requests"), key=key, value=val)
                    p.flush() if gap else p.poll(0)
                    if gap:
                        time.sleep(gap)
                p.flush()
                w.wait(lambda: all(e in w.receipt and w.receipt[e] in w.version_at for e in sent), 300)
                out = percentiles([w.version_at[w.receipt[e]] - t for e, t in sent.items()])
                # where the time goes (broker timestamps = producers' clocks, same host)
                hops = [(w.delta_ts[e] - t, w.head_ts[w.receipt[e]] - w.delta_ts[e],
                         w.version_at[w.receipt[e]] - w.head_ts[w.receipt[e]])
                        for e, t in sent.items() if e in w.delta_ts]
                if hops:
                    med = np.median(np.array(hops), axis=0) * 1000
                    out.update({"hop_featurizer_ms": float(med[0]), "hop_ledger_ms": float(med[1]),
                                "hop_head_delivery_ms": float(med[2])})
                return out

            ids = list(rng.permutation(args.n))
            steady = deletes(ids[:args.deletes], 1.0 / args.rate)
            out["delete_to_head_steady"] = steady
            print(f"delete->head latency, steady {args.rate}/s: "
                  f"p50 {steady['p50_ms']:.1f} ms  p99 {steady['p99_ms']:.1f} ms"
                  f"  max {steady['max_ms']:.1f} ms  (n={steady['n']})")
            if "hop_featurizer_ms" in steady:
                print(f"  median hops: request->delta (featurizer) {steady['hop_featurizer_ms']:.1f} ms, "
                      f"delta->head (ledger) {steady['hop_ledger_ms']:.1f} ms, "
                      f"head->consumer {steady['hop_head_delivery_ms']:.1f} ms")
            burst = deletes(ids[args.deletes:2 * args.deletes], 0.0)
            out["delete_to_head_burst"] = burst
            print(f"delete->head latency, burst of {args.deletes}: "
                  f"p50 {burst['p50_ms']:.1f} ms  p99 {burst['p99_ms']:.1f} ms")
        finally:
            w.halt.set()
            for proc in procs:
                proc.stop()
    if not args.no_backbones:
        from bench import featurizer_bench

        out["backbones"] = featurizer_bench.run(["cpu"], quick=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, default=5000, help="add events for the throughput run")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--deletes", type=int, default=100)
    ap.add_argument("--rate", type=float, default=10.0, help="steady delete rate per second")
    ap.add_argument("--posterior", action="store_true", help="publish T with exact heads (4.7 MB at d=768)")
    ap.add_argument("--no-backbones", action="store_true", help="skip the text/image backbone throughput")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.deletes = min(args.n, 1000), min(args.deletes, 40)
    print(f"machine: {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}; "
          f"broker: local tansu (memory); d={args.dim}, c={args.classes}, features passthrough")
    out = run(args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
