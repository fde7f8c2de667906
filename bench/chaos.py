"""Chaos benchmark: the whole pipeline under random kill -9 and a broker restart, then an audit.

    python -m bench.chaos [--quick] [--events N] [--kills K] [--broker-restart] [--json PATH]

A local broker (persistent, so that it can be restarted: ``LocalBroker(data_dir=...)``), one
featurizer and one ledger worker as child processes (the operator's ``unlearn`` commands), and a
producer of request events: adds of random feature vectors and deletes of earlier adds, spread
over several heads that share ``deltas`` partitions. While events flow, the benchmark kills -9 the
ledger, the featurizer or both at random moments (and restarts them); with ``--broker-restart``
it also restarts a persistent broker once (SIGTERM, then the same port and data dir). Then it
waits for the heads to settle and audits:

- **lost / doubled events**: the deltas log is replayed with the ledger's own admission rules
  (``head_runtime.admit`` / ``apply_entries``) to see which request events reached the ledger,
  how many times; every add and delete produced must be applied exactly once;
- **digest mismatches**: each head's latest exact digest must equal a from-scratch ledger of the
  retained samples (quantized by the feature contract), and its retained-rows hash the
  from-scratch multiset hash of those rows (docs/design.md section 6);
- **(head, version) pairs with more than one digest** among the head updates that carry one
  (exact updates always do, fast ones carry none), and with more than one retained-rows hash over
  all head updates and the applied receipts (an unknown hash counts as a value of its own);
- **receipts**: every delete must have an applied receipt; duplicates are counted (identical
  duplicates are allowed by the at-least-once protocol, conflicting ones are not: a receipt names
  the version of the message that applied its delete, whatever the poll boundaries of the run);
- **recovery**: seconds from a restart to the worker's readiness line (p50 / max).

Prints a table and, with ``--json``, writes the numbers. Exit 0 iff every correctness count is 0.

Why the broker restart is opt-in: the embedded broker's only persistent engine (tansu ``s3://``
against s3rver) was measured losing acknowledged records and reusing offsets when restarted
under load (tansu ignores SIGTERM while clients are connected, so the restart ends in SIGKILL);
the workers then stop with a stale-state error rather than skip, and the audit cannot read the
damaged topics to their end. docs/design.md, "The embedded broker", has the details.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from unlearn.features.contract import quantize_feature_row
from unlearn.infra.broker import LocalBroker, LocalS3Unavailable
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.profiles import producer_config
from unlearn.infra.settings import Settings
from unlearn.infra.topic_family import heads_family
from unlearn.infra.topic_reader import LogRecord, TopicFollower, read_topic
from unlearn.infra.topics import create_topics
from unlearn.ledger import ExactLedger, MultisetHash
from unlearn.schemas.delta_codec import CodecError, decode_delta
from unlearn.schemas.envelope import FeaturesInput, Request, encode_request
from unlearn.schemas.head_codec import HeadUpdate, decode_head
from unlearn.schemas.receipts import decode_receipt
from unlearn.schemas.sealed import SealError
from unlearn.streams.ledger.head_runtime import admit, apply_entries, creates_head, record_applied
from unlearn.streams.ledger.unseal import RowOpener


@dataclass
class Config:
    events: int = 100_000
    kills: int = 12
    heads: int = 6
    partitions: int = 2
    dim: int = 16
    delete_fraction: float = 0.3
    broker_restart: bool = False
    seed: int = 0
    settle_timeout: float = 300.0
    rotate_bytes: int = 2_000_000  # UNLEARN_STATE_ROTATE_BYTES: small, so that heads and state rotate under kills


@dataclass
class Report:
    config: dict[str, Any]
    machine: str
    events_produced: int = 0
    adds: int = 0
    deletes: int = 0
    lost_events: int = 0
    doubled_events: int = 0
    digest_mismatched_heads: int = 0
    retained_hash_mismatched_heads: int = 0
    versions_with_two_digests: int = 0
    versions_with_two_retained_hashes: int = 0
    head_updates_seen: int = 0  # by a follower of the heads family during the whole run
    heads_generations: int = 0  # the most heads generations seen in use, over all partitions
    receipts_missing: int = 0
    receipts_duplicated: int = 0
    receipts_conflicting: int = 0
    kills: list[str] = field(default_factory=list)
    broker_restarts: int = 0
    recovery_s: dict[str, list[float]] = field(default_factory=dict)
    elapsed_s: float = 0.0
    examples: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not (self.lost_events or self.doubled_events or self.digest_mismatched_heads
                    or self.retained_hash_mismatched_heads or self.versions_with_two_digests
                    or self.versions_with_two_retained_hashes or self.receipts_missing or self.receipts_conflicting)


class Workload:
    """Random adds and deletes over several heads; remembers what must be retained."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.heads = [f"chaos{i}" for i in range(cfg.heads)]
        self.live: dict[str, dict[str, tuple[np.ndarray, int, str]]] = {h: {} for h in self.heads}
        self.add_events: dict[str, tuple[str, str]] = {}  # event -> (head, sample)
        self.delete_events: dict[str, tuple[str, str, str]] = {}  # event -> (head, subject, sample)
        self.n = 0

    def next(self) -> tuple[str, bytes]:
        self.n += 1
        h = self.heads[int(self.rng.integers(len(self.heads)))]
        live = self.live[h]
        if live and self.rng.random() < self.cfg.delete_fraction:
            sample = sorted(live)[int(self.rng.integers(len(live)))]
            _, _, subject = live.pop(sample)
            ev = f"d{self.n}"
            self.delete_events[ev] = (h, subject, sample)
            return subject, encode_request(Request(ev, "delete", h, "chaos", subject, sample))
        f = self.rng.normal(size=self.cfg.dim)
        label = int(self.rng.integers(4))
        subject = f"u{int(self.rng.integers(200))}"
        sample = f"s{self.n}"
        ev = f"a{self.n}"
        live[sample] = (f, label, subject)
        self.add_events[ev] = (h, sample)
        return subject, encode_request(Request(ev, "add", h, "chaos", subject, sample, label,
                                               FeaturesInput(tuple(float(x) for x in f))))

    def _retained(self, head: str, settings: Settings) -> tuple[np.ndarray, np.ndarray]:
        """The head's retained rows, quantized by the feature contract, and their labels."""
        rows = list(self.live[head].values())
        if not rows:
            return np.zeros((0, self.cfg.dim), np.int64), np.zeros(0, np.int64)
        Q = np.stack([quantize_feature_row(f, settings.frac_bits, settings.feature_bound) for f, _, _ in rows])
        return Q, np.array([lab for _, lab, _ in rows], np.int64)

    def reference_digest(self, head: str, n_outputs: int, settings: Settings) -> str:
        Q, y = self._retained(head, settings)
        led = ExactLedger(self.cfg.dim, n_outputs, settings.frac_bits, settings.label_frac_bits)
        if len(y):
            led.add(Q, y)
        led.grow_outputs(n_outputs)
        return led.digest()

    def reference_retained_hash(self, head: str, settings: Settings) -> str:
        Q, y = self._retained(head, settings)
        return MultisetHash.of_rows(Q, y, settings.frac_bits, settings.label_frac_bits).fingerprint()


