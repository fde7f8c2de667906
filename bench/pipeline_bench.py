"""End-to-end pipeline benchmark on the local broker: throughput and delete-to-head latency.

    python -m bench.pipeline_bench [--quick] [--n N] [--dim 768] [--classes 10] [--engine tansu|kafka]
                                   [--encodings json,f64,f32 | --binary] [--ceiling N] [--ceiling-sizes B,..]
                                   [--cpu-dims 128,768,2048] [--cpu-n N] [--load-rate R] [--direct]
                                   [--load-heads K [--spread-heads]] [--floor] [--json PATH]

Starts a local broker (``--engine``: tansu, the embedded one, in memory; or kafka, the project's
Apache Kafka, one KRaft node, with the ``kafka`` client profile), one featurizer and one ledger
worker as real processes (as `make demo` does), then:
1. throughput: N add requests (features passthrough, d x c) produced as fast as possible; the
   time from the first produce to the head covering all N (events/s end to end); once per
   feature encoding of ``--encodings`` (JSON numbers, or ``features_bin`` float64 / float32),
   each on a head of its own, one after the other in the same pipeline (``--binary``: JSON and
   float64 side by side); also when the last delta covering them was produced (the featurizer's
   share of the time);
2. delete-to-head latency: deletes produced one by one at a steady rate (--rate per second); for
   each, the time from its produce call to the arrival of the first head update whose version
   excludes it (the receipt's version, or the first later one published) -- p50/p99; for the
   slowest tenth, each one's hops (featurizer, ledger, delivery) and whether an exact head (a
   ledger reset) was published while it waited;
3. the same for a burst (all deletes produced at once), where queueing dominates.
With ``--load-rate R`` the steady deletes run while adds of new samples flow to the same head at R
per second from another producer (issue 29: deletes while adds flow); each delete's time to its
applied receipt is reported too, and how many of the load's adds were produced meanwhile;
``--load-heads K`` spreads the load over that head and K - 1 others (several heads per partition);
``--spread-heads`` names them so that they land on different by-head partitions; ``--floor`` first
runs the same steady deletes with nothing flowing, in the same pipeline: the path's floor, which
the latency under the load is measured against.
With ``--direct`` every request goes to its head's partition of ``requests.by-head`` (a producer
that routes by head, ``UNLEARN_ROUTE_BY_HEAD``) instead of to ``requests``.
With ``--ceiling N`` the broker's one-hop ceiling (``bench.broker_ceiling``: N messages of each of
``--ceiling-sizes`` produced, acknowledged and read back) is measured first on the same broker;
each throughput run then also prints the records and bytes it wrote per add per topic
(``bench.topic_bytes``), the featurizer process's CPU time per add, and its rate as a fraction of
the broker's bound for those writes. ``--cpu-dims`` adds ``--cpu-n`` ``<f4`` adds per d, each on a
head of its own, for the featurizer's CPU per add at each d.
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
from confluent_kafka import Producer, TopicPartition

from bench import topic_bytes
from bench.app_requests import AddLoad, load_heads, request, target
from unlearn.common.by_head import head_partition
from unlearn.common.families import heads_family
from unlearn.infra.local.engine import ENGINES, describe_engine, local_broker
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.topic_reader import LogRecord, TopicFollower
from unlearn.runtime.topics import create_topics
from unlearn.schemas.delta_codec import decode_delta
from unlearn.schemas.head import decode_head
from unlearn.schemas.receipts import decode_receipt
from unlearn.services.client.sdk import FEATURES_ENCODINGS


class Watcher(threading.Thread):
    """Arrival times of head versions (of ``head``) and of receipts (by event id), and the
    retained count of every head."""

    def __init__(self, s: Settings, head: str) -> None:
        super().__init__(daemon=True)
        self.s, self.head = s, head
        self.version_at: dict[int, float] = {}
        self.n_retained: dict[str, int] = {}
        self.receipt: dict[str, int] = {}
        self.receipt_at: dict[str, float] = {}  # event id -> arrival of its applied receipt
        self.delta_ts: dict[str, float] = {}  # event id -> produce timestamp of the delta covering it
        self.head_ts: dict[int, float] = {}  # version -> produce timestamp of its first update
        self.exact_ts: list[float] = []  # produce timestamps of exact head updates (ledger resets)
        self.ready = threading.Event()
        self.halt = threading.Event()

    def _on_head(self, r: LogRecord) -> None:
        now = time.time()
        h = decode_head(r.value or b"")
        self.n_retained[h.head_id] = max(h.n_retained, self.n_retained.get(h.head_id, 0))
        if h.head_id == self.head:
            self.version_at.setdefault(h.version, now)
            self.head_ts.setdefault(h.version, r.timestamp_ms / 1000.0)
            if h.mode == "exact":
                self.exact_ts.append(r.timestamp_ms / 1000.0)

    def run(self) -> None:
        c = clients.consumer(self.s, f"{self.s.topic_prefix}bench-watch")
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
                    self.receipt_at.setdefault(r.event_id, time.time())
        heads.stop()
        c.close()

    def excluding(self, version: int) -> int | None:
        """The first head version seen that excludes what ``version`` excludes (the receipt's
        version itself, or a later one when that one was not published on its own)."""
        later = [v for v in list(self.version_at) if v >= version]
        return min(later) if later else None

    def wait(self, pred: Any, timeout: float) -> None:
        deadline = time.time() + timeout
        while not pred():
            if time.time() > deadline:
                raise TimeoutError("pipeline did not get there in time (see the worker logs)")
            time.sleep(0.01)


def settings_of(s: Settings, names: tuple[str, ...]) -> dict[str, Any]:
    """The named settings, from ``s`` or from its featurizer / ledger sections."""
    from unlearn.streams.featurizer.settings import FeaturizerSettings
    from unlearn.streams.ledger.settings import LedgerSettings

    out: dict[str, Any] = {}
    for k in names:
        for src in (s, FeaturizerSettings.of(s), LedgerSettings.of(s)):
            if hasattr(src, k):
                out[k] = getattr(src, k)
                break
    return out


def declare(s: Settings, head: str, dim: int, classes: int) -> None:
    """Declare ``head`` with ``classes`` classes, as ``unlearn heads create`` does."""
    from unlearn.common.registry import publish_contract
    from unlearn.services.registry.cli import build_parser, contract_from_args

    args = build_parser().parse_args(["create", "--head", head, "--dim", str(dim), "--classes", str(classes)])
    publish_contract(s, contract_from_args(args, s))


def percentiles(xs: list[float]) -> dict[str, float]:
    a = np.array(xs) * 1000
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max()), "n": len(xs)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    encodings = args.encodings.split(",")
    head = f"bench-{encodings[0]}"  # the latency runs delete from the first encoding's head
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                       "python": platform.python_version(),
                                       "broker": describe_engine(args.engine), "loadavg_start": os.getloadavg()},
                           "config": vars(args).copy()}
    with tempfile.TemporaryDirectory() as tmp, local_broker(args.engine) as broker:
        s = Settings.from_env(bootstrap=broker.bootstrap, topic_prefix="bench.", data_dir=tmp,
                              publish_posterior=args.posterior, profile=args.engine)
        out["config"]["settings"] = settings_of(s, (
            "partitions", "batch_max_events", "batch_max_ms", "checkpoint_every_messages",
            "checkpoint_every_seconds", "reset_every_events", "reset_every_seconds", "publish_posterior"))
        create_topics(s)
        spread = s.partitions if args.spread_heads else 0
        if args.declare:  # what a deployment does (`unlearn heads create`): c columns, not the auto 100
            for h, d in [*((f"bench-{e}", args.dim) for e in encodings),
                         *((h, args.dim) for h in load_heads(head, args.load_heads, spread)[1:]),
                         *((f"bench-cpu{d}", int(d)) for d in args.cpu_dims.split(",") if d)]:
                declare(s, h, d, args.classes)
        if args.ceiling:
            out["ceiling"] = ceiling(s, args)
        procs = [ServiceProcess("featurizer", ["featurizer"], s, tmp).start(),
                 ServiceProcess("ledger", ["ledger"], s, tmp).start()]
        w = Watcher(s, head)
        w.start()
        w.ready.wait(30)
        p = clients.producer(s, **{"linger.ms": 5})
        try:
            X = rng.normal(size=(args.n, args.dim))
            y = rng.integers(0, args.classes, args.n)
            out["throughput"] = {}
            fz = procs[0].proc.pid if procs[0].proc is not None else None
            lz = procs[1].proc.pid if procs[1].proc is not None else None
            for enc in encodings:
                out["throughput"][enc] = throughput(p, s, w, f"bench-{enc}", FEATURES_ENCODINGS[enc], X, y, args,
                                                    featurizer_pid=fz, ledger_pid=lz)
            out["cpu_per_add"] = {}
            for d in [int(x) for x in args.cpu_dims.split(",") if x]:
                Xd = rng.normal(size=(args.cpu_n, d))
                yd = rng.integers(0, args.classes, args.cpu_n)
                out["cpu_per_add"][d] = throughput(p, s, w, f"bench-cpu{d}", "<f4", Xd, yd, args,
                                                   featurizer_pid=fz, count_topics=False)
            if "ceiling" in out:
                summary(out)

            def deletes(ids: list[int], gap: float, load_rate: float = 0.0) -> dict[str, Any]:
                load = AddLoad(s, head, args.dim, args.classes, load_rate, FEATURES_ENCODINGS[encodings[0]],
                               first_id=10 * args.n + 1_000_000,
                               pids={"featurizer": fz, "ledger": procs[1].proc.pid if procs[1].proc else None},
                               direct=args.direct, heads=args.load_heads,
                               spread=args.spread_heads) if load_rate else None
                if load is not None:
                    load.start()
                    time.sleep(2.0)  # the load in a steady state before the first delete
                    load.mark()
                sent: dict[str, float] = {}
                for i in ids:
                    key, val = request(int(i), "delete", head)
                    sent[f"{head}.delete{i}"] = time.time()
                    p.produce(key=key, value=val, **target(s, head, args.direct))
                    p.flush() if gap else p.poll(0)
                    if gap:
                        time.sleep(gap)
                p.flush()
                w.wait(lambda: all(e in w.receipt and w.excluding(w.receipt[e]) is not None for e in sent), 300)
                first = {e: w.excluding(w.receipt[e]) or 0 for e in sent}  # never 0: waited for above
                out = percentiles([w.version_at[first[e]] - t for e, t in sent.items()])
                out["receipt"] = percentiles([w.receipt_at[e] - t for e, t in sent.items()])
                if load is not None:
                    out["load"] = load.stop()
                # where the time goes (broker timestamps = producers' clocks, same host)
                hops = [(w.delta_ts[e] - t, w.head_ts[first[e]] - w.delta_ts[e],
                         w.version_at[first[e]] - w.head_ts[first[e]])
                        for e, t in sent.items() if e in w.delta_ts]
                if hops:
                    med = np.median(np.array(hops), axis=0) * 1000
                    out.update({"hop_featurizer_ms": float(med[0]), "hop_ledger_ms": float(med[1]),
                                "hop_head_delivery_ms": float(med[2])})
                # the slowest tenth, hop by hop, and whether a ledger reset's exact head was published
                # while each waited (the timer's resets, issue 12)
                lat = sorted(((w.version_at[first[e]] - t, e) for e, t in sent.items()), reverse=True)
                slow = []
                for dt, e in lat[:max(1, len(lat) // 10)]:
                    done = w.head_ts.get(first[e], w.version_at[first[e]])
                    hop = ([1000 * (w.delta_ts[e] - sent[e]), 1000 * (done - w.delta_ts[e]),
                            1000 * (w.version_at[first[e]] - done)] if e in w.delta_ts else None)
                    slow.append({"ms": 1000 * dt, "hops_ms": hop, "sent_unix": sent[e],
                                 "reset_while_waiting": any(sent[e] <= x <= done for x in w.exact_ts)})
                out["slowest"] = slow
                return out

            ids = list(rng.permutation(args.n))
            if args.floor and args.load_rate:
                # the same deletes' path with nothing flowing, in the same run: what the load adds to it
                floor = deletes(ids[2 * args.deletes:3 * args.deletes], 1.0 / args.rate)
                out["delete_to_head_floor"] = floor
                print(f"delete->head latency, steady {args.rate}/s, no adds flowing (the path's floor): "
                      f"p50 {floor['p50_ms']:.1f} ms  p99 {floor['p99_ms']:.1f} ms; to the applied receipt: "
                      f"p50 {floor['receipt']['p50_ms']:.1f} ms  p99 {floor['receipt']['p99_ms']:.1f} ms", flush=True)
            steady = deletes(ids[:args.deletes], 1.0 / args.rate, args.load_rate)
            out["delete_to_head_steady"] = steady
            parts = len({head_partition(h, s.partitions) for h in load_heads(head, args.load_heads, spread)})
            over = f" over {args.load_heads} heads ({parts} by-head partitions)" if args.load_heads > 1 else ""
            during = (f" while adds flow at {args.load_rate:g}/s{over} ({steady['load']['adds']} produced at "
                      f"{steady['load']['rate']:.0f}/s)" if args.load_rate else "")
            print(f"delete->head latency, steady {args.rate}/s{during}: "
                  f"p50 {steady['p50_ms']:.1f} ms  p99 {steady['p99_ms']:.1f} ms"
                  f"  max {steady['max_ms']:.1f} ms  (n={steady['n']}); to the applied receipt: "
                  f"p50 {steady['receipt']['p50_ms']:.1f} ms  p99 {steady['receipt']['p99_ms']:.1f} ms")
            if args.load_rate:
                cores = steady["load"]["cores"]
                print("  cores busy meanwhile: " + ", ".join(f"{k} {v:.2f}" for k, v in cores.items()))
            if "hop_featurizer_ms" in steady:
                print(f"  median hops: request->delta (featurizer) {steady['hop_featurizer_ms']:.1f} ms, "
                      f"delta->head (ledger) {steady['hop_ledger_ms']:.1f} ms, "
                      f"head->consumer {steady['hop_head_delivery_ms']:.1f} ms")
            if "slowest" in steady:
                print("  slowest tenth, ms (featurizer/ledger/delivery hops; R: a reset's exact head was "
                      "published meanwhile): " + ", ".join(
                          f"{x['ms']:.0f} ({'/'.join(f'{h:.0f}' for h in x['hops_ms'] or [])}"
                          f"{' R' if x['reset_while_waiting'] else ''})" for x in steady["slowest"]))
            burst = deletes(ids[args.deletes:2 * args.deletes], 0.0)
            out["delete_to_head_burst"] = burst
            print(f"delete->head latency, burst of {args.deletes}: "
                  f"p50 {burst['p50_ms']:.1f} ms  p99 {burst['p99_ms']:.1f} ms")
        finally:
            w.halt.set()
            for proc in procs:
                proc.stop()
    out["machine"]["loadavg_end"] = os.getloadavg()
    if not args.no_backbones:
        from bench import featurizer_bench

        out["backbones"] = featurizer_bench.run(["cpu"], quick=True)
    return out


def throughput(p: Producer, s: Settings, w: Watcher, head: str, dtype: str | None, X: np.ndarray,
               y: np.ndarray, args: argparse.Namespace, featurizer_pid: int | None = None,
               count_topics: bool = True, ledger_pid: int | None = None) -> dict[str, Any]:
    """Adds of every row of ``X`` to a new ``head`` (after one warm-up add that creates it):
    from the first produce to the head covering them all (end to end), and to the last delta
    covering them (the featurizer's part). Messages are built before timing."""
    n = len(X)
    to = target(s, head, args.direct)
    k, v = request(-1, "add", head, X[0], 0, dtype)
    p.produce(key=k, value=v, **to)
    p.flush()
    w.wait(lambda: head in w.n_retained, 120)
    msgs = [request(i, "add", head, X[i], int(y[i]), dtype) for i in range(n)]
    before = topic_bytes.snapshot(s) if count_topics else {}
    pids = {name: pid for name, pid in (("featurizer", featurizer_pid), ("ledger", ledger_pid)) if pid}
    cpu0 = topic_bytes.cpu_now(pids)
    t0 = time.time()
    for key, val in msgs:
        while True:
            try:
                p.produce(key=key, value=val, **to)
                break
            except BufferError:  # local queue full: serve delivery reports, retry
                p.poll(0.05)
        p.poll(0)
    p.flush()
    t_produced = time.time()
    w.wait(lambda: w.n_retained.get(head, 0) >= n + 1, 900)
    t_done = time.time()
    w.wait(lambda: all(f"{head}.add{i}" in w.delta_ts for i in range(n)), 60)
    t_featurized = max(w.delta_ts[f"{head}.add{i}"] for i in range(n))  # broker timestamps: same host clock
    # the whole box's CPU per add over the same span, split: featurizer, ledger, this benchmark, the rest
    spent = topic_bytes.cpu_spent(cpu0, topic_bytes.cpu_now(pids))
    split = {k: spent[k] for k in ("box", *pids, "bench", "rest")}
    # the featurizer's CPU for these adds (it idles at ~2% of a core meanwhile: counted too)
    cpu = split.get("featurizer", float("nan"))
    name = "JSON numbers" if dtype is None else f"features_bin {dtype}"
    size = float(np.mean([len(v) for _, v in msgs]))
    print(f"throughput ({name}, {size:,.0f} B/request): {n} adds at d={X.shape[1]}: "
          f"{n / (t_done - t0):,.0f} events/s end to end ({t_done - t0:.1f} s; produced in {t_produced - t0:.1f} s, "
          f"featurized in {t_featurized - t0:.1f} s: {n / (t_featurized - t0):,.0f} events/s); "
          f"featurizer CPU {1e6 * cpu / n:,.0f} µs/add", flush=True)
    if ledger_pid:
        print("  CPU of the box per add, µs (to the head covering them): " +
              ", ".join(f"{k} {1e6 * v / n:,.0f}" for k, v in split.items()), flush=True)
    res = {"events": n, "dim": X.shape[1], "dtype": dtype, "bytes_per_request": size, "produce_s": t_produced - t0,
           "featurized_s": t_featurized - t0, "featurizer_events_per_s": n / (t_featurized - t0),
           "end_to_end_s": t_done - t0, "events_per_s": n / (t_done - t0), "featurizer_cpu_us_per_add": 1e6 * cpu / n,
           "box_cpu_us_per_add": {k: 1e6 * v / n for k, v in split.items()}}
    if count_topics:
        counts = topic_bytes.written(s, before, topic_bytes.snapshot(s))
        req = counts.get("requests")
        if req is not None and req["estimated"]:  # trimmed meanwhile: what this benchmark produced
            req.update(bytes=sum(len(k) + len(v) for k, v in msgs) * req["records"] / n, estimated=False)
        res["per_add"] = topic_bytes.per_add(counts, n)
        print("  written per add (records, bytes; ~: bytes estimated from the records left after trimming): " +
              "; ".join(f"{t} {v['records']:.3f}, {'~' if v['estimated'] else ''}"
                        f"{'?' if v['bytes'] is None else format(v['bytes'], ',.0f')}"
                        for t, v in res["per_add"].items()), flush=True)
    return res


def ceiling(s: Settings, args: argparse.Namespace) -> dict[str, Any]:
    """The broker's one-hop ceiling (bench.broker_ceiling) on this run's broker, before the services
    start: produce (acknowledged) and consume rates for messages of the pipeline's sizes."""
    from bench.broker_ceiling import consume_rate, produce_rate

    out: dict[str, Any] = {"loadavg": os.getloadavg(), "sizes": {}}
    sizes = [int(x) for x in args.ceiling_sizes.split(",")]
    # the broker was just started: one untimed round first, so that its JIT has compiled the
    # produce and fetch paths (measured: 7,600 produces/s of 4.4 KB cold against 20,000+ warm)
    create_topics(s, extra=["ceiling-warmup"])
    produce_rate(s, s.topic("ceiling-warmup"), args.ceiling, sizes[0], 5)
    consume_rate(s, s.topic("ceiling-warmup"), s.partitions, args.ceiling)
    for size in sizes:
        logical = f"ceiling{size}"
        create_topics(s, extra=[logical])
        prod = produce_rate(s, s.topic(logical), args.ceiling, size, 5)
        cons = consume_rate(s, s.topic(logical), s.partitions, args.ceiling)
        out["sizes"][size] = {"produce_per_s": prod, "consume_per_s": cons,
                              "us_per_produce": 1e6 / prod, "us_per_consume": 1e6 / cons}
        print(f"broker ceiling, {size:,} B messages ({args.ceiling} per run): produce {prod:,.0f}/s (acked), "
              f"consume {cons:,.0f}/s: {1e6 / prod + 1e6 / cons:.1f} µs of the box per produce + consume",
              flush=True)
    return out


# topics read back by a consumer on an add's path (router, featurizer, ledger, the bench's follower)
CONSUMED = frozenset({"requests", "requests.by-head", "deltas"})


def summary(out: dict[str, Any]) -> None:
    """Each encoding's rate as a fraction of the broker's ceiling: (1) of one produce + one consume of
    its request (a hop), (2) of what its records per add cost the broker (per-message cost fitted
    linearly in bytes from the ceiling's sizes; every record produced, those of CONSUMED read once)."""
    sizes = sorted(out["ceiling"]["sizes"].items())
    b = np.array([float(k) for k, _ in sizes])
    fit = {}
    for key in ("us_per_produce", "us_per_consume"):
        v = np.array([r[key] for _, r in sizes])
        fit[key] = np.polyfit(b, v, 1)
    out["ceiling"]["fit_us"] = {k: list(map(float, f)) for k, f in fit.items()}
    for enc, r in out["throughput"].items():
        if "per_add" not in r:
            continue
        us = 0.0
        for t, v in r["per_add"].items():
            if t == "(all)" or not v["records"] or v["bytes"] is None:
                continue
            size = v["bytes"] / v["records"]
            cost = np.polyval(fit["us_per_produce"], size)
            if t in CONSUMED:
                cost += np.polyval(fit["us_per_consume"], size)
            us += v["records"] * max(float(cost), 0.0)
        hop = np.polyval(fit["us_per_produce"], r["bytes_per_request"]) + np.polyval(
            fit["us_per_consume"], r["bytes_per_request"])
        r["bound_adds_per_s"] = 1e6 / us
        r["one_hop_per_s"] = 1e6 / float(hop)
        print(f"{enc}: {r['events_per_s']:,.0f} adds/s end to end = {r['events_per_s'] / r['bound_adds_per_s']:.0%} of "
              f"the broker bound for its writes ({us:.0f} µs of the box per add: {r['bound_adds_per_s']:,.0f} adds/s), "
              f"{r['events_per_s'] / r['one_hop_per_s']:.0%} of one request hop ({r['one_hop_per_s']:,.0f}/s)",
              flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, default=5000, help="add events for the throughput run")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--deletes", type=int, default=100)
    ap.add_argument("--rate", type=float, default=10.0, help="steady delete rate per second")
    ap.add_argument("--direct", action="store_true",
                    help="produce to the by-head topic at the head's partition (a producer that routes by head) "
                         "instead of to requests")
    ap.add_argument("--load-rate", type=float, default=0.0,
                    help="adds per second flowing to the same head while the steady deletes run")
    ap.add_argument("--floor", action="store_true",
                    help="with --load-rate: first the same steady deletes with no adds flowing (the path's floor)")
    ap.add_argument("--load-heads", type=int, default=1,
                    help="spread the --load-rate adds round-robin over the deletes' head and K - 1 others")
    ap.add_argument("--spread-heads", action="store_true",
                    help="name the --load-heads heads so that they land on different by-head partitions")
    ap.add_argument("--posterior", action="store_true", help="publish T with exact heads (4.7 MB at d=768)")
    ap.add_argument("--no-backbones", action="store_true", help="skip the text/image backbone throughput")
    ap.add_argument("--encodings", default="json",
                    help="comma list of feature encodings for the throughput run, each on its own head: json "
                         "(JSON numbers), f64 / f32 (features_bin <f8 / <f4); the deletes use the first")
    ap.add_argument("--binary", action="store_true", help="shorthand for --encodings json,f64 (side by side)")
    ap.add_argument("--engine", choices=ENGINES, default="tansu",
                    help="the local broker: tansu (embedded, memory) or kafka (Apache Kafka, one node; make kafka)")
    ap.add_argument("--ceiling", type=int, default=0,
                    help="first measure the broker's one-hop ceiling with this many messages per size")
    ap.add_argument("--ceiling-sizes", default="4400,6300,15300", help="message sizes for --ceiling, bytes")
    ap.add_argument("--cpu-dims", default="", help="comma list of d: the featurizer's CPU per <f4 add at each")
    ap.add_argument("--cpu-n", type=int, default=1000, help="adds per --cpu-dims run")
    ap.add_argument("--declare", action="store_true",
                    help="declare the heads with --classes classes (`unlearn heads create`) instead of letting "
                         "the first add create them with UNLEARN_DEFAULT_CLASSES (100) columns")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.binary:
        args.encodings = "json,f64"
    unknown = set(args.encodings.split(",")) - set(FEATURES_ENCODINGS)
    if args.load_heads < 1:
        ap.error("--load-heads must be >= 1")
    if unknown:
        ap.error(f"unknown encoding(s) {', '.join(sorted(unknown))}: choose from {', '.join(FEATURES_ENCODINGS)}")
    if args.ceiling and len(set(args.ceiling_sizes.split(","))) < 2:
        ap.error("--ceiling-sizes needs at least two sizes: the broker bound charges each record by a cost fitted "
                 "over the sizes (with one, a 100-byte key record would cost what a 4.4 KB one does)")
    if args.quick:
        args.n, args.deletes = min(args.n, 1000), min(args.deletes, 40)
    print(f"machine: {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}; "
          f"broker: local {describe_engine(args.engine)}; d={args.dim}, labels 0..{args.classes - 1} in "
          f"{f'{args.classes} declared' if args.declare else 'auto-created (UNLEARN_DEFAULT_CLASSES)'} columns, "
          "features passthrough")
    out = run(args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
