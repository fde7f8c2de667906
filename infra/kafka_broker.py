"""Apache Kafka run by the project: a 1- or N-node KRaft cluster on loopback.

The engine users deploy, for the tests, CI and ``unlearn broker --engine kafka``: the jars pinned by
``infra/kafka/pom.xml`` (``make kafka`` resolves them into ``.cache/kafka/<version>/lib`` and checks
their sha256), run with the machine's Java 17+, no ZooKeeper, no Docker. Every node is combined
(``process.roles=broker,controller``) and every node votes in the controller quorum, so three nodes
survive the loss of one (replication factor 3, ``min.insync.replicas=2``).

What the scripts of a Kafka distribution do, done here: each node's directory is formatted once
(``kafka.tools.StorageTool format``, the class behind ``kafka-storage.sh``), then ``kafka.Kafka``
(behind ``kafka-server-start.sh``) runs with a generated ``server.properties``. Readiness is a real
metadata request listing every node (``infra.broker.wait_for_broker``). Each node logs to
``<dir>/node-<id>/kafka.log``. Nodes never outlive us: explicit stop, context manager, finalizer,
atexit and a parent-death signal, as for tansu (``infra.broker``).

A ``data_dir`` makes the cluster persistent: its id and ports are kept in ``data_dir/cluster.json``
and the logs of every node under ``data_dir/node-<id>``, so a cluster (or one node, after a kill -9)
started again on the same directory has every topic, record and committed offset. Without one the
cluster lives in a temporary directory whose data is deleted on stop (the logs stay for diagnosis).
docs/design.md, "The embedded broker", has the measured start time and memory.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from unlearn.infra.broker import BrokerError, free_port, port_is_free, wait_for_broker
from unlearn.infra.local_s3 import DataDirInUse, DataDirLock
from unlearn.infra.processes import terminate, with_pdeathsig
from unlearn.infra.settings import LocalBrokerSettings, Settings

__all__ = [
    "JavaNotFound",
    "KafkaJarsMissing",
    "KafkaJvm",
    "KafkaNode",
    "LocalKafka",
    "find_java",
    "find_kafka_jars",
    "kafka_version",
    "kraft_properties",
]

_POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"
_CHECKOUT = _POM.parent.parent.parent
_MAKE_HINT = "run `make kafka` in the checkout (resolves the pinned jars from Maven Central)"

#: JVM flags of kafka-run-class.sh (the heap is set apart), plus C1-only JIT: three nodes start in
#: ~6 s instead of ~9 s on 2 cores, with no throughput difference measurable above the noise here
#: (1 KB records, librdkafka clients on the same cores). ``jvm_flags=("-XX:TieredStopAtLevel=4",)``
#: restores the full JIT (the last flag wins), e.g. to measure the broker's own ceiling.
_JVM_FLAGS = ("-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
              "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true", "-XX:TieredStopAtLevel=1")
#: The logging backend (slf4j-simple, in the pom) writes to stderr, which goes to the node's log.
#: Left out below warn: config dumps (hundreds of lines per client the broker starts) and the
#: per-partition storage lines (a test session creates thousands of partitions: ~40% of the log).
_QUIET = ("org.apache.kafka.common.config.AbstractConfig", "org.apache.kafka.common.utils.AppInfoParser",
          "org.apache.kafka.storage.internals.log", "state.change.logger", "kafka.cluster.Partition")
_LOG_FLAGS = ("-Dorg.slf4j.simpleLogger.showDateTime=true",
              "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
              *(f"-Dorg.slf4j.simpleLogger.log.{name}=warn" for name in _QUIET))


class KafkaJarsMissing(BrokerError):
    """The Apache Kafka jars are not in the cache (``make kafka`` was not run)."""


class JavaNotFound(BrokerError):
    """No ``java`` to run the broker with (JAVA_HOME or PATH)."""


def kafka_version() -> str:
    """The pinned Apache Kafka version (``<kafka.version>`` of infra/kafka/pom.xml)."""
    try:
        found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", _POM.read_text())
    except OSError:
        found = None
    if found is None:
        raise KafkaJarsMissing(f"no <kafka.version> in {_POM}: set UNLEARN_KAFKA_JARS to a folder of "
                               "Apache Kafka broker jars, or run from a checkout")
    return found.group(1)


def find_kafka_jars(settings: Settings | None = None) -> Path:
    """The folder of broker jars: ``UNLEARN_KAFKA_JARS``, else the verified cache of ``make kafka``."""
    settings = settings or Settings.from_env()
    jars = LocalBrokerSettings.of(settings).kafka_jars
    if jars:
        lib = Path(jars)
        if not any(lib.glob("kafka_2.13-*.jar")):
            raise KafkaJarsMissing(f"UNLEARN_KAFKA_JARS={jars!r} holds no kafka_2.13-*.jar")
        return lib
    version = kafka_version()
    cache = _CHECKOUT / ".cache" / "kafka" / version
    stamp = cache / ".verified"
    if not stamp.is_file() or stamp.read_text().strip() != version:
        raise KafkaJarsMissing(f"the Apache Kafka {version} jars are not in {cache / 'lib'} (or not verified): "
                               + _MAKE_HINT)
    return cache / "lib"


def find_java() -> str:
    """``$JAVA_HOME/bin/java`` if JAVA_HOME is set (as kafka-run-class.sh), else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={home!r} has no bin/java" if home else "'java' is not on PATH"
        raise JavaNotFound(f"no Java runtime for Apache Kafka ({where}): install Java 17+ "
                           "(Debian: apt-get install openjdk-17-jre-headless), or use --engine tansu")
    return java


