"""The shred tick's reads off the poll loop (runtime/probes.py): a read starts after it
was asked, runs with consumers of its own, all closed when it returns, and its exception is
re-raised on the taker's thread. No broker: reads are fakes gated by events."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.probe_support import WAIT, Closable
from unlearn.runtime.probes import Probes


def test_an_answer_is_sampled_after_it_was_asked_and_its_consumers_are_closed() -> None:
    made: list[Closable] = []
    probes = Probes(lambda: made.append(Closable()) or made[-1])
    gate = threading.Event()
    seen: list[float] = []

    def job(make: Any) -> int:
        make(), make()
        gate.wait(WAIT)
        seen.append(time.monotonic())
        return 7

    try:
        assert probes.ask("x", job)
        assert probes.busy("x") and not probes.ask("x", job)  # one in flight per name
        assert probes.take("x") is None
        gate.set()
        answer = probes.wait("x", WAIT)
        assert answer is not None and answer.result() == 7
        assert answer.asked <= answer.started <= seen[0]
        assert len(made) == 2 and all(c.closed for c in made)
        assert not probes.busy("x")

        def fails(make: Any) -> None:
            raise RuntimeError("broker gone")

        assert probes.ask("x", fails)
        failed = probes.wait("x", WAIT)
        assert failed is not None
        with pytest.raises(RuntimeError, match="broker gone"):
            failed.result()  # re-raised on the tick's thread, as a read on the poll loop raised
    finally:
        probes.close()
