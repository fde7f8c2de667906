"""Smoke test of bench/label_space.py at a tiny size: well-formed numbers, sizes growing with c.
No timing assertions."""

from __future__ import annotations

import math

from bench import label_space


def test_label_space_costs_are_measured() -> None:
    small, large = label_space.measure(8, 4, 5), label_space.measure(8, 100, 5)
    for r in (small, large):
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("add_ms", "reset_ms", "update_kb", "snapshot_mb"))
    assert large["update_kb"] > small["update_kb"] and large["snapshot_mb"] > small["snapshot_mb"]
