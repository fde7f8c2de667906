"""A throwaway local PostgreSQL for the CDC tests (docs/cdc.md), the way ``LocalKafka`` runs a broker.

``initdb`` into a temporary directory owned by the ``postgres`` user (PostgreSQL refuses to run
as root), ``wal_level=logical`` so Debezium can stream it, trust authentication on 127.0.0.1 and a
private socket directory; ``restart`` keeps the data (the PostgreSQL-restart fault)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["LocalPostgres", "PostgresError", "find_pg_bin"]

_CANDIDATES = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin")


class PostgresError(RuntimeError):
    """No PostgreSQL binaries, or the server did not start."""


def find_pg_bin() -> Path:
    """The directory with initdb and postgres (UNLEARN_PG_BIN, the Debian package, or PATH)."""
    env = os.environ.get("UNLEARN_PG_BIN")
    for d in ([env] if env else []) + list(_CANDIDATES):
        if (Path(d) / "initdb").exists():
            return Path(d)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise PostgresError("no PostgreSQL binaries: install the Debian package postgresql-15 or set UNLEARN_PG_BIN")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPostgres:
    """One PostgreSQL server in its own temporary directory; ``dsn`` once started."""

    def __init__(self, user: str = "postgres") -> None:
        self.bin = find_pg_bin()
        self.user = user
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="unlearn-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_user(self) -> dict[str, object]:
        if os.geteuid() != 0:
            return {}
        pw = pwd.getpwnam(self.user)
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def start(self) -> LocalPostgres:
        if os.geteuid() == 0:
            pw = pwd.getpwnam(self.user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        if not (self.data / "PG_VERSION").exists():
            subprocess.run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                            "-E", "UTF8", "--no-sync"], check=True, capture_output=True, **self._as_user())  # type: ignore[call-overload]
        self._launch()
        return self

    def _launch(self) -> None:
        opts = ["-c", "wal_level=logical", "-c", f"port={self.port}", "-c", "listen_addresses=127.0.0.1",
                "-c", f"unix_socket_directories={self.root}", "-c", "max_replication_slots=10",
                "-c", "max_wal_senders=10", "-c", "fsync=off", "-c", "shared_buffers=32MB"]
        log = open(self.log, "ab")  # noqa: SIM115 - the child keeps its own descriptor
        try:
            self.proc = subprocess.Popen([str(self.bin / "postgres"), "-D", str(self.data), *opts], stdout=log,
                                         stderr=subprocess.STDOUT, **self._as_user())  # type: ignore[call-overload]
        finally:
            log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PostgresError(f"postgres exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                ready = subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                                       capture_output=True)
                if ready.returncode == 0:
                    return
            time.sleep(0.2)
        raise PostgresError(f"postgres did not accept connections in 60 s: {self.log.read_text()[-2000:]}")

    def restart(self) -> None:
        """Stop (fast shutdown) and start again on the same port and data."""
        self._stop_server()
        self._launch()

    def _stop_server(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # SIGINT: fast shutdown (smart waits for walsenders)
                os.kill(self.proc.pid, 2)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def stop(self) -> None:
        self._stop_server()
        shutil.rmtree(self.root, ignore_errors=True)