class Pipeline:
    """Broker + featurizer + ledger, each restartable."""

    def __init__(self, root: Path, cfg: Config) -> None:
        self.root = root
        self.cfg = cfg
        self.broker = LocalBroker(data_dir=root / "broker") if cfg.broker_restart else LocalBroker()
        self.broker.start()
        self.settings = Settings.from_env(
            bootstrap=self.broker.bootstrap, profile="tansu", topic_prefix="chaos.", partitions=cfg.partitions,
            data_dir=str(root / "data"), checkpoint_every_messages=20, checkpoint_every_seconds=1.0,
            # s3:// storage answers short fetches with nothing once a partition holds many batches
            fetch_max_wait_ms=300 if cfg.broker_restart else None, state_rotate_bytes=cfg.rotate_bytes)
        create_topics(self.settings)
        # Every head update, as published (rotation deletes superseded generations afterwards).
        self.digests: dict[tuple[str, int], set[str]] = {}  # of the updates that carry one
        self.retained_hashes: dict[tuple[str, int], set[str | None]] = {}
        self.heads_topics: set[str] = set()
        self.head_updates = 0
        self.heads_follower = TopicFollower(self.settings, heads_family(self.settings.topic_prefix),
                                            self._on_head, role="chaos-heads")
        self.featurizer = ServiceProcess("featurizer", ["featurizer", "--loglevel", "info"], self.settings, root)
        self.ledger = ServiceProcess("ledger", ["ledger", "--loglevel", "info"], self.settings, root)
        self.recovery: dict[str, list[float]] = {"featurizer": [], "ledger": [], "broker": []}

    def _on_head(self, r: LogRecord) -> None:
        try:
            u = decode_head(r.value or b"")
        except CodecError:
            return
        self.head_updates += 1
        self.heads_topics.add(r.topic)
        if u.digest is not None:
            self.digests.setdefault((u.head_id, u.version), set()).add(u.digest)
        self.retained_hashes.setdefault((u.head_id, u.version), set()).add(u.retained_hash)

    def start_workers(self) -> None:
        self.heads_follower.start(wait_assigned=30)
        for p in (self.featurizer, self.ledger):
            p.start()
        for p in (self.featurizer, self.ledger):
            p.wait_for_log(f"unlearn {p.name} ready", timeout=120)

    def kill(self, which: str) -> None:
        procs = {"ledger": [self.ledger], "featurizer": [self.featurizer],
                 "both": [self.ledger, self.featurizer]}[which]
        for p in procs:
            p.kill9()
        for p in procs:
            p.start()
        for p in procs:
            self.recovery[p.name].append(p.wait_for_log(f"unlearn {p.name} ready", timeout=120))

    def restart_broker(self) -> None:
        port = self.broker.port
        self.broker.stop()
        t0 = time.monotonic()
        self.broker = LocalBroker(port, data_dir=self.root / "broker")
        self.broker.start()
        self.recovery["broker"].append(time.monotonic() - t0)

    def stop(self) -> None:
        self.heads_follower.stop()
        for p in (self.featurizer, self.ledger):
            p.stop()
        self.broker.stop()


