"""bench.publish_clock: seconds from a fault to the next new head version, and its distribution."""

from __future__ import annotations

import threading
import time

from bench.publish_clock import PublishClock, distribution


def test_only_new_versions_after_the_probe_count_and_a_silent_fault_is_filed_as_its_timeout() -> None:
    clock = PublishClock()
    t = time.monotonic()
    clock.saw("h", 1)  # in flight from before the probe: not a recovery
    probe = time.monotonic()
    threading.Timer(0.2, lambda: (clock.saw("h", 1), clock.saw("h", 2))).start()  # h/1 again: not new
    took = clock.record("kill -9 ledger", t, probe, timeout=5.0)
    assert took is not None and 0.15 < took < 2.0
    assert clock.record("kill -9 ledger", time.monotonic(), timeout=0.1) is None
    assert clock.after_fault["kill -9 ledger"][1] == 0.1


def test_distribution_names_the_spread_not_only_the_median() -> None:
    d = distribution([3.0, 1.0, 2.0, 30.0])
    assert (d["n"], d["min"], d["p50"], d["max"]) == (4, 1.0, 2.5, 30.0)
    assert distribution([]) == {"n": 0}
