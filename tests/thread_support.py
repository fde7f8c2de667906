"""Run test workers on threads that switch as often as the interpreter allows, so a race in the
code under test (a check-then-act without a lock) shows up in a few hundred operations."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable


def run_racing(work: Callable[[int], object], threads: int) -> None:
    """``work(t)`` for t in 0..threads-1, each on its own thread, with a 1 µs switch interval."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(interval)
