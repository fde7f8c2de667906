"""Chaos benchmark: the whole pipeline under random kill -9 and a broker restart, then an audit.

    python -m bench.chaos [--quick] [--events N] [--kills K] [--broker-restart] [--json PATH]
    python -m bench.chaos --engine kafka --nodes 3 [--node-kills 3] [--no-cluster-restart] [--secure] ...

A local broker (persistent, so that it can be restarted: ``LocalBroker(data_dir=...)``), one
featurizer and one ledger worker as child processes (the operator's ``unlearn`` commands), and a
producer of request events: adds of random feature vectors and deletes of earlier adds, spread
over several heads that share ``deltas`` partitions. While events flow, the benchmark kills -9 the
ledger, the featurizer or both at random moments (and restarts them); with ``--broker-restart``
it also restarts a persistent broker once (SIGTERM, then the same port and data dir). Then it
waits for the heads to settle and audits:

- **lost / doubled events**: the deltas log is replayed with the ledger's own admission rules
  (``delta_rules.admit`` / ``apply_entries``) to see which request events reached the ledger,
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
- **recovery**: seconds from a restart to the worker's readiness line (p50 / max), and per fault
  kind the seconds from the fault to the first new head version published after it
  (``bench.publish_clock``: n, min, p50, p90, max).

With ``--engine kafka --nodes 3`` the broker is the project's Apache Kafka (``LocalKafka``, a
persistent three-node KRaft cluster: replication factor 3, ``min.insync.replicas=2``, the ``kafka``
client profile: acks=all, idempotence). Besides the worker kills it then kill -9s a random broker
node ``--node-kills`` times while a chunk of events is being produced and processed, leaves it down
for a while (longer than the broker session timeout, so its leaderships move), starts it again from
its data dir and waits until every partition is back in full ISR; the workers are left alone
during these rounds, so that they must ride through the node's loss. Once (``--cluster-restart``,
on by default with Kafka) the whole cluster is stopped under load and started again from its data
dirs. The audit then also counts **worker restarts that no kill caused** (a worker found dead is
restarted and counted): 0 means the workers rode through every node loss and the cluster restart.
With ``--secure`` the cluster is the secured one (``SecuredLocalKafka``: SASL_SSL clients and
replication, controllers over mutual TLS, a throwaway CA kept in its data dir across restarts) and
every client of the run (workers, producer, audit) connects through an ``UNLEARN_KAFKA_PROPERTIES``
file as the super user ``admin`` (the ACL matrix is tests/infra/test_secured_kafka.py's subject).

Prints a table and, with ``--json``, writes the numbers. Exit 0 iff every correctness count is 0.

Why the broker restart is opt-in: the embedded broker's only persistent engine (tansu ``s3://``
against s3rver) was measured losing acknowledged records and reusing offsets when restarted
under load (tansu ignores SIGTERM while clients are connected, so the restart ends in SIGKILL);
the workers then stop with a stale-state error rather than skip, and the audit cannot read the
damaged topics to their end. docs/design.md, "The embedded broker", has the details.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.publish_clock import PublishClock, distribution
from unlearn.common.families import heads_family
from unlearn.features.contract import quantize_feature_row
from unlearn.infra.local.kafka import LocalKafka
from unlearn.infra.local.secured_kafka import SecuredLocalKafka
from unlearn.infra.local.tansu import LocalBroker, LocalS3Unavailable
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.ledger import ExactLedger, MultisetHash
from unlearn.runtime import clients
from unlearn.runtime.topic_reader import LogRecord, TopicFollower, read_topic
from unlearn.runtime.topics import create_topics
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.delta_codec import decode_delta
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.head import HeadUpdate, decode_head
from unlearn.schemas.receipts import decode_receipt
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.schemas.sealed import SealError
from unlearn.streams.ledger.delta_rules import admit, apply_entries, creates_head, record_applied
from unlearn.streams.ledger.row_opener import RowOpener

_ADMIN_PASSWORD = "admin-chaos-local-only"  # --secure: the super user every client of the run is


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
    engine: str = "tansu"  # or "kafka": the project's Apache Kafka (LocalKafka, persistent)
    nodes: int = 1  # Kafka nodes (3: replication factor 3, min.insync.replicas=2)
    node_kills: int = 0  # kill -9 of a random Kafka node under load, restarted after node_down_s
    node_down_s: tuple[float, float] = (10.0, 20.0)  # > broker.session.timeout.ms (6 s): leaderships move
    cluster_restart: bool = False  # stop the whole Kafka cluster under load, start it from its data dirs
    secure: bool = False  # the secured Kafka (TLS everywhere, SCRAM, ACLs); the clients as admin


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
    node_kills: list[int] = field(default_factory=list)  # Kafka node ids, in order
    cluster_restarts: int = 0
    unplanned_worker_restarts: int = 0  # workers found dead that no kill of ours explains
    node_outage_s: list[float] = field(default_factory=list)  # kill -9 -> restarted node answers
    produce_errors: int = 0  # the benchmark's own produce calls that failed, even when sent again
    produce_resent: int = 0  # of those, sent again as an at-least-once app does (same event id and content)
    loadavg: list[float] = field(default_factory=list)  # 1-minute load average at the start and the end
    timeline: list[str] = field(default_factory=list)
    recovery_s: dict[str, list[float]] = field(default_factory=dict)
    publish_after_fault_s: dict[str, list[float]] = field(default_factory=dict)  # fault kind -> seconds
    elapsed_s: float = 0.0
    examples: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not (self.lost_events or self.doubled_events or self.digest_mismatched_heads
                    or self.retained_hash_mismatched_heads or self.versions_with_two_digests
                    or self.versions_with_two_retained_hashes or self.receipts_missing or self.receipts_conflicting
                    or self.unplanned_worker_restarts)


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
        heads = HeadSettings.of(settings)
        Q = np.stack([quantize_feature_row(f, heads.frac_bits, heads.feature_bound) for f, _, _ in rows])
        return Q, np.array([lab for _, lab, _ in rows], np.int64)

    def reference_digest(self, head: str, n_outputs: int, settings: Settings) -> str:
        Q, y = self._retained(head, settings)
        heads = HeadSettings.of(settings)
        led = ExactLedger(self.cfg.dim, n_outputs, heads.frac_bits, heads.label_frac_bits)
        if len(y):
            led.add(Q, y)
        led.grow_outputs(n_outputs)
        return led.digest()

    def reference_retained_hash(self, head: str, settings: Settings) -> str:
        Q, y = self._retained(head, settings)
        heads = HeadSettings.of(settings)
        return MultisetHash.of_rows(Q, y, heads.frac_bits, heads.label_frac_bits).fingerprint()


class Pipeline:
    """Broker + featurizer + ledger, each restartable."""

    def __init__(self, root: Path, cfg: Config) -> None:
        self.root = root
        self.cfg = cfg
        self.broker: Any
        if cfg.engine == "kafka":  # always persistent: a node or the whole cluster restarts from its dirs
            self.broker = self._kafka()
        else:
            self.broker = LocalBroker(data_dir=root / "broker") if cfg.broker_restart else LocalBroker()
        self.broker.start()
        tansu_s3 = cfg.engine == "tansu" and cfg.broker_restart
        self.settings = Settings.from_env(
            bootstrap=self.broker.bootstrap, profile=cfg.engine, topic_prefix="chaos.", partitions=cfg.partitions,
            data_dir=str(root / "data"), checkpoint_every_messages=20, checkpoint_every_seconds=1.0,
            # s3:// storage answers short fetches with nothing once a partition holds many batches
            fetch_max_wait_ms=300 if tansu_s3 else None, state_rotate_bytes=cfg.rotate_bytes,
            kafka_properties=self._client_properties())
        create_topics(self.settings)
        # Every head update, as published (rotation deletes superseded generations afterwards).
        self.digests: dict[tuple[str, int], set[str]] = {}  # of the updates that carry one
        self.retained_hashes: dict[tuple[str, int], set[str | None]] = {}
        self.heads_topics: set[str] = set()
        self.head_updates = 0
        self.clock = PublishClock()  # fault -> next new head version
        self.heads_follower = TopicFollower(self.settings, heads_family(self.settings.topic_prefix),
                                            self._on_head, role="chaos-heads")
        self.featurizer = ServiceProcess("featurizer", ["featurizer", "--loglevel", "info"], self.settings, root)
        self.ledger = ServiceProcess("ledger", ["ledger", "--loglevel", "info"], self.settings, root)
        self.recovery: dict[str, list[float]] = {"featurizer": [], "ledger": [], "broker": []}
        self.chaos_starts = {"featurizer": 1, "ledger": 1}  # starts that we caused (the first, and kills)
        self.unplanned: list[str] = []  # a worker found dead, with its log's tail

    def _kafka(self) -> LocalKafka:
        if not self.cfg.secure:
            return LocalKafka(self.cfg.nodes, data_dir=self.root / "kafka")
        return SecuredLocalKafka(self.cfg.nodes, admin_password=_ADMIN_PASSWORD, data_dir=self.root / "kafka")

    def _client_properties(self) -> str:
        """The UNLEARN_KAFKA_PROPERTIES file of every client of a secured run ("" otherwise)."""
        if not self.cfg.secure:
            return ""
        path = self.root / "client.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.broker.client_config().items()
                                if k != "ssl.endpoint.identification.algorithm"))  # always on; a file may not set it
        return str(path)

    def _on_head(self, r: LogRecord) -> None:
        try:
            u = decode_head(r.value or b"")
        except CodecError:
            return
        self.head_updates += 1
        self.clock.saw(u.head_id, u.version)
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
            self.chaos_starts[p.name] += 1
        for p in procs:
            self.recovery[p.name].append(p.wait_for_log(f"unlearn {p.name} ready", timeout=120))

    def check_workers(self) -> None:
        """Restart (and remember) a worker that died although no kill of ours hit it: it did not
        ride through what the broker went through."""
        for p in (self.featurizer, self.ledger):
            if not p.alive:
                self.unplanned.append(f"{p.name} exited ({p.proc.returncode if p.proc else None}) by itself:\n"
                                      + p.log_tail(15))
                p.start()
                p.wait_for_log(f"unlearn {p.name} ready", timeout=120)

    @property
    def unplanned_restarts(self) -> int:
        """Worker starts that no kill of ours caused (0: they rode through every broker fault)."""
        return sum(p.starts - self.chaos_starts[p.name] for p in (self.featurizer, self.ledger))

    def kill_node_under_load(self, node_id: int, delay: float, produce: Any) -> float:
        """kill -9 Kafka node ``node_id`` ``delay`` seconds into ``produce()`` (the chunk's
        producer runs meanwhile), leave it down for a while with the workers running, start it
        again from its data dir and wait until every partition is in full ISR. Returns seconds
        from the kill until the node answered again (the full-ISR wait is in recovery["node_isr"])."""
        assert isinstance(self.broker, LocalKafka)
        killed = threading.Event()
        t_kill = [0.0]

        def killer() -> None:
            time.sleep(delay)
            self.broker.kill_node(node_id)  # SIGKILL and reap: no thread-bound state
            t_kill[0] = time.monotonic()
            killed.set()

        t = threading.Thread(target=killer, name="chaos-node-kill", daemon=True)
        t.start()
        produce()
        killed.wait()
        t.join()
        down = float(np.random.default_rng(self.cfg.seed + 7 + node_id + len(self.recovery.get("node", []))
                                           ).uniform(*self.cfg.node_down_s))
        while time.monotonic() - t_kill[0] < down:
            time.sleep(0.5)
            self.check_workers()
        self.broker.start_node(node_id)  # from this (the main) thread: the node dies with it
        answered = time.monotonic() - t_kill[0]
        self.recovery.setdefault("node", []).append(answered)
        t0 = time.monotonic()
        self.wait_full_isr()
        self.recovery.setdefault("node_isr", []).append(time.monotonic() - t0)
        return answered

    def wait_full_isr(self, timeout: float = 300.0) -> None:
        """Until every partition of every topic has all the cluster's nodes in its ISR."""

        admin = clients.admin(self.settings)
        deadline = time.monotonic() + timeout
        while True:
            short = []
            with contextlib.suppress(Exception):
                md = admin.list_topics(timeout=10)
                short = [f"{t}/{p}" for t, tm in md.topics.items() for p, pm in tm.partitions.items()
                         if len(pm.isrs) < self.cfg.nodes]
                if not short:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"partitions not back in full ISR after {timeout:g}s: {short[:5]}")
            time.sleep(0.5)
            self.check_workers()

    def restart_cluster(self) -> float:
        """Stop every Kafka node (SIGTERM: a controlled shutdown, while the workers run) and start
        the cluster again from its data dirs; seconds from the stop to every node answering."""
        t0 = time.monotonic()
        self.broker.stop()
        self.broker = self._kafka()
        self.broker.start()
        took = time.monotonic() - t0
        self.recovery["broker"].append(took)
        t1 = time.monotonic()
        self.wait_full_isr()
        self.recovery.setdefault("cluster_isr", []).append(time.monotonic() - t1)
        return took

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


