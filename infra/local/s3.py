"""The local S3 behind a persistent embedded broker: the npm package s3rver, and a lock that keeps
two brokers off one data directory.

tansu's only persistent storage engine is ``s3://``; ``LocalBroker(data_dir=DIR)`` (infra/local/tansu.py)
runs s3rver with its objects under ``DIR/s3`` and points tansu at it. This module finds s3rver,
owns the data-dir lock and runs the s3rver process (``LocalS3``); the broker module owns tansu.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import subprocess
import time
import weakref
from pathlib import Path

from unlearn.infra.polling import poll_until
from unlearn.infra.processes import terminate, with_pdeathsig

__all__ = ["S3_BUCKET", "S3_LISTENING", "S3_PACKAGE_DIR", "S3RVER_KEY", "DataDirInUse", "DataDirLock",
           "LocalS3", "S3rverFailed", "S3rverMissing", "find_s3rver"]

S3_BUCKET = "tansu"
S3_PACKAGE_DIR = Path(__file__).resolve().parents[1] / "s3"  # package.json + lock; `make s3` installs
# s3rver's built-in credentials (it checks signatures); nothing secret, it only listens on loopback.
S3RVER_KEY = "S3RVER"



class S3rverMissing(RuntimeError):
    """node or the s3rver package is missing; the message names what to install."""


class DataDirInUse(RuntimeError):
    """Another broker holds the data directory."""


class S3rverFailed(RuntimeError):
    """s3rver exited or did not listen in time; the message has its log's tail."""


def find_s3rver() -> list[str]:
    """The command (argv prefix) that runs s3rver, the local S3 behind a persistent broker.

    Order: the copy ``make s3`` installs into infra/s3/node_modules (pinned by its lock file), then
    ``s3rver`` on PATH. Raises S3rverMissing naming what to install.
    """
    node = shutil.which("node")
    script = S3_PACKAGE_DIR / "node_modules" / "s3rver" / "bin" / "s3rver.js"
    if script.is_file() and node:
        return [node, str(script)]
    on_path = shutil.which("s3rver")
    if on_path and node:
        return [on_path]
    if not node:
        raise S3rverMissing(
            "a persistent broker (--data) needs Node.js (>= 14) and npm to run the local S3 "
            "'s3rver', and 'node' is not on PATH: install them (Debian/Ubuntu: "
            "`apt-get install nodejs npm`), then run `make s3`; or run without --data "
            "(memory storage)"
        )
    raise S3rverMissing(
        f"a persistent broker (--data) needs the npm package s3rver, which is not installed in "
        f"{S3_PACKAGE_DIR / 'node_modules'} nor on PATH: run `make s3` "
        f"(= `npm ci --prefix {S3_PACKAGE_DIR} --no-audit --no-fund`); or run without --data "
        "(memory storage)"
    )


S3_LISTENING = re.compile(rb"S3rver listening on ([^\s:]+):(\d+)")


class DataDirLock:
    """An exclusive flock on DATA_DIR/broker.lock: two brokers on one directory would corrupt it.
    The kernel drops it when our process dies, however it dies."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "broker.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirInUse(f"data dir {self.path.parent} is in use by another broker (pid {holder})") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


class LocalS3:
    """s3rver on a free loopback port (it picks: ``--port 0``) with its objects under
    ``data_dir/s3`` and the bucket created if missing, logging to ``data_dir/s3rver.log``; the data
    dir is locked (``DataDirLock``) from ``start`` to ``stop``. ``die_with_parent`` as for the broker."""

    def __init__(self, data_dir: Path, host: str, *, start_timeout: float, stop_timeout: float,
                 die_with_parent: bool = True) -> None:
        self.data_dir = data_dir
        self.host = host
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.die_with_parent = die_with_parent
        self.log_path = data_dir / "s3rver.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint: str | None = None
        self._lock: DataDirLock | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def running(self) -> bool:
        """True while the s3rver process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> str:
        """Lock the data dir, start s3rver and wait for its "listening" line; its endpoint URL.
        Raises S3rverMissing, DataDirInUse or S3rverFailed, with nothing left running."""
        command = find_s3rver()
        (self.data_dir / "s3").mkdir(parents=True, exist_ok=True)
        lock = DataDirLock(self.data_dir)
        lock.acquire()
        self._lock = lock
        with open(self.log_path, "ab") as log:
            start_offset = log.tell()
            log.write(f"--- unlearn: starting s3rver at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
            log.flush()
            cmd = [*command, "--directory", str(self.data_dir / "s3"), "--address", self.host,
                   "--port", "0", "--silent", "--configure-bucket", S3_BUCKET]
            proc = self.proc = subprocess.Popen(with_pdeathsig(cmd, self.die_with_parent), stdin=subprocess.DEVNULL,
                                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._finalizer = weakref.finalize(self, terminate, proc, self.stop_timeout)

        def log_since_start() -> bytes:
            with open(self.log_path, "rb") as f:
                f.seek(start_offset)
                return f.read()

        def failed(why: str) -> S3rverFailed:
            self.stop()
            tail = log_since_start()[-4000:].decode("utf-8", "replace")
            return S3rverFailed(f"the local S3 (s3rver) {why}\n--- {self.log_path} ---\n{tail}")

        def listening(_remaining: float) -> str | None:
            found = S3_LISTENING.search(log_since_start())
            if found:
                return f"http://{found.group(1).decode()}:{int(found.group(2))}"
            if proc.poll() is not None:
                raise failed("exited")
            return None

        self.endpoint = poll_until(listening, self.start_timeout, interval=0.02,
                                   timed_out=lambda: failed("did not listen in time"))
        return self.endpoint

    def stop(self) -> None:
        """SIGTERM (SIGKILL after ``stop_timeout``), then unlock the data dir. Idempotent."""
        if self.proc is not None:
            terminate(self.proc, self.stop_timeout)
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._lock is not None:
            self._lock.release()
        self.proc = self.endpoint = self._lock = self._finalizer = None
