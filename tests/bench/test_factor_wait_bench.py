"""bench.factor_wait_bench runs, and both heads it times stay on solve_head (pure, no broker)."""

from __future__ import annotations

import pytest

from bench import factor_wait_bench


def test_both_holds_are_timed_and_their_heads_are_exact(capsys: pytest.CaptureFixture[str]) -> None:
    for hold in (0, 16):
        steps = factor_wait_bench.rounds(24, 60, 6, 5, hold)
        assert [len(steps[k]) for k in ("behind", "alone", "idle")] == [5, 5, 5]
        assert steps["deviation"][0] < 1e-9
    factor_wait_bench.main(["--d", "24", "--rows", "60", "--delta", "6", "--rounds", "3", "--pairs", "1",
                            "--holds", "0,16"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["0", "16"] and all(float(r[-1]) < 1e-9 for r in rows)