def _probe(pipe: Pipeline, work: Workload, producer: Any) -> float:
    """One more event (an audited one) once a fault is over for the harness, so that the pipeline
    has something to publish: the clock then measures recovery, not the gap until the next chunk.
    Returns when it was sent."""
    sent = time.monotonic()
    _produce(pipe.settings, work, 1, producer)
    producer.flush(300)
    return sent


def _schedule(cfg: Config) -> list[str]:
    """What happens after each chunk of events but the last: "worker" (kill -9 of the ledger, the
    featurizer or both), "node" (kill -9 of a Kafka node during the chunk), "cluster" (restart of
    the whole Kafka cluster). Worker kills only when there are no broker faults (the tansu run's
    sequence); else the broker faults are spread over the run, none first or last."""
    actions = ["worker"] * cfg.kills
    faults = ["node"] * cfg.node_kills + (["cluster"] if cfg.cluster_restart else [])
    if not faults:
        return actions
    rng = np.random.default_rng(cfg.seed + 2)
    rng.shuffle(faults)
    n = len(actions) + len(faults)
    slots = sorted({round((j + 1) * n / (len(faults) + 1)) for j in range(len(faults))})
    out = []
    for i in range(n):
        if i in slots and faults:
            out.append(faults.pop())
        else:
            out.append(actions.pop() if actions else faults.pop())
    return out

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

    report = Report(asdict(cfg), f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, "
                                 f"python {platform.python_version()}")
    rng = np.random.default_rng(cfg.seed + 1)
    faults = np.random.default_rng(cfg.seed + 3)  # which node, when: apart from rng (the tansu run's sequence)
    t0 = time.monotonic()
    report.loadavg.append(round(os.getloadavg()[0], 2))
    try:
        pipe = Pipeline(root, cfg)
    except LocalS3Unavailable as exc:
        print(f"persistent broker unavailable ({exc}); running without the broker restart", file=sys.stderr)
        cfg.broker_restart = False
        report.config["broker_restart"] = False
        pipe = Pipeline(root, cfg)
    work = Workload(cfg)

    def note(what: str) -> None:
        report.timeline.append(f"{time.monotonic() - t0:7.1f} s  {what}")
        print(report.timeline[-1], file=sys.stderr, flush=True)

    failed: list[tuple[bytes, bytes]] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            report.produce_errors += 1
            failed.append((msg.key(), msg.value()))

    def resend_failed() -> None:
        """Send again what a fault made fail, as an at-least-once app does: the same event (id and
        content), so a copy that did land is a duplicate to the featurizer (docs/featurizer.md,
        "Event ids"), never a second application; a fresh producer, the faulted one may be stuck."""
        for _ in range(5):
            if not failed:
                return
            again, failed[:] = list(failed), []
            retry = clients.producer(pipe.settings, **{"on_delivery": on_delivery})
            for key, value in again:
                retry.produce(pipe.settings.topic("requests"), key=key, value=value)
            report.produce_resent += len(again)
            retry.flush(120)

    try:
        pipe.start_workers()
        actions = _schedule(cfg)
        n_chunks = len(actions) + 1
        chunk = max(1, cfg.events // n_chunks)
        restart_at = n_chunks // 2 if cfg.broker_restart and cfg.engine == "tansu" else -1
        for i in range(n_chunks):
            n = chunk if i < n_chunks - 1 else cfg.events - work.n  # the probes (_probe) included
            producer = clients.producer(pipe.settings, **{"linger.ms": 5, "on_delivery": on_delivery})

            def produce(n: int = n, producer: Any = producer) -> None:
                _produce(pipe.settings, work, n, producer)
                left = producer.flush(300)  # retries until message.timeout.ms; a fault only delays
                report.produce_errors += left
                resend_failed()

            action = actions[i] if i < len(actions) else None
            if action == "node":
                node = int(faults.integers(1, cfg.nodes + 1))
                delay = float(faults.uniform(0.0, 0.5))
                note(f"chunk {i}: {n} events; kill -9 Kafka node {node} {delay:.2f} s into the chunk")
                t_fault = time.monotonic() + delay  # the killer thread's moment, within a few ms
                answered = pipe.kill_node_under_load(node, delay, produce)
                pipe.clock.record("kafka node kill -9", t_fault)
                report.node_kills.append(node)
                report.node_outage_s.append(round(answered, 2))
                note(f"node {node} restarted, answering {answered:.1f} s after the kill; full ISR after "
                     f"{pipe.recovery['node_isr'][-1]:.1f} s more")
                pipe.check_workers()
                continue
            produce()
            if i == n_chunks - 1:
                break
            time.sleep(float(rng.uniform(0.0, 1.5)))  # somewhere mid-processing / mid-checkpoint
            t_fault = time.monotonic()
            if i == restart_at:
                pipe.restart_broker()
                report.broker_restarts += 1
                pipe.clock.record("broker restart", t_fault, _probe(pipe, work, producer))
                t_fault = time.monotonic()
            if action == "cluster":
                note(f"chunk {i}: {n} events; stop the whole cluster, start it from its data dirs")
                took = pipe.restart_cluster()
                pipe.clock.record("cluster restart" if cfg.nodes > 1 else "broker restart (one node)", t_fault,
                                  _probe(pipe, work, producer))
                resend_failed()
                report.cluster_restarts += 1
                note(f"cluster answering {took:.1f} s after the stop; full ISR after "
                     f"{pipe.recovery['cluster_isr'][-1]:.1f} s more")
            else:
                which = ("ledger", "featurizer", "both")[int(rng.integers(3))]
                pipe.kill(which)
                pipe.clock.record(f"kill -9 {which}", t_fault, _probe(pipe, work, producer))
                report.kills.append(which)
                note(f"chunk {i}: {n} events; kill -9 {which}")
            pipe.check_workers()
        resend_failed()
        report.events_produced = work.n
        report.adds, report.deletes = len(work.add_events), len(work.delete_events)
        note("all produced; settling and auditing")
        audit(pipe, work, report)
        pipe.check_workers()
        note("audit done")
    finally:
        report.unplanned_worker_restarts = pipe.unplanned_restarts
        report.examples += [u[:2000] for u in pipe.unplanned[:3]]
        pipe.stop()
    report.recovery_s = {k: [round(x, 3) for x in v] for k, v in pipe.recovery.items()}
    report.publish_after_fault_s = dict(pipe.clock.after_fault)
    report.elapsed_s = round(time.monotonic() - t0, 1)
    report.loadavg.append(round(os.getloadavg()[0], 2))
    return report


def render(r: Report) -> str:
    def stats(xs: list[float]) -> str:
        return f"p50 {statistics.median(xs):.2f} s, max {max(xs):.2f} s (n={len(xs)})" if xs else "-"

    lines = [
        f"chaos benchmark on {r.machine}",
        f"config: {r.config}",
        f"events produced {r.events_produced} (adds {r.adds}, deletes {r.deletes}); kills {len(r.kills)} "
        f"({dict(Counter(r.kills))}); broker restarts {r.broker_restarts}; elapsed {r.elapsed_s} s"
        + (f"; load average {r.loadavg[0]} -> {r.loadavg[-1]}" if r.loadavg else ""),
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
        f"| worker restarts no kill caused (a worker that did not ride through a broker fault) | "
        f"{r.unplanned_worker_restarts} |",
        f"| the benchmark's own produce calls that failed (sent again: {r.produce_resent}) | {r.produce_errors} |",
        "",
        f"recovery to readiness: ledger {stats(r.recovery_s.get('ledger', []))}; "
        f"featurizer {stats(r.recovery_s.get('featurizer', []))}; broker {stats(r.recovery_s.get('broker', []))}",
        "fault -> first new head version published (s): " + "; ".join(
            f"{kind} {distribution(xs)}" for kind, xs in sorted(r.publish_after_fault_s.items())),
        f"verdict: {'EXACT' if r.exact else 'NOT EXACT'}",
    ]
    if r.node_kills or r.cluster_restarts:
        lines[3:3] = [f"Kafka node kills {len(r.node_kills)} (nodes {r.node_kills}); cluster restarts "
                      f"{r.cluster_restarts}"]
        lines[-1:-1] = [
            f"Kafka node kill -9 -> restarted node answering: {stats(r.node_outage_s)}; then every partition "
            f"back in full ISR: {stats(r.recovery_s.get('node_isr', []))}",
            f"whole cluster stop -> every node answering: {stats(r.recovery_s.get('broker', []))}; then full ISR: "
            f"{stats(r.recovery_s.get('cluster_isr', []))}"]
    if r.timeline:
        lines += ["", "timeline (s from the start):"] + [f"  {t}" for t in r.timeline]
    lines += [f"  e.g. {e}" for e in r.examples]
    return "\n".join(lines)


def _keep_logs(root: Path) -> Path:
    """The ``*.log`` files of a run's temporary directory (workers', Kafka nodes'), copied to a new
    directory that outlives it: a run that is not exact is worth reading (without ``--workdir``,
    everything else goes with the temporary directory)."""
    kept = Path(tempfile.mkdtemp(prefix="unlearn-chaos-logs-"))
    for log in root.rglob("*.log"):
        if log.is_file() and "data" not in log.relative_to(root).parts[:-1]:
            dest = kept / log.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(log, dest)
    return kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5k events, 6 kills (what make test runs)")
    ap.add_argument("--events", type=int)
    ap.add_argument("--kills", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--broker-restart", action="store_true",
                    help="also restart a persistent broker once (see the module docstring)")
    ap.add_argument("--engine", choices=("tansu", "kafka"), default="tansu",
                    help="the broker: the embedded tansu, or the project's Apache Kafka (make kafka)")
    ap.add_argument("--nodes", type=int, default=1, help="Kafka nodes (3: replication factor 3, min ISR 2)")
    ap.add_argument("--node-kills", type=int,
                    help="kill -9 of a random Kafka node under load, restarted later (default: 3 with 3+ nodes)")
    ap.add_argument("--cluster-restart", action=argparse.BooleanOptionalAction, default=None,
                    help="stop the whole Kafka cluster once under load and start it from its data dirs "
                         "(default: on with --engine kafka)")
    ap.add_argument("--secure", action="store_true",
                    help="kafka only: the secured cluster (SASL_SSL, mutual TLS controllers, a throwaway CA); "
                    "every client through an UNLEARN_KAFKA_PROPERTIES file, as admin")
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
    if args.engine == "tansu" and (args.nodes != 1 or args.node_kills or args.cluster_restart):
        ap.error("--nodes, --node-kills and --cluster-restart need --engine kafka")
    if args.engine == "kafka" and args.broker_restart:
        ap.error("--broker-restart is tansu's; with Kafka use --node-kills / --cluster-restart")
    if args.secure and args.engine != "kafka":
        ap.error("--secure needs --engine kafka")
    cfg.engine, cfg.nodes, cfg.secure = args.engine, args.nodes, args.secure
    cfg.node_kills = args.node_kills if args.node_kills is not None else (3 if args.nodes >= 3 else 0)
    if cfg.node_kills and cfg.nodes < 3:
        ap.error("--node-kills needs --nodes 3 or more (one node down must leave min.insync.replicas=2)")
    cfg.cluster_restart = args.engine == "kafka" if args.cluster_restart is None else args.cluster_restart
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        report = run(cfg, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="unlearn-chaos-") as tmp:
            report = run(cfg, Path(tmp))
            if not report.exact:
                kept = _keep_logs(Path(tmp))
                print(f"not exact: the workers' and nodes' logs are kept in {kept}", file=sys.stderr)
    print(render(report))
    if args.json:
        args.json.write_text(orjson.dumps(asdict(report), option=orjson.OPT_INDENT_2).decode())
    return 0 if report.exact else 1


if __name__ == "__main__":
    sys.exit(main())
