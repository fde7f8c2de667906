"""The one poll-until-ready loop: ask again at a fixed interval until an answer comes or the time
is up, for every wait on something outside this process (a broker starting, topics appearing, a
log line, a head reaching a state)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(attempt: Callable[[float], T | None], timeout: float, *, interval: float,
               timed_out: Callable[[], BaseException]) -> T:
    """``attempt(remaining seconds)`` until it returns something other than None, sleeping
    ``interval`` between tries; raises ``timed_out()`` once ``timeout`` seconds passed without one.

    The first attempt always runs (a zero timeout still asks once), and a miss is judged after
    the attempt, so an answer that came in the last moment counts. ``attempt`` raises to give up
    early (a process that died); ``remaining`` (never negative) bounds its own blocking calls."""
    deadline = time.monotonic() + timeout
    while True:
        got = attempt(max(0.0, deadline - time.monotonic()))
        if got is not None:
            return got
        if time.monotonic() >= deadline:
            raise timed_out()
        time.sleep(interval)
