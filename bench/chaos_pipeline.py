"""The system bench.chaos faults: a run's configuration, the broker (tansu, or a Kafka cluster) and
the featurizer and ledger worker processes, each restartable. Apart from the run's orchestration
and its audit, so that what is killed, and how it is brought back, reads in one place."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.publish_clock import PublishClock
from unlearn.common.families import heads_family
from unlearn.infra.local.kafka import LocalKafka
from unlearn.infra.local.secured_kafka import SecuredLocalKafka
from unlearn.infra.local.tansu import LocalBroker
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.topic_reader import LogRecord, TopicFollower
from unlearn.runtime.topics import create_topics
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.head import decode_head

_ADMIN_PASSWORD = "admin-chaos-local-only"  # --secure: the super user every client of the run is


@dataclass
class Config:
    """A run: its load, its faults and the shape of the pipeline they hit (the CLI's flags)."""

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
