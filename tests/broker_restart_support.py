"""Restarting a one-node Apache Kafka under a worker (issue 35): the broker-restart tests of the
ledger and of the featurizer share these.

The node has a data dir and belongs to the test module that uses :func:`restart_cluster` (the
session's broker is shared by other tests: it is never restarted). :func:`restart_in_background`
kills the node with -9 and starts it again from its data dir a moment later; a :class:`Restarter`
does that at the step under test (a wrapped method, or a fault hook point).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from unlearn.infra.local.kafka import LocalKafka


def restart_cluster(data_dir: Path) -> Iterator[LocalKafka]:
    """The body of a module-scoped fixture: one Kafka node with a data dir, stopped after."""
    # die_with_parent=False: the node is started again from short-lived threads
    c = LocalKafka(1, data_dir=data_dir, die_with_parent=False).start()
    try:
        yield c
    finally:
        gc.collect()  # the module's clients (in cycles with their Restarter) go while the node is up
        c.stop()


def restart_in_background(cluster: LocalKafka, down_s: float = 1.5) -> threading.Thread:
    """kill -9 the node now; start it again from its data dir after ``down_s``."""
    cluster.kill_node(1)
    t = threading.Thread(target=lambda: (time.sleep(down_s), cluster.start_node(1)), daemon=True)
    t.start()
    return t


class Restarter:
    """Restarts the broker at the ``nth`` call with work to do (``busy``) of a step, once ``armed``:
    either wraps ``owner.name`` (the broker is restarted before the call), or, without an owner,
    serves as a fault hook (``hook(point)``: restarts at the ``nth`` ``point`` reached)."""

    def __init__(self, cluster: LocalKafka, owner: Any = None, name: str = "", nth: int = 1,
                 busy: Callable[..., bool] = lambda *a, **k: True) -> None:
        self.cluster, self.nth, self.calls, self.busy = cluster, nth, 0, busy
        self.armed = False
        self.restarts: list[threading.Thread] = []
        if owner is not None:
            original: Callable[..., Any] = getattr(owner, name)

            def wrapped(*args: Any, **kwargs: Any) -> Any:
                self.step(*args, **kwargs)
                return original(*args, **kwargs)
            setattr(owner, name, wrapped)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """The step under test is starting: restart the broker if this is the call to do it at."""
        if self.armed and not self.restarts and self.busy(*args, **kwargs):
            self.calls += 1
            if self.calls == self.nth:
                self.restarts.append(restart_in_background(self.cluster, 1.5))

    def hook(self, point: str) -> Callable[[str], None]:
        """A fault hook restarting the broker at ``point``."""
        return lambda at: self.step() if at == point else None

    def wait_done(self, timeout: float = 120.0) -> None:
        """Until the step under test restarted the broker, and the node is back."""
        deadline = time.monotonic() + 60.0
        while not self.restarts and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.restarts, "the broker was never restarted in the step under test"
        self.restarts[0].join(timeout)
        assert not self.restarts[0].is_alive()
