"""Run services as child processes (tests, the demo): same code path as an operator's shell.

A child gets the parent's Settings as UNLEARN_* environment variables, logs to a file, and is
stopped with SIGTERM (graceful) or SIGKILL (crash tests). Children die with the parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .polling import poll_until
from .settings import Settings


def settings_env(settings: Settings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that makes ``Settings.from_env()`` in a child equal ``settings``."""
    env = dict(os.environ if base is None else base)
    env.update(settings.env_values())
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def terminate(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, wait ``grace`` seconds, then SIGKILL. Module-level so finalizers can call it."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)
    except ProcessLookupError:
        pass


def terminate_all(procs: list[subprocess.Popen[bytes]], grace: float) -> None:
    """``terminate`` each in order (a broker before the storage it writes to)."""
    for proc in procs:
        terminate(proc, grace)


def with_pdeathsig(cmd: list[str], enabled: bool) -> list[str]:
    """``cmd`` run so that Linux SIGKILLs it when the thread that started it dies (when
    ``enabled`` and setpriv is there; else ``cmd`` as is)."""
    if enabled and sys.platform.startswith("linux") and shutil.which("setpriv"):
        # setpriv sets PR_SET_PDEATHSIG then execs: no preexec_fn (unsafe with threads).
        return ["setpriv", "--pdeathsig", "KILL", "--", *cmd]
    return cmd


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ServiceProcess:
    """One ``unlearn <command>`` child process."""

    def __init__(self, name: str, args: list[str], settings: Settings, log_dir: str | Path) -> None:
        self.name = name
        self.args = args
        self.settings = settings
        self.log_path = Path(log_dir) / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.started_at = 0.0

    def start(self) -> ServiceProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            log.write(f"\n===== start {self.starts} {time.ctime()} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen([sys.executable, "-m", "unlearn.services.cli", *self.args], stdout=log,
                                         stderr=subprocess.STDOUT, env=settings_env(self.settings),
                                         preexec_fn=_die_with_parent)
        self.starts += 1
        self.started_at = time.monotonic()
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """Crash it: no flush, no commit, no goodbye."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """Graceful stop (SIGTERM), escalating to SIGKILL after ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def wait_for_log(self, text: str, timeout: float = 60.0, after_start: int | None = None) -> float:
        """Seconds from the latest start until ``text`` appears in the log of start number
        ``after_start`` (default: the latest start); raises TimeoutError (with the log's tail) if
        it does not within ``timeout`` seconds of this call."""
        marker = f"===== start {self.starts - 1 if after_start is None else after_start} "

        def logged(_remaining: float) -> float | None:
            try:
                log = self.log_path.read_text(errors="replace")
            except OSError:
                log = ""
            i = log.rfind(marker)
            if i >= 0 and text in log[i:]:
                return time.monotonic() - self.started_at
            if self.proc is not None and self.proc.poll() is not None and i >= 0:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) before logging {text!r}:\n"
                                   + self.log_tail())
            return None

        return poll_until(logged, timeout, interval=0.05, timed_out=lambda: TimeoutError(
            f"{self.name} did not log {text!r} within {timeout:g}s:\n" + self.log_tail()))

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def last_line(self) -> str:
        """The last non-empty line its latest start logged (for a Python crash: the exception)."""
        try:
            log = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        log = log[log.rfind(f"===== start {self.starts - 1} "):]
        lines = [line.strip() for line in log.splitlines()[1:] if line.strip()]
        return lines[-1] if lines else ""

    def death(self) -> str | None:
        """Why it is no longer running (exit code or signal, last log line, log path), or None
        while it runs or before it was started."""
        if self.proc is None or self.proc.poll() is None:
            return None
        rc = self.proc.returncode
        how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        return f"{self.name} {how}; its last log line: {self.last_line() or '(none)'}\n  log: {self.log_path}"


class ServiceDied(RuntimeError):
    """Raised in the main thread by ``watch_services`` when a watched child dies."""


@contextlib.contextmanager
def watch_services(procs: list[ServiceProcess], every: float = 0.5) -> Iterator[None]:
    """Raise ``ServiceDied`` in the main thread, within ``every`` seconds, as soon as one of
    ``procs`` dies while the block runs: whoever waits for what a dead service would have produced
    stops at once (SIGUSR1 interrupts the wait, wherever it is), instead of at its timeout.
    Must be entered from the main thread; disarmed on exit, before the caller stops the children."""
    main = threading.main_thread()
    if threading.current_thread() is not main or main.ident is None:
        raise RuntimeError("watch_services must run in the main thread")
    died: list[str] = []
    done = threading.Event()

    def _raise(_signum: int, _frame: object) -> None:
        if died and not done.is_set():
            raise ServiceDied(died[0])

    def _watch() -> None:
        while not done.wait(every):
            why = next((d for d in (p.death() for p in procs) if d is not None), None)
            if why is not None:
                died.append(why)
                signal.pthread_kill(main.ident, signal.SIGUSR1)  # type: ignore[arg-type]
                return

    previous = signal.signal(signal.SIGUSR1, _raise)
    watcher = threading.Thread(target=_watch, name="service-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)


@contextlib.contextmanager
def stop_on_signal() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while the block runs (the previous handlers come back
    after it): how a foreground command (``unlearn broker``) learns to stop and clean up."""
    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def watch_until_stopped(stop: threading.Event, died: Callable[[], str | None], every: float = 0.5) -> int:
    """Exit code of a foreground command that runs children: 0 once ``stop`` is set, 1 (after
    printing why to stderr) as soon as ``died`` names a child that exited by itself."""
    while not stop.wait(every):
        why = died()
        if why is not None:
            print(why, file=sys.stderr)
            return 1
    return 0
