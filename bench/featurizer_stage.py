"""The featurizer stage alone, on the local broker: events/s and where its time goes.

    python -m bench.featurizer_stage [--n 5000] [--dim 768] [--encodings json,f64,f32]
                                     [--heads 1] [--profile 25] [--json PATH]

Pre-produces ``--n`` add requests per encoding (each encoding on heads of its own), then runs one
``FeaturizerService`` in this process (router + featurizer, real sqlite cache and changelog, real
broker acknowledgements; no ledger worker) from the first poll until every request was judged.
That isolates the featurizer's cost per event from the producer and the ledger, which
``bench.pipeline_bench`` measures together. With ``--profile K`` the run is under cProfile and
the K functions with the most cumulative and own time are printed (py-spy is not available
here). Asserts nothing; prints the machine, the settings and the numbers.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from confluent_kafka import Producer

from bench.pipeline_bench import request
from unlearn.infra.broker import LocalBroker
from unlearn.infra.settings import Settings, producer_config
from unlearn.infra.topics import create_topics
from unlearn.services.client.sdk import FEATURES_ENCODINGS
from unlearn.streams.featurizer.batch import BatchProcessor
from unlearn.streams.featurizer.service import FeaturizerService


def produce_all(s: Settings, msgs: list[tuple[bytes, bytes]]) -> None:
    """Produce and flush every (key, value) to the requests topic."""
    p = Producer(producer_config(s, **{"linger.ms": 5}))
    for key, val in msgs:
        while True:
            try:
                p.produce(s.topic("requests"), key=key, value=val)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    if p.flush(60):
        raise RuntimeError("requests not acknowledged")


def run_stage(s: Settings, n_events: int, profile: cProfile.Profile | None, timeout: float = 900.0) -> dict[str, Any]:
    """Run one featurizer until it judged ``n_events`` (already in the requests topic); its
    events/s from the first batch on (the group join is not counted) and its stats."""
    svc = FeaturizerService(s)
    stop = threading.Event()
    t_first: list[float] = []
    original = BatchProcessor.process

    def timed(batches: BatchProcessor, batch: list[Any]) -> None:
        if not t_first:
            t_first.append(time.perf_counter())
            if profile is not None:
                profile.enable()
        original(batches, batch)
        if svc.stats["events"] >= n_events:
            if profile is not None:
                profile.disable()
            t_first.append(time.perf_counter())
            stop.set()

    cpu0 = time.process_time()
    done = threading.Timer(timeout, stop.set)
    done.start()
    try:
        with mock.patch.object(BatchProcessor, "process", timed):
            svc.run(stop)
    finally:
        done.cancel()
    if len(t_first) < 2:
        raise TimeoutError(f"featurizer judged {svc.stats['events']} of {n_events} events in {timeout:g}s")
    wall = t_first[1] - t_first[0]
    return {"events": n_events, "wall_s": wall, "events_per_s": n_events / wall,
            "process_cpu_s": time.process_time() - cpu0, "stats": dict(svc.stats)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000, help="add requests per encoding")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--encodings", default="json,f64,f32", help="comma list of json, f64, f32")
    ap.add_argument("--profile", type=int, default=0, help="print the top K functions of a cProfile run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.n, args.dim))
    y = rng.integers(0, args.classes, args.n)
    print(f"machine: {os.cpu_count()} CPUs (shared), {platform.platform()}, python {platform.python_version()}; "
          f"broker: local tansu (memory); d={args.dim}, c={args.classes}, features passthrough, 1 featurizer, "
          "no ledger worker", flush=True)
    out: dict[str, Any] = {"config": vars(args).copy(), "runs": {}}
    out["config"].pop("json")
    for enc in args.encodings.split(","):
        dtype = FEATURES_ENCODINGS[enc]
        msgs = [request(i, "add", f"stage-{enc}", X[i], int(y[i]), dtype) for i in range(args.n)]
        with tempfile.TemporaryDirectory() as tmp, LocalBroker() as broker:
            s = Settings.from_env(bootstrap=broker.bootstrap, topic_prefix="stage.", data_dir=tmp)
            out["config"]["settings"] = {k: getattr(s, k) for k in ("partitions", "batch_max_events", "batch_max_ms")}
            create_topics(s)
            produce_all(s, msgs)
            prof = cProfile.Profile() if args.profile else None
            res = run_stage(s, args.n, prof)
        res["bytes_per_request"] = float(np.mean([len(v) for _, v in msgs]))
        out["runs"][enc] = res
        print(f"{enc:>4} ({res['bytes_per_request']:,.0f} B/request): {res['events']} adds judged in "
              f"{res['wall_s']:.2f} s: {res['events_per_s']:,.0f} events/s, {res['stats']['batches']} batches, "
              f"{res['stats']['deltas']} deltas; process CPU {res['process_cpu_s']:.1f} s", flush=True)
        if prof is not None:
            for key in ("cumulative", "tottime"):
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.profile)
                print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[-12000:])
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
