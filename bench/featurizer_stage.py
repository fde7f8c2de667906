"""The featurizer stage alone, on the local broker: events/s and where its time goes.

    python -m bench.featurizer_stage [--n 5000] [--dim 768] [--encodings json,f64,f32]
                                     [--engine tansu|kafka] [--profile 25] [--groups] [--json PATH]

Pre-produces ``--n`` add requests per encoding (each encoding on heads of its own), then runs one
``FeaturizerService`` in this process (router + featurizer, real sqlite cache and changelog, real
broker acknowledgements; no ledger worker) from the first poll until every request was judged.
That isolates the featurizer's cost per event from the producer and the ledger, which
``bench.pipeline_bench`` measures together. With ``--profile K`` the run is under cProfile and
the K functions with the most cumulative and own time are printed (py-spy is not available
here); ``--groups`` runs under cProfile and prints the own time grouped by part (``profile_groups``:
sqlite, waiting for acknowledgements, parsing, quantizing, ...) in µs per event. Asserts nothing;
prints the machine, the settings and the numbers.
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

from bench.app_requests import request
from bench.pipeline_bench import settings_of
from unlearn.infra.local.engine import ENGINES, describe_engine, local_broker
from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.topics import create_topics
from unlearn.services.client.sdk import FEATURES_ENCODINGS
from unlearn.streams.featurizer.batch import BatchProcessor
from unlearn.streams.featurizer.service import FeaturizerService


def produce_all(s: Settings, msgs: list[tuple[bytes, bytes]]) -> None:
    """Produce and flush every (key, value) to the requests topic."""
    p = clients.producer(s, **{"linger.ms": 5})
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


# Parts of the featurizer's time: a function's own time goes to the first rule its name matches
# (``file:function`` as pstats names it); a builtin or library function's own time (numpy, orjson,
# base64, hashlib...) goes to its callers' parts, in proportion to the time each caller spent in it.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("waiting for broker acknowledgements (Producer.flush)", ("Producer' objects>:flush", "method 'flush' of")),
    ("sqlite (lookups, batch commit, outbox ack)", ("sqlite3", "featurizer/feature_cache.py:", "featurizer/cache_")),
    ("parse_request (JSON / base64 -> float64, checks)", ("schemas/envelope.py:", "schemas/request_inputs.py:",
                                                          "schemas/request_errors.py:", "schemas/source_id.py:",
                                                          "schemas/json_keys.py:")),
    ("quantizing (BatchQuantizer, l2_normalize, rint)", ("features/contract.py:",)),
    ("sealing (AES-GCM, HMAC, keys)", ("featurizer/erasure.py:", "featurizer/sealing.py:", "featurizer/key_store.py:",
                                       "runtime/probes.py:", "featurizer/raw_input_trim.py:", "cryptography",
                                       "hmac", "schemas/sealed", "transit")),
    ("changelog records (txn pieces, SHA-256)", ("changelog",)),
    ("router (head id, partition, headers)", ("router", "featurizer/routing.py:")),
    ("produce calls, consumer poll and commit", ("cimpl", "confluent_kafka", "delivery.py:")),
    ("delta / record encoding", ("delta_codec", "schemas/")),
    ("judging (core, overlay, contracts)", (
        "featurizer/featurize.py:", "featurizer/judge.py:", "featurizer/cache_view.py:", "featurizer/tombstones.py:",
        "featurizer/head_contracts.py:", "featurizer/refusals.py:", "featurizer/add_encoding.py:",
        "featurizer/delta_assembly.py:", "featurizer/batch_io.py:", "featurizer/core_config.py:",
        "featurizer/events.py:", "auth.py:")),
)
OTHER = "other Python (batch loop, service, stdlib)"


def _name(func: tuple[str, int, str]) -> str:
    return f"{func[0]}:{func[2]}"


def _own_group(func: tuple[str, int, str]) -> str | None:
    name = _name(func)
    for group, pats in GROUPS:
        if any(p in name for p in pats):
            return group
    if "/unlearn/" in func[0] or "/wt" in func[0] or "/work/" in func[0]:
        return OTHER if ".venv" not in func[0] else None
    return None


def profile_groups(prof: cProfile.Profile, n_events: int, verbose: bool = False) -> dict[str, float]:
    """µs per event of the profile's own time, grouped (``GROUPS``; the rest under ``OTHER``)."""
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    memo: dict[Any, dict[str, float]] = {}

    def shares(func: Any, depth: int = 0) -> dict[str, float]:
        """How ``func``'s own time splits over groups (fractions summing to 1)."""
        if func in memo:
            return memo[func]
        g = _own_group(func)
        if g is not None or depth > 6 or func not in stats:
            memo[func] = {g or OTHER: 1.0}
            return memo[func]
        callers = stats[func][4]
        total = sum(v[3] for v in callers.values()) or 0.0
        out: dict[str, float] = {}
        if total <= 0:
            out = {OTHER: 1.0}
        else:
            memo[func] = {OTHER: 1.0}  # recursion guard
            for caller, v in callers.items():
                for k, f in shares(caller, depth + 1).items():
                    out[k] = out.get(k, 0.0) + f * v[3] / total
        memo[func] = out
        return out

    totals: dict[str, float] = {}
    top: dict[str, list[tuple[float, str]]] = {}
    for func, (_cc, _nc, tt, _ct, _callers) in stats.items():
        for k, f in shares(func).items():
            totals[k] = totals.get(k, 0.0) + tt * f
            top.setdefault(k, []).append((tt * f, _name(func).rsplit("/", 1)[-1]))
    if verbose:
        for k, v in top.items():
            print(f"    {k}: " + ", ".join(f"{n} {1e6 * x / n_events:.0f}" for x, n in sorted(v, reverse=True)[:4]))
    return {k: 1e6 * v / n_events for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000, help="add requests per encoding")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--encodings", default="json,f64,f32", help="comma list of json, f64, f32")
    ap.add_argument("--profile", type=int, default=0, help="print the top K functions of a cProfile run")
    ap.add_argument("--groups", action="store_true", help="under cProfile: own time per part, µs per event")
    ap.add_argument("--engine", choices=ENGINES, default="tansu",
                    help="the local broker: tansu (embedded, memory) or kafka (Apache Kafka, one node; make kafka)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.n, args.dim))
    y = rng.integers(0, args.classes, args.n)
    print(f"machine: {os.cpu_count()} CPUs (shared), {platform.platform()}, python {platform.python_version()}; "
          f"broker: local {describe_engine(args.engine)}; load average {os.getloadavg()}; "
          f"d={args.dim}, c={args.classes}, features passthrough, 1 featurizer, "
          "no ledger worker", flush=True)
    out: dict[str, Any] = {"config": vars(args).copy(), "runs": {}}
    out["config"].pop("json")
    for enc in args.encodings.split(","):
        dtype = FEATURES_ENCODINGS[enc]
        msgs = [request(i, "add", f"stage-{enc}", X[i], int(y[i]), dtype) for i in range(args.n)]
        with tempfile.TemporaryDirectory() as tmp, local_broker(args.engine) as broker:
            s = Settings.from_env(bootstrap=broker.bootstrap, topic_prefix="stage.", data_dir=tmp,
                                  profile=args.engine)
            out["config"]["settings"] = settings_of(s, ("partitions", "batch_max_events", "batch_max_ms"))
            create_topics(s)
            produce_all(s, msgs)
            prof = cProfile.Profile() if args.profile or args.groups else None
            res = run_stage(s, args.n, prof)
        res["bytes_per_request"] = float(np.mean([len(v) for _, v in msgs]))
        out["runs"][enc] = res
        print(f"{enc:>4} ({res['bytes_per_request']:,.0f} B/request): {res['events']} adds judged in "
              f"{res['wall_s']:.2f} s: {res['events_per_s']:,.0f} events/s, {res['stats']['batches']} batches, "
              f"{res['stats']['deltas']} deltas; process CPU {res['process_cpu_s']:.1f} s", flush=True)
        if prof is not None and args.groups:
            res["groups_us_per_event"] = groups = profile_groups(prof, args.n, verbose=True)
            print(f"  own time per event (cProfile), total {sum(groups.values()):,.0f} µs:")
            for k, v in groups.items():
                print(f"    {v:7.1f} µs ({v / sum(groups.values()):4.0%})  {k}")
        if prof is not None and args.profile:
            for key in ("cumulative", "tottime"):
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.profile)
                print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[-12000:])
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
