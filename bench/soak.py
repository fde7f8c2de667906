"""Soak benchmark: does what the system writes stay bounded, and recovery time flat, under hours of load?

Runs a local broker (``--engine tansu``: the embedded one, memory engine; ``--engine kafka``: a
one-node Apache Kafka, ``infra/local/kafka.py``), one featurizer and one ledger worker, and
produces a steady stream of adds and deletes (synthetic feature vectors, one head) for
``--minutes``. Every ``--sample-s`` seconds it records the broker's RSS and, per topic and topic
family, the records and bytes a reader gets (and on Kafka the bytes on disk); every
``--kill-every-s`` seconds it kill -9s the ledger and times its return to readiness. With
``--live-cap N`` every add beyond N live samples comes with a delete, so the live set (and what is
keyed by it) reaches a steady state. Prints a table and (``--json``) writes the samples.

    python -m bench.soak [--engine tansu|kafka] [--minutes 10] [--rate 20] [--dim 256] [--live-cap N]
                         [--rotate-bytes 16000000] [--segment-ms 60000] [--json PATH]

What should level off: the heads and ledger-state families (trimmed by DeleteRecords in place on
Apache Kafka, rotated into new generations on tansu: docs/ledger-processor.md), on Kafka also the
raw inputs (trimmed once taken over), the feature-cache changelog and the key families
(compaction, with a tombstone retention of 5 x ``--segment-ms``: docs/erasure.md section 2), the
broker's memory beyond the logs, and the ledger's recovery time. What grows by design: the audit
log (``deltas``, ``receipts``), in proportion to the events, and on tansu the raw inputs and the
feature-cache changelog.
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

from unlearn.common.families import heads_family, keys_family, state_family, transit_private_family
from unlearn.infra.local.kafka import LocalKafka
from unlearn.infra.local.tansu import LocalBroker
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.topic_reader import read_topic
from unlearn.runtime.topics import create_topics, prefixed_topics
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.request_inputs import FeaturesInput


@dataclass
class Sample:
    t_s: float
    events: int
    broker_rss_mb: float
    records: dict[str, int]
    mbytes: dict[str, float]
    heads_topics: int
    state_topics: int
    disk_mb: dict[str, float] = field(default_factory=dict)  # Kafka: log segment bytes on disk per topic


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
    for fam in (heads_family(settings.topic_prefix), state_family(settings.topic_prefix),
                keys_family(settings.topic_prefix), transit_private_family(settings.topic_prefix)):
        if fam.matches(topic):
            return f"{fam.name} (family)"
    return topic[len(settings.topic_prefix):]


def _disk_mb(settings: Settings, broker: Any) -> dict[str, float]:
    """Bytes of every prefixed topic's partition directories on a LocalKafka's disk (segments not
    yet deleted or compacted included: what erasure must bound), per topic group."""
    out: dict[str, int] = {}
    for node in getattr(broker, "nodes", []):
        for d in Path(node.data_path).iterdir():
            topic, _, part = d.name.rpartition("-")
            if d.is_dir() and part.isdigit() and topic.startswith(settings.topic_prefix):
                size = sum(f.stat().st_size for f in d.iterdir() if f.is_file() and f.suffix == ".log")
                out[_group(settings, topic)] = out.get(_group(settings, topic), 0) + size
    return {k: round(v / 1e6, 2) for k, v in sorted(out.items())}


def _pid(broker: Any) -> int | None:
    nodes = getattr(broker, "nodes", None)
    return nodes[0].pid if nodes else broker.pid


def measure(settings: Settings, broker: Any, t: float, events: int) -> Sample:
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
    return Sample(round(t, 1), events, round(_rss_mb(_pid(broker)), 1), dict(sorted(records.items())),
                  {k: round(v / 1e6, 2) for k, v in sorted(nbytes.items())}, heads_n, state_n,
                  _disk_mb(settings, broker))


def run(args: argparse.Namespace, root: Path) -> Report:

    report = Report(vars(args).copy(), f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, "
                                       f"python {platform.python_version()}")
    # Kafka deletes segments below a trimmed log start at its retention check: every 30 s here
    # (Kafka's default: 5 min), so the disk column shows the trim within the run.
    broker: Any = (LocalKafka(data_dir=root / "kafka", broker_config={"log.retention.check.interval.ms": "30000"})
                   if args.engine == "kafka" else LocalBroker()).start()
    settings = Settings.from_env(bootstrap=broker.bootstrap, profile=args.engine, topic_prefix="soak.", partitions=2,
                                 data_dir=str(root / "data"), state_rotate_bytes=args.rotate_bytes,
                                 segment_ms=args.segment_ms)
    create_topics(settings)
    feat = ServiceProcess("featurizer", ["featurizer"], settings, root).start()
    ledger = ServiceProcess("ledger", ["ledger"], settings, root).start()
    rng = np.random.default_rng(0)
    live: list[tuple[str, str]] = []
    producer = clients.producer(settings, **{"linger.ms": 5})
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
                if live and (rng.random() < 0.3 or (args.live_cap and len(live) >= args.live_cap and n % 2)):
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


def _table(r: Report, title: str, of: str) -> list[str]:
    groups = sorted({g for s in r.samples for g in getattr(s, of)})
    if not groups:
        return []
    lines = ["", title, "", "| t (s) | events | broker RSS (MB) | heads topics | state topics | " + " | ".join(
        f"{g} MB" for g in groups) + " |", "|" + "---|" * (5 + len(groups))]
    for s in r.samples:
        lines.append(f"| {s.t_s:.0f} | {s.events} | {s.broker_rss_mb:.0f} | {s.heads_topics} | {s.state_topics} | "
                     + " | ".join(f"{getattr(s, of).get(g, 0):.1f}" for g in groups) + " |")
    return lines


def render(r: Report) -> str:
    lines = [f"soak benchmark on {r.machine}", f"config: {r.config}"]
    lines += _table(r, "what a reader gets (keys + values, read to the end)", "mbytes")
    lines += _table(r, "log segments on the broker's disk", "disk_mb")
    rec = [x for _, x in r.ledger_recovery_s]
    if rec:
        lines += ["", "ledger kill -9 -> ready (s), in order: " + ", ".join(f"{x:.2f}" for x in rec)
                  + f"; median {statistics.median(rec):.2f}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("tansu", "kafka"), default="tansu")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--live-cap", type=int, default=0, help="beyond this many live samples, every add comes "
                    "with a delete (0: 30%% deletes throughout)")
    ap.add_argument("--segment-ms", type=int, default=60_000, help="UNLEARN_SEGMENT_MS (Kafka)")
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
