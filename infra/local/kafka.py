"""Apache Kafka run by the project: a 1- or N-node KRaft cluster on loopback.

The engine users deploy, for the tests, CI and ``unlearn broker --engine kafka``: the jars pinned by
``infra/kafka/pom.xml`` (``make kafka`` resolves them into ``.cache/kafka/<version>/lib`` and checks
their sha256), run with the machine's Java 17+, no ZooKeeper, no Docker. Every node is combined
(``process.roles=broker,controller``) and every node votes in the controller quorum, so three nodes
survive the loss of one (replication factor 3, ``min.insync.replicas=2``).

What the scripts of a Kafka distribution do, done here: each node's directory is formatted once
(``kafka.tools.StorageTool format``, the class behind ``kafka-storage.sh``), then ``kafka.Kafka``
(behind ``kafka-server-start.sh``) runs with a generated ``server.properties``. Readiness is a real
metadata request listing every node (``infra.local.tansu.wait_for_broker``). Each node logs to
``<dir>/node-<id>/kafka.log``. Nodes never outlive us: explicit stop, context manager, finalizer,
atexit and a parent-death signal, as for tansu (``infra.local.tansu``).

A ``data_dir`` makes the cluster persistent: its id and ports are kept in ``data_dir/cluster.json``
and the logs of every node under ``data_dir/node-<id>``, so a cluster (or one node, after a kill -9)
started again on the same directory has every topic, record and committed offset. Without one the
cluster lives in a temporary directory whose data is deleted on stop (the logs stay for diagnosis).
docs/design.md, "The embedded broker", has the measured start time and memory.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType

from unlearn.infra.local.kafka_jvm import (
    KafkaJvm,
    KafkaNode,
    find_java,
    find_kafka_jars,
    kafka_version,
    kraft_properties,
    new_cluster_id,
)
from unlearn.infra.local.s3 import DataDirInUse, DataDirLock
from unlearn.infra.local.tansu import BrokerError, free_port, port_is_free, wait_for_broker
from unlearn.infra.processes import terminate
from unlearn.infra.settings import Settings

__all__ = ["LocalKafka"]

def _pick_port(host: str, wanted: int | None, taken: set[int], *, fixed: bool) -> int:
    """``wanted`` if given and free; else, when ``wanted`` is ``fixed`` (asked for, or kept in a
    data dir: a client port), an error; else (a controller port, internal only) a free one."""
    if wanted is not None and wanted not in taken and port_is_free(host, wanted):
        taken.add(wanted)
        return wanted
    if wanted is not None and fixed:
        raise BrokerError(f"port {host}:{wanted} is already in use")
    while (port := free_port(host)) in taken:
        pass
    taken.add(port)
    return port


# Every started cluster, so atexit can stop the ones their owners forgot.
_LIVE: weakref.WeakSet[LocalKafka] = weakref.WeakSet()


def _stop_all_live() -> None:
    for cluster in list(_LIVE):
        cluster.stop()


atexit.register(_stop_all_live)


def _stop_procs(procs: list[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM every process at once (a combined node waits for the quorum while it shuts down,
    so one by one the last would hang), then SIGKILL what is left after ``grace`` seconds."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in live:
        terminate(p, max(0.0, deadline - time.monotonic()) + 0.01)


def _kill_procs(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


class LocalKafka:
    """An Apache Kafka cluster of ``nodes`` combined KRaft nodes on ``host``.

    ``port`` fixes the client ports (node i listens on ``port + i - 1``); else they are picked
    free, or reused from ``data_dir``. ``bootstrap`` lists every node; ``nodes[i]`` exposes each
    node's pid, port and log so a test can ``kill_node`` and ``start_node`` one. ``heap_mb`` is each
    JVM's fixed heap; ``jvm_flags`` come after the defaults; ``broker_config`` adds to or overrides
    ``server_properties``. ``die_with_parent``: Linux SIGKILLs the nodes when the thread that
    started them dies (start from a long-lived thread).
    """

    def __init__(
        self,
        nodes: int = 1,
        *,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        settings: Settings | None = None,
        host: str = "127.0.0.1",
        heap_mb: int = 512,
        die_with_parent: bool = True,
        broker_config: dict[str, str] | None = None,
        jvm_flags: tuple[str, ...] = (),
    ) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        self.settings = settings or Settings.from_env()
        self.node_count = nodes
        self.host = host
        self._requested_port = port
        self.data_dir: Path | None = Path(data_dir).resolve() if data_dir is not None else None
        self.heap_mb = heap_mb
        self._die_with_parent = die_with_parent
        self._broker_config = dict(broker_config or {})
        self._jvm_flags = tuple(jvm_flags)
        self.nodes: list[KafkaNode] = []
        self.cluster_id = ""
        self._root: Path | None = None
        self._jvm: KafkaJvm | None = None
        self._dir_lock: DataDirLock | None = None
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- addresses
    @property
    def bootstrap(self) -> str:
        """Every node's ``host:port``, comma-separated (``bootstrap.servers``)."""
        if not self.nodes or not any(n.running for n in self.nodes):
            raise BrokerError("LocalKafka is not started")
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def running(self) -> bool:
        """True while every node is alive."""
        return bool(self.nodes) and all(n.running for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        """The node with this id (ids are 1..nodes)."""
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"no node {node_id} (nodes are 1..{self.node_count})")

    @property
    def start_timeout(self) -> float:
        """Seconds a start may take: a JVM on a busy 2-core box needs more than tansu."""
        return 90.0

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> LocalKafka:
        """Format what is new, start every node, and block until each answers a metadata request
        that lists all of them."""
        with self._lock:
            if self.nodes and any(n.proc is not None for n in self.nodes):
                return self
            self._jvm = KafkaJvm(find_java(), find_kafka_jars(self.settings), self.heap_mb, self._jvm_flags,
                                 self._die_with_parent)
            # Ports picked free can be taken by someone else before the JVM binds them: a lost
            # race is worth another try with new ports (fixed or persisted ports are not).
            attempts = 3 if self._requested_port is None and self.data_dir is None else 1
            for attempt in range(attempts):
                try:
                    self._prepare()
                    for n in self.nodes:
                        self._spawn(n)
                    deadline = time.monotonic() + self.start_timeout
                    for n in self.nodes:
                        self._wait(n, deadline)
                    return self
                except BaseException as exc:
                    logs = "".join(f"\n--- node {n.node_id} log ({n.log_path}) ---\n{n.log_tail()}"
                                   for n in self.nodes)
                    lost_port = any("Address already in use" in n.log_tail(1 << 20) for n in self.nodes)
                    self._shutdown(kill=True)
                    if not isinstance(exc, BrokerError):
                        raise
                    if attempt + 1 < attempts and lost_port:
                        continue
                    raise BrokerError(f"{exc}{logs}") from None
            raise AssertionError("unreachable")

    def _prepare(self) -> None:
        """Lock the directory, load or create the cluster's id and ports, write each node's
        server.properties and format the nodes that are new."""
        if self.data_dir is not None:
            self._root = self.data_dir
            self._root.mkdir(parents=True, exist_ok=True)
            self._dir_lock = DataDirLock(self._root)
            try:
                self._dir_lock.acquire()
            except DataDirInUse as exc:
                self._dir_lock = None
                raise BrokerError(str(exc)) from None
        else:
            self._root = Path(tempfile.mkdtemp(prefix="unlearn-kafka-"))
        state_path = self._root / "cluster.json"
        state: dict[str, object] = json.loads(state_path.read_text()) if state_path.exists() else {}
        if state and state.get("nodes") != self.node_count:
            raise BrokerError(f"{self._root} holds a {state.get('nodes')}-node cluster, not {self.node_count}: "
                              "start it with that many nodes, or use another directory")
        self.cluster_id = str(state.get("cluster_id") or new_cluster_id())
        saved = state.get("ports") or []
        assert isinstance(saved, list)
        self.nodes = []
        taken: set[int] = set()
        fixed = self._requested_port is not None or self.data_dir is not None
        for i in range(self.node_count):
            port = _pick_port(self.host, self._requested_port + i if self._requested_port is not None
                              else (saved[i][0] if i < len(saved) else None), taken, fixed=fixed)
            cport = _pick_port(self.host, saved[i][1] if i < len(saved) else None, taken, fixed=False)
            self.nodes.append(KafkaNode(i + 1, port, cport, self._root / f"node-{i + 1}", self.host))
        state = {"cluster_id": self.cluster_id, "nodes": self.node_count,
                 "ports": [[n.port, n.controller_port] for n in self.nodes], "kafka": kafka_version()}
        state_path.write_text(json.dumps(state, indent=1) + "\n")
        for n in self.nodes:
            n.dir.mkdir(parents=True, exist_ok=True)
            (n.dir / "server.properties").write_text(
                "".join(f"{k}={v}\n" for k, v in self.server_properties(n).items()))
        assert self._jvm is not None
        self._jvm.format([n for n in self.nodes if not (n.data_path / "meta.properties").exists()], self.cluster_id,
                         self.format_args(), self.start_timeout)
        self._set_finalizer()
        _LIVE.add(self)

    def server_properties(self, node: KafkaNode) -> dict[str, str]:
        """The broker settings of one node (``kraft_properties``) with ``broker_config`` over them."""
        conf = kraft_properties(node, self.nodes)
        conf.update(self._broker_config)
        return conf

    def format_args(self) -> list[str]:
        """Extra ``kafka-storage format`` arguments (none; a secured cluster adds its first SCRAM
        user with ``--add-scram``: infra/local/secured_kafka.py)."""
        return []

    def client_config(self) -> dict[str, str]:
        """What a client needs besides ``bootstrap.servers`` (nothing: plaintext, no authentication;
        a secured cluster returns its super user's SASL settings)."""
        return {}

    def _spawn(self, node: KafkaNode) -> None:
        assert self._jvm is not None
        self._jvm.spawn(node)
        self._set_finalizer()

    def _wait(self, node: KafkaNode, deadline: float) -> None:
        """Until ``node`` answers a metadata request that lists every node of the cluster."""
        remaining = max(0.1, deadline - time.monotonic())
        wait_for_broker(node.bootstrap, remaining, lambda: node.running, brokers=self.node_count,
                        config=self.client_config())

    def _set_finalizer(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        procs = [n.proc for n in self.nodes if n.proc is not None]
        self._finalizer = weakref.finalize(self, _kill_procs, procs)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node and reap it (crash tests); its directory stays for ``start_node``."""
        with self._lock:
            n = self.node(node_id)
            if n.proc is not None:
                _kill_procs([n.proc])
            n.proc = None

    def stop_node(self, node_id: int) -> None:
        """Stop one node gracefully (SIGTERM: a controlled shutdown), SIGKILL after the grace."""
        with self._lock:
            n = self.node(node_id)
            if n.proc is not None:
                _stop_procs([n.proc], 10.0)
            n.proc = None

    def start_node(self, node_id: int, wait: bool = True) -> KafkaNode:
        """Start a stopped or killed node again from its directory; with ``wait``, block until it
        answers and has registered with the quorum again."""
        with self._lock:
            n = self.node(node_id)
            if n.running:
                return n
            self._spawn(n)
        if wait:
            try:
                self._wait(n, time.monotonic() + self.start_timeout)
            except BrokerError as exc:
                raise BrokerError(f"{exc}\n--- node {node_id} log ({n.log_path}) ---\n{n.log_tail()}") from None
        return n

    def _shutdown(self, *, kill: bool) -> None:
        procs = [n.proc for n in self.nodes if n.proc is not None]
        if kill:
            _kill_procs(procs)
        else:
            _stop_procs(procs, 10.0)
        for n in self.nodes:
            n.proc = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None
        if self.data_dir is None and self._root is not None:
            for n in self.nodes:  # the data goes; the logs stay for diagnosis
                shutil.rmtree(n.data_path, ignore_errors=True)
        _LIVE.discard(self)

    def stop(self) -> None:
        """Stop every node. A persistent cluster shuts down cleanly (SIGTERM, SIGKILL after the
        grace); a temporary one is SIGKILLed at once (its data is deleted anyway). Idempotent."""
        with self._lock:
            self._shutdown(kill=self.data_dir is None)

    def kill(self) -> None:
        """SIGKILL every node at once (a crash of the whole cluster)."""
        with self._lock:
            self._shutdown(kill=True)

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {self.bootstrap}" if self.running else "stopped"
        data = f" data_dir={self.data_dir}" if self.data_dir is not None else ""
        return f"<LocalKafka nodes={self.node_count} {state}{data}>"

