"""Kafka Connect standalone running the Debezium PostgreSQL connector for one table (docs/cdc.md).

Why standalone: one table feeds one head through one connector task, and `unlearn cdc` is the
process an operator runs and restarts; standalone keeps the source offsets (the LSN Debezium has
handed to Kafka) in a local file beside the command's state, needs no three internal topics and no
group rebalances, and dies with its parent (``PR_SET_PDEATHSIG``). Distributed mode would buy
failover of tasks across workers, which a single-table feed does not need: a restarted
`unlearn cdc` resumes from the same offsets file and the replication slot.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from unlearn.infra.java_security import connect_security, write_private_properties
from unlearn.infra.local.kafka_jvm import find_java
from unlearn.infra.processes import terminate, with_pdeathsig
from unlearn.infra.settings import Settings, security_config

__all__ = ["ConnectJarsMissing", "ConnectProcess", "PgTarget", "connector_config", "find_connect_jars",
           "worker_config"]

log = logging.getLogger("unlearn.cdc")

_POM = Path(__file__).resolve().parent.parent.parent / "infra" / "connect" / "pom.xml"
_LOG_FLAGS = ("-Dorg.slf4j.simpleLogger.showDateTime=true",
              "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.common.config.AbstractConfig=warn",
              "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients=warn",
              "-Dorg.slf4j.simpleLogger.log.org.reflections=error")


class ConnectJarsMissing(RuntimeError):
    """The Connect + Debezium jars are not in the cache (``make connect`` was not run)."""


def find_connect_jars(configured: str = "") -> Path:
    """``UNLEARN_CONNECT_JARS``, else the verified cache of ``make connect``."""
    if configured:
        lib = Path(configured)
        if not any(lib.glob("debezium-connector-postgres-*.jar")):
            raise ConnectJarsMissing(f"UNLEARN_CONNECT_JARS={configured!r} holds no debezium-connector-postgres jar")
        return lib
    pom = _POM.read_text() if _POM.is_file() else ""
    kafka = re.search(r"<kafka\.version>([^<]+)<", pom)
    debezium = re.search(r"<debezium\.version>([^<]+)<", pom)
    if not kafka or not debezium:
        raise ConnectJarsMissing(f"no versions in {_POM}: set UNLEARN_CONNECT_JARS or run from a checkout")
    version = f"{kafka.group(1)}-{debezium.group(1)}"
    cache = _POM.parent.parent.parent / ".cache" / "connect" / version
    stamp = cache / ".verified"
    if not stamp.is_file() or stamp.read_text().strip() != version:
        raise ConnectJarsMissing(f"the Kafka Connect + Debezium jars are not in {cache / 'lib'} (or not "
                                 "verified): run `make connect` in the checkout")
    return cache / "lib"


@dataclass(frozen=True)
class PgTarget:
    """Where the table is: the parts of a ``postgresql://user[:password]@host[:port]/db`` DSN."""

    dsn: str
    host: str
    port: int
    user: str
    password: str
    dbname: str

    @classmethod
    def parse(cls, dsn: str) -> PgTarget:
        u = urlsplit(dsn)
        if u.scheme not in ("postgresql", "postgres") or not u.hostname:
            raise ValueError(f"--dsn must be postgresql://user[:password]@host[:port]/dbname, got {dsn!r}")
        return cls(dsn, u.hostname, u.port or 5432, unquote(u.username or "postgres"),
                   unquote(u.password or ""), unquote(u.path.lstrip("/")) or "postgres")


