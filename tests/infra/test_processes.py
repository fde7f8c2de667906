"""infra/processes.py: a watched child that dies interrupts whoever waits in the main thread."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from unlearn.infra.processes import ServiceDied, ServiceProcess, watch_services
from unlearn.infra.settings import Settings


def test_a_child_that_dies_interrupts_the_wait_and_says_why(tmp_path: Path) -> None:
    proc = ServiceProcess("featurizer", ["featurizer", "--no-such-flag"], Settings.from_env(), tmp_path)
    slept_through = False
    with pytest.raises(ServiceDied) as info, watch_services([proc], every=0.1):
        proc.start()
        time.sleep(60)  # what the caller waits for never comes: the watch ends the wait
        slept_through = True
    assert not slept_through  # interrupted inside the sleep, not after it
    msg = str(info.value)
    assert msg.startswith("featurizer exited with code 2; its last log line: ")
    assert "unrecognized arguments: --no-such-flag" in msg and f"log: {tmp_path / 'featurizer.log'}" in msg


def test_a_block_that_ends_first_is_not_interrupted(tmp_path: Path) -> None:
    proc = ServiceProcess("ledger", ["ledger", "--no-such-flag"], Settings.from_env(), tmp_path)
    with watch_services([proc], every=0.1):
        pass
    proc.start()
    proc.proc.wait(30)  # type: ignore[union-attr]
    time.sleep(0.3)  # no watch is armed any more: nothing is raised here
    assert proc.death() is not None and proc.last_line()
