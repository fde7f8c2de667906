"""Is a process alive, and waiting for it to die: the broker tests kill -9 brokers and their CLIs."""

from __future__ import annotations

import os
import time


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (it answers kill(0)) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pid: int, timeout: float = 10.0) -> bool:
    """Poll until ``pid`` is dead; False if it still runs after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False
