"""The one poll-until-ready loop (infra/polling.py): answers, timeouts and early give-ups."""

from __future__ import annotations

import pytest

from unlearn.infra.polling import poll_until


def test_returns_the_first_answer_and_passes_the_time_left() -> None:
    seen: list[float] = []

    def attempt(remaining: float) -> str | None:
        seen.append(remaining)
        return "ready" if len(seen) == 3 else None

    assert poll_until(attempt, 5.0, interval=0.001, timed_out=lambda: AssertionError("timed out")) == "ready"
    assert len(seen) == 3 and 0.0 < seen[-1] <= seen[0] <= 5.0


def test_a_falsy_answer_other_than_none_is_an_answer() -> None:
    assert poll_until(lambda _r: 0, 1.0, interval=0.001, timed_out=lambda: AssertionError("timed out")) == 0
    assert poll_until(lambda _r: {}, 1.0, interval=0.001, timed_out=lambda: AssertionError("timed out")) == {}


def test_times_out_with_the_callers_error_after_asking_at_least_once() -> None:
    calls: list[float] = []
    with pytest.raises(TimeoutError, match="never"):
        poll_until(lambda r: calls.append(r), 0.05, interval=0.01, timed_out=lambda: TimeoutError("never"))
    assert len(calls) >= 2 and calls[0] > calls[-1] >= 0.0  # asked again, with less time left each time
    once: list[float] = []
    with pytest.raises(TimeoutError):
        poll_until(lambda r: once.append(r), 0.0, interval=0.01, timed_out=lambda: TimeoutError("zero"))
    assert once == [0.0]


def test_an_attempt_that_raises_gives_up_at_once() -> None:
    def attempt(_remaining: float) -> None:
        raise RuntimeError("the process died")

    with pytest.raises(RuntimeError, match="died"):
        poll_until(attempt, 60.0, interval=1.0, timed_out=lambda: TimeoutError("not this"))
