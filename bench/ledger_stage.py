"""The ledger stage alone, on the local broker: events/s and where its time goes.

    python -m bench.ledger_stage [--n 5000] [--dim 768] [--encoding f32] [--batch 256]
                                 [--engine tansu|kafka] [--profile 25] [--json PATH]

First the featurizer (in this process, ``bench.featurizer_stage``) turns ``--n`` pre-produced adds
of one head into deltas (``--batch``: ``UNLEARN_BATCH_MAX_EVENTS``, so about n/batch deltas
messages), untimed. Then one ``LedgerWorker`` runs in this process from its first deltas message
until it has applied and published the last one: exact ledger, multiset hash, fast head and
resets, head updates, checkpoints into ``ledger-state``, all as in production. With
``--profile K`` that run is under cProfile and the K functions with the most cumulative and own
time are printed. Asserts nothing; prints the machine, the settings and the numbers.
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

import numpy as np
from threadpoolctl import threadpool_limits

from bench.app_requests import request
from bench.featurizer_stage import produce_all, run_stage
from bench.pipeline_bench import settings_of
from unlearn.infra.local.engine import ENGINES, describe_engine, local_broker
from unlearn.infra.settings import Settings
from unlearn.runtime.topics import create_topics
from unlearn.services.client.sdk import FEATURES_ENCODINGS
from unlearn.streams.ledger.settings import LedgerSettings
from unlearn.streams.ledger.worker import LedgerWorker


def run_ledger(s: Settings, n_deltas: int, profile: cProfile.Profile | None, timeout: float = 900.0) -> dict[str, Any]:
    """One ledger worker from its first deltas message until ``n_deltas`` were applied and their
    head updates handed to the producer; wall and process CPU time of that span."""
    worker = LedgerWorker(s)
    seen: list[int] = []
    marks: list[tuple[float, float]] = []
    on_message, publish = worker._on_message, worker._publish_poll

    def counted(m: Any, poll: Any) -> None:
        if not seen:
            marks.append((time.perf_counter(), time.process_time()))
            if profile is not None:
                profile.enable()
        seen.append(1)
        on_message(m, poll)

    def published(poll: Any) -> None:
        publish(poll)
        if len(seen) >= n_deltas and len(marks) == 1:
            worker.producer.flush(60)  # the head updates are out
            if profile is not None:
                profile.disable()
            marks.append((time.perf_counter(), time.process_time()))
            worker.stop()

    worker._on_message = counted  # type: ignore[method-assign]
    worker._publish_poll = published  # type: ignore[method-assign]
    timer = threading.Timer(timeout, worker.stop)
    timer.start()
    try:
        worker.run()
    finally:
        timer.cancel()
    if len(marks) < 2:
        raise TimeoutError(f"ledger applied {len(seen)} of {n_deltas} deltas in {timeout:g}s")
    return {"deltas": n_deltas, "wall_s": marks[1][0] - marks[0][0], "process_cpu_s": marks[1][1] - marks[0][1]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000, help="add events")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--encoding", default="f32", choices=sorted(FEATURES_ENCODINGS))
    ap.add_argument("--batch", type=int, default=256, help="UNLEARN_BATCH_MAX_EVENTS of the featurizer")
    ap.add_argument("--engine", choices=ENGINES, default="tansu",
                    help="the local broker: tansu (embedded, memory) or kafka (Apache Kafka, one node)")
    ap.add_argument("--profile", type=int, default=0, help="print the top K functions of a cProfile run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.n, args.dim))
    y = rng.integers(0, args.classes, args.n)
    msgs = [request(i, "add", "ledger-stage", X[i], int(y[i]), FEATURES_ENCODINGS[args.encoding])
            for i in range(args.n)]
    print(f"machine: {os.cpu_count()} CPUs (shared), {platform.platform()}, python {platform.python_version()}; "
          f"broker: local {describe_engine(args.engine)}; d={args.dim}, c={args.classes}, one head, 1 ledger worker",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp, local_broker(args.engine) as broker:
        s = Settings.from_env(bootstrap=broker.bootstrap, topic_prefix="lstage.", data_dir=tmp,
                              batch_max_events=args.batch, profile=args.engine)
        create_topics(s)
        produce_all(s, msgs)
        fz = run_stage(s, args.n, None)
        n_deltas = int(fz["stats"]["deltas"])
        prof = cProfile.Profile() if args.profile else None
        # as `unlearn ledger` runs it (streams/ledger/worker.py, run_ledger_worker): one BLAS thread
        with threadpool_limits(limits=LedgerSettings.of(s).ledger_blas_threads, user_api="blas"):
            res = run_ledger(s, n_deltas, prof)
    res.update(events=args.n, events_per_s=args.n / res["wall_s"], rows_per_delta=args.n / n_deltas,
               settings=settings_of(s, ("batch_max_events", "checkpoint_every_messages", "checkpoint_every_seconds",
                                        "reset_every_events", "reset_every_seconds", "publish_posterior")))
    print(f"ledger stage: {args.n} adds in {n_deltas} deltas ({res['rows_per_delta']:.0f} rows each) applied and "
          f"published in {res['wall_s']:.2f} s: {res['events_per_s']:,.0f} events/s; process CPU "
          f"{res['process_cpu_s']:.2f} s", flush=True)
    if prof is not None:
        for key in ("cumulative", "tottime"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.profile)
            print("\n".join(line for line in buf.getvalue().splitlines() if line.strip()))
    if args.json:
        args.json.write_text(json.dumps({"config": {k: v for k, v in vars(args).items() if k != "json"},
                                         "result": res}, indent=2, default=str))


if __name__ == "__main__":
    main()
