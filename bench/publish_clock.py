"""When did the pipeline publish again after a fault? The recovery measure of bench.chaos.

A fault (a worker kill -9, a Kafka node kill, a whole-cluster restart) is over for a user when a
head moves again: a new (head, version) pair appears on the heads topics. Readiness lines only say
a process started; this clock measures, per fault kind, the seconds from the fault to the first
new head version that a reader of the heads family saw after it (docs/ledger-processor.md,
"Broker faults": the target is 10 s at the median, 30 s at most).
"""

from __future__ import annotations

import statistics
import threading
import time

__all__ = ["PublishClock", "distribution"]


class PublishClock:
    """Arrival times of new (head, version) pairs, as a heads follower sees them."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, int]] = set()
        self._arrivals: list[float] = []  # monotonic, ascending
        self._cond = threading.Condition()
        self.after_fault: dict[str, list[float]] = {}  # fault kind -> seconds to the next new version

    def saw(self, head_id: str, version: int) -> None:
        """A head update arrived (the follower's callback)."""
        with self._cond:
            if (head_id, version) in self._seen:
                return
            self._seen.add((head_id, version))
            self._arrivals.append(time.monotonic())
            self._cond.notify_all()

    def first_after(self, t: float, timeout: float, since: float | None = None) -> float | None:
        """Seconds from ``t`` to the first new version that arrived after ``since`` (default
        ``t``), waiting up to ``timeout`` from now; None if none did."""
        deadline = time.monotonic() + timeout
        since = t if since is None else since
        with self._cond:
            while True:
                later = [a for a in self._arrivals if a > since]
                if later:
                    return later[0] - t
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def record(self, kind: str, t: float, since: float | None = None, timeout: float = 120.0) -> float | None:
        """Wait for the first new version after the fault at ``t`` (after ``since``: once the
        harness has restarted what it broke and sent a probe event, so that updates still in
        flight from before the fault do not count) and file the seconds from ``t`` under
        ``kind``; none within ``timeout`` is filed as ``timeout`` seconds, never dropped."""
        took = self.first_after(t, timeout, since)
        self.after_fault.setdefault(kind, []).append(round(took if took is not None else timeout, 3))
        return took


def distribution(xs: list[float]) -> dict[str, float]:
    """n, min, p50, p90, max of ``xs`` (the distribution, not only its median)."""
    if not xs:
        return {"n": 0}
    s = sorted(xs)
    return {"n": len(s), "min": s[0], "p50": round(statistics.median(s), 3),
            "p90": s[min(len(s) - 1, int(0.9 * len(s)))], "max": s[-1]}
