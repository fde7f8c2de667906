"""One node of the project's Apache Kafka (``infra.local.kafka``): where the pinned jars
(``make kafka``) and Java are, a node's directories and ports, formatting its storage and
starting its JVM with generated KRaft properties."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from unlearn.infra.local.tansu import BrokerError
from unlearn.infra.processes import with_pdeathsig
from unlearn.infra.settings import LocalBrokerSettings, Settings

_POM = Path(__file__).resolve().parents[1] / "kafka" / "pom.xml"
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


def new_cluster_id() -> str:
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
        # Topics are always created explicitly (runtime.topics); a typo must fail, not create.
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