def _produce(settings: Settings, work: Workload, n: int, producer: Any) -> None:
    topic = settings.topic("requests")
    for _ in range(n):
        key, value = work.next()
        while True:
            try:
                producer.produce(topic, key=key.encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
    producer.poll(0)


def _latest_heads(records: list[Any]) -> tuple[dict[str, HeadUpdate], dict[tuple[str, int], set[str]],
                                               dict[tuple[str, int], set[str | None]]]:
    """(latest exact update per head, digests (of the updates that carry one) and retained-rows
    hashes per (head, version))."""
    latest: dict[str, HeadUpdate] = {}
    digests: dict[tuple[str, int], set[str]] = {}
    retained: dict[tuple[str, int], set[str | None]] = {}
    for r in records:
        try:
            u = decode_head(r.value or b"")
        except CodecError:
            continue
        if u.digest is not None:
            digests.setdefault((u.head_id, u.version), set()).add(u.digest)
        retained.setdefault((u.head_id, u.version), set()).add(u.retained_hash)
        if u.mode == "exact" and u.supersedes(latest.get(u.head_id)):
            latest[u.head_id] = u
    return latest, digests, retained


def _applied_events(records: list[Any], dim: int, opener: RowOpener | None = None) -> Counter[tuple[str, str]]:
    """(event id, sample id) -> times applied, replaying deltas with the ledger's admission rules.
    Sealed rows are opened with ``opener`` (docs/erasure.md); a row whose key is destroyed since
    (an erased add or delete: the pairs cancel) counts as applied when its message is admitted."""
    applied: Counter[tuple[str, str]] = Counter()
    positions: dict[str, Any] = {}
    ledgers: dict[str, ExactLedger] = {}

    class Pos:
        def __init__(self) -> None:
            self.applied_offset = -1
            self.source_offsets: dict[str, int] = {}

    for r in records:  # one partition after another, each in offset order: per head, log order
        try:
            delta = decode_delta(r.value or b"")
            opened = opener.open(delta) if opener is not None else None
        except (CodecError, SealError):
            continue
        erased = opened.erased if opened is not None else []
        creates = creates_head(delta)  # as sealed: a first message whose rows are all erased still made the head
        if opened is not None:
            delta = opened.delta
        if delta.head_id not in ledgers:
            if not creates:
                continue
            ledgers[delta.head_id] = ExactLedger(delta.d, 0, delta.frac_bits, delta.label_frac_bits)
            positions[delta.head_id] = Pos()
        pos, led = positions[delta.head_id], ledgers[delta.head_id]
        if admit(pos, delta, r.offset):
            continue
        for e in erased:
            applied[(e.event_id, e.sample_id)] += 1

        def apply(entry: Any, led: ExactLedger = led) -> bool:
            (led.add if entry.sign > 0 else led.delete)(entry.q, entry.labels)
            return True

        for _, entry, result in apply_entries(delta.head_id, delta, led, apply):
            if result is True:
                for ev, sample in zip(entry.event_ids, entry.sample_ids, strict=True):
                    applied[(ev, sample)] += 1
        record_applied(pos, delta, r.offset)
    return applied


def audit(pipe: Pipeline, work: Workload, report: Report) -> None:
    s = pipe.settings
    deadline = time.monotonic() + pipe.cfg.settle_timeout
    latest: dict[str, HeadUpdate] = {}
    while True:  # settle: every head's latest exact update equals its reference
        latest, digests, retained = _latest_heads(read_topic(s, heads_family(s.topic_prefix)))
        pending = [h for h in work.heads
                   if h not in latest or latest[h].digest != work.reference_digest(h, latest[h].c, s)]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    report.digest_mismatched_heads = len(pending)
    report.examples += [f"head {h}: final digest differs from a from-scratch ledger" for h in pending[:3]]
    off = [h for h in work.heads if h in latest and latest[h].retained_hash != work.reference_retained_hash(h, s)]
    report.retained_hash_mismatched_heads = len(off)
    report.examples += [f"head {h}: final retained-rows hash differs from a from-scratch one" for h in off[:3]]
    for key, seen in pipe.digests.items():
        digests.setdefault(key, set()).update(seen)
    for key, hashes in pipe.retained_hashes.items():
        retained.setdefault(key, set()).update(hashes)
    report.versions_with_two_digests = sum(1 for d in digests.values() if len(d) > 1)
    report.head_updates_seen = pipe.head_updates
    report.heads_generations = len(pipe.heads_topics)

    applied = _applied_events(read_topic(s, s.topic("deltas")), pipe.cfg.dim, RowOpener(s, batch=True))
    expected = {(ev, sample) for ev, (_, sample) in work.add_events.items()}
    expected |= {(ev, sample) for ev, (_, _, sample) in work.delete_events.items()}
    lost = [k for k in expected if applied.get(k, 0) == 0]
    doubled = [k for k, n in applied.items() if n > 1]
    report.lost_events, report.doubled_events = len(lost), len(doubled)
    report.examples += [f"lost {k}" for k in lost[:3]] + [f"doubled {k}" for k in doubled[:3]]

    receipts: dict[str, list[bytes]] = {}
    for r in read_topic(s, s.topic("receipts")):
        try:
            rec = decode_receipt(r.value or b"")
        except Exception:  # undecodable receipts are not ours to count
            continue
        if rec.status == "applied":
            content = orjson.dumps([rec.head_id, rec.head_version, rec.digest, rec.retained_hash,
                                    sorted(rec.sample_ids)])
            receipts.setdefault(rec.event_id, []).append(content)
            retained.setdefault((rec.head_id, int(rec.head_version or 0)), set()).add(rec.retained_hash)
    report.versions_with_two_retained_hashes = sum(1 for h in retained.values() if len(h) > 1)
    report.receipts_missing = sum(1 for ev in work.delete_events if ev not in receipts)
    report.receipts_duplicated = sum(1 for ev in work.delete_events if len(receipts.get(ev, [])) > 1)
    report.receipts_conflicting = sum(1 for ev in work.delete_events if len(set(receipts.get(ev, []))) > 1)


def run(cfg: Config, root: Path) -> Report:
    from confluent_kafka import Producer

    report = Report(asdict(cfg), f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, "
                                 f"python {platform.python_version()}")
    rng = np.random.default_rng(cfg.seed + 1)
    t0 = time.monotonic()
    try:
        pipe = Pipeline(root, cfg)
    except LocalS3Unavailable as exc:
        print(f"persistent broker unavailable ({exc}); running without the broker restart", file=sys.stderr)
        cfg.broker_restart = False
        report.config["broker_restart"] = False
        pipe = Pipeline(root, cfg)
    work = Workload(cfg)
    try:
        pipe.start_workers()
        n_chunks = cfg.kills + 1
        chunk = max(1, cfg.events // n_chunks)
        restart_at = n_chunks // 2 if cfg.broker_restart else -1
        for i in range(n_chunks):
            n = chunk if i < n_chunks - 1 else cfg.events - chunk * (n_chunks - 1)
            producer = Producer(producer_config(pipe.settings, **{"linger.ms": 5}))
            _produce(pipe.settings, work, n, producer)
            producer.flush(60)
            if i == n_chunks - 1:
                break
            time.sleep(float(rng.uniform(0.0, 1.5)))  # somewhere mid-processing / mid-checkpoint
            if i == restart_at:
                pipe.restart_broker()
                report.broker_restarts += 1
            which = ("ledger", "featurizer", "both")[int(rng.integers(3))]
            pipe.kill(which)
            report.kills.append(which)
        report.events_produced = work.n
        report.adds, report.deletes = len(work.add_events), len(work.delete_events)
        audit(pipe, work, report)
    finally:
        pipe.stop()
    report.recovery_s = {k: [round(x, 3) for x in v] for k, v in pipe.recovery.items()}
    report.elapsed_s = round(time.monotonic() - t0, 1)
    return report


def render(r: Report) -> str:
    def stats(xs: list[float]) -> str:
        return f"p50 {statistics.median(xs):.2f} s, max {max(xs):.2f} s (n={len(xs)})" if xs else "-"

    lines = [
        f"chaos benchmark on {r.machine}",
        f"config: {r.config}",
        f"events produced {r.events_produced} (adds {r.adds}, deletes {r.deletes}); kills {len(r.kills)} "
        f"({dict(Counter(r.kills))}); broker restarts {r.broker_restarts}; elapsed {r.elapsed_s} s",
        "",
        "| check | count |",
        "|---|---|",
        f"| lost events | {r.lost_events} |",
        f"| doubled events | {r.doubled_events} |",
        f"| heads whose final digest differs from a from-scratch ledger | {r.digest_mismatched_heads} |",
        f"| heads whose final retained-rows hash differs from a from-scratch one | "
        f"{r.retained_hash_mismatched_heads} |",
        f"| (head, version) pairs with two digests (over {r.head_updates_seen} updates followed live, "
        f"{r.heads_generations} heads topics) | {r.versions_with_two_digests} |",
        f"| (head, version) pairs with two retained-rows hashes (head updates and receipts) | "
        f"{r.versions_with_two_retained_hashes} |",
        f"| deletes without an applied receipt | {r.receipts_missing} |",
        f"| deletes with conflicting receipts | {r.receipts_conflicting} |",
        f"| deletes with identical duplicate receipts (allowed: at-least-once) | {r.receipts_duplicated} |",
        "",
        f"recovery to readiness: ledger {stats(r.recovery_s.get('ledger', []))}; "
        f"featurizer {stats(r.recovery_s.get('featurizer', []))}; broker {stats(r.recovery_s.get('broker', []))}",
        f"verdict: {'EXACT' if r.exact else 'NOT EXACT'}",
    ]
    lines += [f"  e.g. {e}" for e in r.examples]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5k events, 6 kills (what make test runs)")
    ap.add_argument("--events", type=int)
    ap.add_argument("--kills", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--broker-restart", action="store_true",
                    help="also restart a persistent broker once (see the module docstring)")
    ap.add_argument("--json", type=Path, help="write the report as JSON here")
    ap.add_argument("--workdir", type=Path, help="keep logs and data here (default: a temp dir)")
    args = ap.parse_args(argv)
    cfg = Config(events=5_000, kills=6) if args.quick else Config()
    if args.events:
        cfg.events = args.events
    if args.kills is not None:
        cfg.kills = args.kills
    cfg.seed = args.seed
    cfg.broker_restart = args.broker_restart
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        report = run(cfg, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="unlearn-chaos-") as tmp:
            report = run(cfg, Path(tmp))
    print(render(report))
    if args.json:
        args.json.write_text(orjson.dumps(asdict(report), option=orjson.OPT_INDENT_2).decode())
    return 0 if report.exact else 1


if __name__ == "__main__":
    sys.exit(main())
