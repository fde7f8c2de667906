"""Smoke test of bench/snapshot_write.py at a tiny size: both ways of writing give the same pieces,
and the numbers are well formed. No timing assertions."""

from __future__ import annotations

import math

from bench import snapshot_write


def test_snapshot_write_is_measured_both_ways() -> None:
    state = snapshot_write.head_state(16, rows=20)
    assert snapshot_write.as_the_store_writes(state) == snapshot_write.joined_first(state)
    r = snapshot_write.measure(snapshot_write.as_the_store_writes, state, 2)
    assert r["mb"] > 0 and all(math.isfinite(r[k]) and r[k] >= 0 for k in ("cpu_ms", "gap_ms", "gap_max_ms"))
