"""The ledger worker rides through a broker restart in each of its broker-facing steps (issue 35).

One Apache Kafka node with a data dir, owned by this module (the session's broker is shared by
other tests: it is never restarted). An in-process worker folds a random add/delete stream; at one
step the node is killed with -9 and started again from its data dir a moment later, while the
worker is inside the step:

- ``fold``: publishing a poll's head updates and receipts (produce);
- ``delivery``: waiting for the outputs before a checkpoint (flush);
- ``checkpoint``: writing a snapshot to ledger-state;
- ``rewrite_and_trim``: an erasure rotation reading the end of the heads topic (the call that
  killed the worker in issue 35) and then trimming it (DeleteRecords);
- ``recovery``: a second worker rebuilding a partition from ledger-state.

The worker must survive (no exception, no restart) and every head must end exact: its version
counts every deltas message once (nothing lost, nothing doubled), and its digest, retained-rows
hash and weights equal the from-scratch ledger's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker_restart_support import Restarter, restart_cluster
from tests.streams.ledger.support import Stream, assert_final_heads_exact, produce, run_in_thread, worker_settings
from unlearn.infra.local.kafka import LocalKafka
from unlearn.infra.settings import Settings
from unlearn.runtime.topics import create_topics
from unlearn.streams.ledger.worker import LedgerWorker

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    yield from restart_cluster(tmp_path_factory.mktemp("kafka-restart"))


@contextlib.contextmanager
def _running(w: LedgerWorker) -> Iterator[Callable[[], None]]:
    """The worker in a thread; yields a check that it is still running without an error, and
    stops it at the end (an error it raised fails the test)."""
    t, failed = run_in_thread(w)

    def alive() -> None:
        assert t.is_alive() and not failed, failed
    try:
        yield alive
    finally:
        w.stop()
        t.join(60)
    assert not failed, failed


def _exact_after_restart(s: Settings, stream: Stream, restarter: Restarter, alive: Callable[[], None]) -> None:
    """Once the step restarted the broker: more deltas, then every head exact, the worker alive."""
    restarter.wait_done()
    produce(s, [stream.next_message() for _ in range(10)], timeout=180.0)
    assert_final_heads_exact(s, stream, timeout=120.0)
    alive()


def _settings(settings: Settings, cluster: LocalKafka, tmp_path: Path, step: str) -> Settings:
    return worker_settings(settings, tmp_path).with_(
        bootstrap=cluster.bootstrap, profile="kafka", topic_prefix=f"t.restart.{step}.", partitions=2,
        erasure_rotate_seconds=1.0, heads_retire_seconds=3.0, admin_timeout=10.0, broker_retry_seconds=120.0)


# step -> (object the method is on, method, which call with work to do)
_STEPS: dict[str, Callable[[LedgerWorker], tuple[Any, str, int]]] = {
    "fold": lambda w: (w.outputs, "publish_poll", 1),
    "delivery": lambda w: (w.outputs, "flush", 1),
    "checkpoint": lambda w: (w.store, "write_snapshot", 2),
    "rewrite_and_trim": lambda w: (w.store, "begin_heads_rewrite", 1),
}


def _busy(step: str) -> Callable[..., bool]:
    """A poll that folded something (not an empty one)."""
    return (lambda poll: bool(poll.heads)) if step == "fold" else (lambda *a, **k: True)


@pytest.mark.parametrize("step", sorted(_STEPS))
def test_a_broker_restart_in_each_step_leaves_the_worker_running_and_the_ledger_exact(
        settings: Settings, cluster: LocalKafka, tmp_path: Path, step: str) -> None:
    s = _settings(settings, cluster, tmp_path, step)
    create_topics(s)
    stream = Stream(["a1", "a2", "a3", "a4"], d=10, seed=35)
    w = LedgerWorker(s, f"restart-{step}")
    owner, name, nth = _STEPS[step](w)
    restarter = Restarter(cluster, owner, name, nth, _busy(step))
    with _running(w) as alive:
        produce(s, [stream.next_message() for _ in range(30)])
        assert_final_heads_exact(s, stream)
        restarter.armed = True  # the next call of the step meets a broker that is going away
        # deletes among them: an erasure rotation; the node may be down while they are sent
        produce(s, [stream.next_message() for _ in range(30)], timeout=180.0)
        _exact_after_restart(s, stream, restarter, alive)


def test_a_broker_restart_during_recovery_leaves_the_worker_running_and_the_ledger_exact(
        settings: Settings, cluster: LocalKafka, tmp_path: Path) -> None:
    """A worker restarted after a first one stopped rebuilds its partitions from ledger-state
    while the node restarts under it."""
    s = _settings(settings, cluster, tmp_path, "recovery")
    create_topics(s)
    stream = Stream(["r1", "r2", "r3"], d=10, seed=36)
    with _running(LedgerWorker(s, "first")):
        produce(s, [stream.next_message() for _ in range(40)])
        assert_final_heads_exact(s, stream)
    second = LedgerWorker(s, "second")
    restarter = Restarter(cluster, second.store, "recover", 1)
    restarter.armed = True
    with _running(second) as alive:
        _exact_after_restart(s, stream, restarter, alive)