def _cluster_id() -> str:
    """A Kafka Uuid as ``kafka-storage.sh random-uuid`` prints it (URL-safe base64, no leading '-')."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


@dataclass
class KafkaNode:
    """One combined broker+controller process of a LocalKafka."""

    node_id: int
    port: int
    controller_port: int
    dir: Path
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        """``host:port`` of this node's client listener."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The node's JVM process id (None when not started)."""
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def log_path(self) -> Path:
        """Where the node logs (appended across restarts)."""
        return self.dir / "kafka.log"

    @property
    def data_path(self) -> Path:
        """The node's ``log.dirs`` (and KRaft metadata log)."""
        return self.dir / "data"

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the node's log, for error messages."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"


@dataclass(frozen=True)
class KafkaJvm:
    """How a node's JVM runs: ``java``, the broker ``jars``, each node's fixed heap and extra
    flags (after the defaults), and whether Linux kills a node with the thread that started it."""

    java: str
    jars: Path
    heap_mb: int
    jvm_flags: tuple[str, ...] = ()
    die_with_parent: bool = True

    def command(self, main: str, *args: str, heap_mb: int) -> list[str]:
        """``java ... -cp <jars>/* main args`` with the project's flags and a ``heap_mb`` heap."""
        return [self.java, f"-Xms{heap_mb}m", f"-Xmx{heap_mb}m", *_JVM_FLAGS, *self.jvm_flags, *_LOG_FLAGS,
                "-cp", str(self.jars / "*"), main, *args]

    def format(self, nodes: list[KafkaNode], cluster_id: str, extra_args: list[str], timeout: float) -> None:
        """``kafka-storage.sh format -t <cluster id> -c server.properties`` for each new node, all
        at once (static quorum: no --standalone / --initial-controllers)."""
        running = []
        for n in nodes:
            cmd = self.command("kafka.tools.StorageTool", "format", "-t", cluster_id,
                               "-c", str(n.dir / "server.properties"), *extra_args, heap_mb=128)
            with open(n.log_path, "ab") as log:
                running.append((n, subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                                    stderr=subprocess.STDOUT)))
        failed = []
        for n, proc in running:
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            if rc != 0:
                failed.append(f"formatting node {n.node_id} ({n.data_path}) failed:\n{n.log_tail(3000)}")
        if failed:
            raise BrokerError("\n".join(failed))

    def spawn(self, node: KafkaNode) -> None:
        """Start ``kafka.Kafka`` on the node's server.properties, logging to its log."""
        cmd = with_pdeathsig(self.command("kafka.Kafka", str(node.dir / "server.properties"), heap_mb=self.heap_mb),
                             self.die_with_parent)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "JAVA_TOOL_OPTIONS"))}
        with open(node.log_path, "ab") as log:
            log.write(f"--- unlearn: starting Kafka node {node.node_id} on {node.bootstrap} at "
                      f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
            log.flush()
            node.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, cwd=node.dir, start_new_session=True)


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


def kraft_properties(node: KafkaNode, nodes: list[KafkaNode]) -> dict[str, str]:
    """The ``server.properties`` of ``node``, a combined KRaft node of the cluster ``nodes``
    (docs/design.md, "The embedded broker")."""
    n = len(nodes)
    min_isr = str(2 if n >= 3 else 1)
    voters = ",".join(f"{x.node_id}@{node.host}:{x.controller_port}" for x in nodes)
    conf = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "listeners": f"PLAINTEXT://{node.host}:{node.port},CONTROLLER://{node.host}:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{node.host}:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.quorum.voters": voters,  # a static quorum of every node
        "log.dirs": str(node.data_path),
        # Replication: every node holds every partition; acks=all survives one node's loss.
        "default.replication.factor": str(n),
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": str(n),
        "transaction.state.log.replication.factor": str(n),
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": str(n),
        "share.coordinator.state.topic.min.isr": min_isr,
        # Topics are always created explicitly (infra.topics); a typo must fail, not create.
        "auto.create.topics.enable": "false",
        # Tests join groups all the time: no 3 s wait for more members.
        "group.initial.rebalance.delay.ms": "0",
        # A killed node is fenced (its leaderships move) after 6 s instead of 9.
        "broker.session.timeout.ms": "6000",
        "broker.heartbeat.interval.ms": "1000",
        # Deleted topics (every test deletes its own) leave the disk after 1 s, not 60.
        "file.delete.delay.ms": "1000",
        # Sized for a 2-core box and a small heap (defaults: 3 network, 8 io, 128 MB dedupe).
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    }
    return conf


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
        self.cluster_id = str(state.get("cluster_id") or _cluster_id())
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
        user with ``--add-scram``: infra/secure_kafka.py)."""
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

