"""The local S3 behind a persistent embedded broker: the npm package s3rver, and a lock that keeps
two brokers off one data directory.

tansu's only persistent storage engine is ``s3://``; ``LocalBroker(data_dir=DIR)`` (infra/broker.py)
runs s3rver with its objects under ``DIR/s3`` and points tansu at it. This module finds s3rver and
owns the data-dir lock; the broker module owns the processes.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
from pathlib import Path

__all__ = ["S3_BUCKET", "S3_LISTENING", "S3_PACKAGE_DIR", "S3RVER_KEY", "DataDirInUse", "DataDirLock",
           "S3rverMissing", "find_s3rver"]

S3_BUCKET = "tansu"
S3_PACKAGE_DIR = Path(__file__).resolve().parent / "s3"  # package.json + lock; `make s3` installs
# s3rver's built-in credentials (it checks signatures); nothing secret, it only listens on loopback.
S3RVER_KEY = "S3RVER"



class S3rverMissing(RuntimeError):
    """node or the s3rver package is missing; the message names what to install."""


class DataDirInUse(RuntimeError):
    """Another broker holds the data directory."""


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
