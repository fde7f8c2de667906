"""The embedded broker's own ceiling on this machine: messages per second through one hop.

Why: issue 12 asks for 20,000 adds/s end to end (binary features) on 2 cores. An add crosses the
broker several times (the request into ``requests``, the router's copy into ``requests.by-head``,
the featurizer's changelog transaction and its delta, the ledger's head update per poll). This
measures what the broker alone carries for one produce and one consume of messages of the
pipeline's sizes, with the project's own client settings (``infra/settings.py``: acks=all, and on
tansu no idempotence and one request in flight), and nothing else running. It bounds what any
pipeline on the same box can do: if one hop carries R messages/s, an add that crosses the broker
h times cannot go faster than about R / h, before any featurizing or ledger work.

    python -m bench.broker_ceiling [--n 20000] [--sizes 4400,6300] [--partitions 4] [--linger-ms 5]
                                   [--engine tansu|kafka]

``--engine kafka`` measures the project's Apache Kafka (one KRaft node, the ``kafka`` client profile:
acks=all with idempotence, five requests in flight) instead of the embedded tansu.

Prints medians of ``--repeats`` runs per size (never asserts): produce rate (produce + flush, all
acknowledged) and consume rate (a fresh consumer, assigned every partition, reading them back).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from unlearn.infra.local.engine import ENGINES, describe_engine, local_broker
from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.topics import create_topics


def produce_rate(settings: Settings, topic: str, n: int, size: int, linger_ms: int) -> float:
    """Messages/s to produce ``n`` messages of ``size`` bytes and have every one acknowledged."""
    producer = clients.producer(settings, **{"linger.ms": linger_ms})
    value = os.urandom(size)
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, value, key=str(i % 64).encode(), on_delivery=on_delivery)
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.005)
        producer.poll(0)
    left = producer.flush(120)
    dt = time.perf_counter() - t0
    if left or failed:
        raise RuntimeError(f"{left} messages unflushed, {len(failed)} failed: {failed[:3]}")
    return n / dt


def consume_rate(settings: Settings, topic: str, partitions: int, n: int) -> float:
    """Messages/s to read ``n`` messages back, from the assignment (no group join) to the last."""
    consumer = clients.consumer(settings, f"ceiling-{uuid.uuid4().hex[:8]}")
    got = 0
    deadline = time.monotonic() + 300
    try:
        t0 = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        while got < n and time.monotonic() < deadline:
            batch = consumer.consume(num_messages=1000, timeout=0.5)
            got += sum(1 for m in batch if m.error() is None)
        if got < n:
            raise RuntimeError(f"read {got} of {n} messages back")
        return n / (time.perf_counter() - t0)
    finally:
        consumer.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                       "python": platform.python_version(), "broker": describe_engine(args.engine),
                                       "loadavg_start": os.getloadavg()},
                           "config": vars(args).copy(), "sizes": []}
    sizes = [int(x) for x in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp, local_broker(args.engine) as broker:
        s = Settings.from_env(bootstrap=broker.bootstrap, topic_prefix="ceiling.", data_dir=tmp, profile=args.engine)
        # an untimed round first: a just-started broker's JIT compiles meanwhile (bench/results/pipeline_bench.md
        # section 26: 7,645 produces/s of 4.4 KB cold, 15,288 warm)
        create_topics(s, partitions=args.partitions, extra=["warmup"])
        produce_rate(s, s.topic("warmup"), args.n, sizes[0], args.linger_ms)
        consume_rate(s, s.topic("warmup"), args.partitions, args.n)
        for size in sizes:
            prod, cons = [], []
            for r in range(args.repeats):
                logical = f"hop{size}r{r}"
                create_topics(s, partitions=args.partitions, extra=[logical])
                topic = s.topic(logical)
                prod.append(produce_rate(s, topic, args.n, size, args.linger_ms))
                cons.append(consume_rate(s, topic, args.partitions, args.n))
            out["sizes"].append({"bytes": size, "produce_per_s": prod, "consume_per_s": cons,
                                 "produce_median": statistics.median(prod),
                                 "consume_median": statistics.median(cons)})
    out["machine"]["loadavg_end"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.broker_ceiling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000, help="messages per run")
    ap.add_argument("--sizes", default="4400,6300",
                    help="message sizes in bytes (default: a float32 add request at d=768, one delta row)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--linger-ms", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine", choices=ENGINES, default="tansu",
                    help="the local broker: tansu (embedded, memory) or kafka (Apache Kafka, one node; make kafka)")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    args = ap.parse_args(argv)
    res = run(args)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    m = res["machine"]
    print(f"# broker ceiling: {m['cpus']} CPUs, {m['platform']}, Python {m['python']}, {m['broker']}; "
          f"load average {m['loadavg_start'][0]:.2f} -> {m['loadavg_end'][0]:.2f}")
    print(f"# {args.n} messages per run, {args.partitions} partitions, linger.ms={args.linger_ms}, "
          f"the project's client settings; medians of {args.repeats} runs")
    print("| message bytes | produce msgs/s (acked) | consume msgs/s | runs produce / consume |")
    print("|---|---|---|---|")
    for row in res["sizes"]:
        print(f"| {row['bytes']:,} | {row['produce_median']:,.0f} | {row['consume_median']:,.0f} | "
              f"{', '.join(f'{x:,.0f}' for x in row['produce_per_s'])} / "
              f"{', '.join(f'{x:,.0f}' for x in row['consume_per_s'])} |")
    return res


if __name__ == "__main__":
    main()
