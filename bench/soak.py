"""Soak benchmark: does what the system writes stay bounded, and recovery time flat, under hours of load?

Runs the embedded broker (memory engine), one featurizer and one ledger worker, and produces a
steady stream of adds and deletes (synthetic feature vectors, one head) for ``--minutes``.
Every ``--sample-s`` seconds it records the broker's RSS and, per topic and topic family, the
records and bytes the broker holds; every ``--kill-every-s`` seconds it kill -9s the ledger and
times its return to readiness. Prints a table and (``--json``) writes the samples.

    python -m bench.soak [--minutes 10] [--rate 20] [--dim 256] [--rotate-bytes 16000000] [--json PATH]

What should level off: the heads and ledger-state families (rotated, design.md section 3), the
broker's memory beyond the input logs, and the ledger's recovery time. What grows by design: the
input and audit logs (``requests``, ``deltas``, ``receipts``) and the feature-cache changelog,
in proportion to the events (bounded by retention and compaction on Apache Kafka).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from unlearn.infra.broker import LocalBroker
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.profiles import producer_config
from unlearn.infra.settings import Settings
from unlearn.infra.topic_family import heads_family, state_family
from unlearn.infra.topic_reader import read_topic
from unlearn.infra.topics import create_topics, prefixed_topics
from unlearn.schemas.envelope import FeaturesInput, Request, encode_request


@dataclass
class Sample:
    t_s: float
    events: int
    broker_rss_mb: float
    records: dict[str, int]
    mbytes: dict[str, float]
    heads_topics: int
    state_topics: int


@dataclass
class Report:
    config: dict[str, Any]
    machine: str
    samples: list[Sample] = field(default_factory=list)
    ledger_recovery_s: list[tuple[float, float]] = field(default_factory=list)  # (t, seconds)


def _rss_mb(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _group(settings: Settings, topic: str) -> str:
    for fam in (heads_family(settings.topic_prefix), state_family(settings.topic_prefix)):
        if fam.matches(topic):
            return f"{fam.name} (family)"
    return topic[len(settings.topic_prefix):]


def measure(settings: Settings, broker: LocalBroker, t: float, events: int) -> Sample:
    """What the broker holds now: every prefixed topic read to its end (records and bytes)."""
    records: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    heads_n = state_n = 0
    for topic in prefixed_topics(settings):
        group = _group(settings, topic)
        heads_n += group.startswith("heads")
        state_n += group.startswith("ledger-state")
        try:
            recs = read_topic(settings, topic, timeout=120, role="soak")
        except Exception:  # deleted while we listed it (a rotation): it holds nothing now
            continue
        records[group] = records.get(group, 0) + len(recs)
        nbytes[group] = nbytes.get(group, 0) + sum(len(r.value or b"") + len(r.key or b"") for r in recs)
    return Sample(round(t, 1), events, round(_rss_mb(broker.pid), 1), dict(sorted(records.items())),
                  {k: round(v / 1e6, 2) for k, v in sorted(nbytes.items())}, heads_n, state_n)


def run(args: argparse.Namespace, root: Path) -> Report:
    from confluent_kafka import Producer

    report = Report(vars(args).copy(), f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, "
                                       f"python {platform.python_version()}")
    broker = LocalBroker().start()
    settings = Settings.from_env(bootstrap=broker.bootstrap, profile="tansu", topic_prefix="soak.", partitions=2,
                                 data_dir=str(root / "data"), state_rotate_bytes=args.rotate_bytes)
    create_topics(settings)
    feat = ServiceProcess("featurizer", ["featurizer"], settings, root).start()
    ledger = ServiceProcess("ledger", ["ledger"], settings, root).start()
    rng = np.random.default_rng(0)
    live: list[tuple[str, str]] = []
    producer = Producer(producer_config(settings, **{"linger.ms": 5}))
    n = 0
    try:
        for p in (feat, ledger):
            p.wait_for_log(f"unlearn {p.name} ready", timeout=120)
        t0 = time.monotonic()
        next_sample, next_kill = 0.0, args.kill_every_s
        while (now := time.monotonic() - t0) < args.minutes * 60:
            want = int(now * args.rate)
            while n < want:
                n += 1
                if live and rng.random() < 0.3:
                    subject, sample = live.pop(int(rng.integers(len(live))))
                    req = Request(f"d{n}", "delete", "soak", "soak", subject, sample)
                else:
                    subject, sample = f"u{int(rng.integers(500))}", f"s{n}"
                    live.append((subject, sample))
                    f = rng.normal(size=args.dim)
                    req = Request(f"a{n}", "add", "soak", "soak", subject, sample, int(rng.integers(10)),
                                  FeaturesInput(tuple(float(x) for x in f)))
                producer.produce(settings.topic("requests"), key=subject.encode(), value=encode_request(req))
            producer.poll(0)
            if now >= next_sample:
                s = measure(settings, broker, now, n)
                report.samples.append(s)
                print(f"t={s.t_s:>6}s events={s.events:>6} broker_rss={s.broker_rss_mb:>7.1f} MB "
                      f"heads topics={s.heads_topics} state topics={s.state_topics} MB={s.mbytes}", flush=True)
                next_sample = now + args.sample_s
            if now >= next_kill:
                ledger.kill9()
                ledger.start()
                took = ledger.wait_for_log("unlearn ledger ready", timeout=120)
                report.ledger_recovery_s.append((round(now, 1), round(took, 2)))
                print(f"t={now:>6.1f}s ledger kill -9 -> ready in {took:.2f} s", flush=True)
                next_kill = now + args.kill_every_s
            time.sleep(0.02)
        producer.flush(30)
        report.samples.append(measure(settings, broker, time.monotonic() - t0, n))
    finally:
        for p in (feat, ledger):
            p.stop()
        broker.stop()
    return report


def render(r: Report) -> str:
    groups = sorted({g for s in r.samples for g in s.mbytes})
    lines = [f"soak benchmark on {r.machine}", f"config: {r.config}", "",
             "| t (s) | events | broker RSS (MB) | heads topics | state topics | " + " | ".join(
                 f"{g} MB" for g in groups) + " |",
             "|" + "---|" * (5 + len(groups))]
    for s in r.samples:
        lines.append(f"| {s.t_s:.0f} | {s.events} | {s.broker_rss_mb:.0f} | {s.heads_topics} | {s.state_topics} | "
                     + " | ".join(f"{s.mbytes.get(g, 0):.1f}" for g in groups) + " |")
    rec = [x for _, x in r.ledger_recovery_s]
    if rec:
        lines += ["", "ledger kill -9 -> ready (s), in order: " + ", ".join(f"{x:.2f}" for x in rec)
                  + f"; median {statistics.median(rec):.2f}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=20.0, help="events per second")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--rotate-bytes", type=int, default=16_000_000, help="UNLEARN_STATE_ROTATE_BYTES")
    ap.add_argument("--sample-s", type=float, default=60.0)
    ap.add_argument("--kill-every-s", type=float, default=150.0)
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="unlearn-soak-") as tmp:
        report = run(args, Path(tmp))
    print(render(report))
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(asdict(report), option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