def worker_config(settings: Settings, state_dir: Path, rest_port: int, flush_ms: int) -> dict[str, str]:
    """The standalone worker: JSON with schemas on values (the mapping reads column types from
    them), source offsets in ``state_dir``, flushed every ``flush_ms`` (a kill -9 redelivers at most
    that much, which the deterministic event ids make harmless). The broker security of
    ``UNLEARN_KAFKA_PROPERTIES``, in the Java client's names, for the worker and its ``producer.``,
    ``consumer.`` and ``admin.`` clients (``infra/java_security.py``): it holds the password."""
    return {
        "bootstrap.servers": settings.bootstrap,
        **connect_security(security_config(settings)),
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "true",
        "offset.storage.file.filename": str(state_dir / "connect.offsets"),
        "offset.flush.interval.ms": str(flush_ms),
        "listeners": f"http://127.0.0.1:{rest_port}",
        # The connector is on the classpath; its ServiceLoader manifests make scanning needless.
        "plugin.discovery": "service_load",
        "topic.creation.enable": "false",  # `unlearn cdc` creates the change topic (one partition)
        "producer.acks": "all",
        "producer.enable.idempotence": "true",
    }


def connector_config(name: str, pg: PgTarget, table: str, topic_prefix: str, slot: str) -> dict[str, str]:
    """Debezium for one table over ``pgoutput``: the slot and a filtered publication are created by
    Debezium on first start (and dropped by ``unlearn cdc --drop-slot``); TRUNCATE comes through
    (``skipped.operations=none``) to be refused loudly; no Debezium tombstones (the change topic is
    trimmed instead, docs/cdc.md "Erasure")."""
    return {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": pg.host,
        "database.port": str(pg.port),
        "database.user": pg.user,
        "database.password": pg.password,
        "database.dbname": pg.dbname,
        "topic.prefix": topic_prefix,
        "table.include.list": table,
        "slot.name": slot,
        "publication.name": slot,
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": "initial",
        "tombstones.on.delete": "false",
        "skipped.operations": "none",
        "decimal.handling.mode": "double",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ConnectProcess:
    """One Connect standalone JVM with one connector; ``task_state`` asks its REST API.

    Its two properties files hold secrets (the broker's JAAS line, the database password): each
    start writes them owner-only (0600) into a new private temporary directory (0700) and passes
    only their paths on the command line; :meth:`forget_config` removes them, as soon as the task
    runs (the JVM has read them by then) and at :meth:`stop`."""

    def __init__(self, jars: Path, state_dir: Path, worker: dict[str, str], connector: dict[str, str],
                 heap_mb: int = 256) -> None:
        self.jars, self.state_dir, self.heap_mb = jars, state_dir, heap_mb
        self.worker, self.connector = worker, connector
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir / "connect.log"
        self.config_dir: Path | None = None

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.worker["listeners"] = f"http://127.0.0.1:{_free_port()}"
        self.forget_config()
        self.config_dir = Path(tempfile.mkdtemp(prefix="unlearn-connect-"))  # 0700
        worker = write_private_properties(self.config_dir / "worker.properties", self.worker)
        connector = write_private_properties(self.config_dir / "connector.properties", self.connector)
        cmd = with_pdeathsig([find_java(), f"-Xmx{self.heap_mb}m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                              *_LOG_FLAGS, "-cp", str(self.jars / "*"),
                              "org.apache.kafka.connect.cli.ConnectStandalone", str(worker), str(connector)],
                             True)
        with open(self.log_path, "ab") as out:
            out.write(f"\n===== connect start {time.ctime()} =====\n".encode())
            out.flush()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        log.info("connect standalone started (pid %d, log %s)", self.proc.pid, self.log_path)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def task_state(self) -> str | None:
        """RUNNING, FAILED, ... of task 0; None while the REST API or the task is not up."""
        url = f"{self.worker['listeners']}/connectors/{self.connector['name']}/status"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                status: dict[str, Any] = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None
        tasks = status.get("tasks") or []
        return str(tasks[0].get("state")) if tasks else None

    def log_tail(self, n: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-n:]
        return ""

    def forget_config(self) -> None:
        """Remove the private directory of the properties files (ConnectStandalone reads them once, at start)."""
        if self.config_dir is not None:
            shutil.rmtree(self.config_dir, ignore_errors=True)
            self.config_dir = None

    def stop(self, grace: float = 15.0) -> None:
        try:
            if self.proc is not None:
                terminate(self.proc, grace)
        finally:
            self.forget_config()
