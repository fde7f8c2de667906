"""The featurizer rides through a broker restart in each of its broker-facing steps (issue 35).

One Apache Kafka node with a data dir, owned by this module (tests/broker_restart_support.py). An
in-process featurizer judges a request stream (adds, deletes, a subject erasure, bad requests);
at one step the node is killed with -9 and started again from its data dir a moment later, while
the featurizer is inside the step:

- ``phase0``: a batch's delivery of its changelog txn and position (fault hook
  ``after_cache_commit``: the sqlite commit is done, nothing produced yet);
- ``phase1``: the batch's downstream messages (hook ``after_changelog``: phase 0 acknowledged);
- ``route``: the router forwarding requests records to the by-head topic;
- ``trim``: the raw-input trim (DeleteRecords below the committed offsets);
- ``transit_rotation``: a transit key rotation (the private half written to its key family, the
  public half published);
- ``key_destroy``: a key store destroying keys (the transit keys a rotation superseded: tombstones
  and, where the broker does not compact, a new generation);
- ``restore``: a featurizer on an empty data dir rebuilding its caches from the changelog on
  assignment.

The featurizer must survive (its thread never ends, no error) and the heads must end exact: the
deltas, deduplicated by source id as the ledger does, fold to the from-scratch ledger of the
retained samples, and carry every accepted event once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.broker_restart_support import Restarter, restart_cluster
from tests.sealed_support import register
from tests.streams.featurizer.test_service import Reader, Running, ledgers_from, reference, workload
from unlearn.infra.local.kafka import LocalKafka
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import producer_config
from unlearn.runtime.topics import create_topics
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.streams.featurizer.changelog_reader import ChangelogReader
from unlearn.streams.featurizer.key_store import KeyStore
from unlearn.streams.featurizer.raw_input_trim import Trimmer
from unlearn.streams.featurizer.routing import Router
from unlearn.streams.featurizer.transit_keys import TransitKeys

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    yield from restart_cluster(tmp_path_factory.mktemp("kafka-restart-fz"))


def _settings(settings: Settings, cluster: LocalKafka, tmp_path: Path, step: str) -> Settings:
    s = settings.with_(bootstrap=cluster.bootstrap, profile="kafka", topic_prefix=f"t.fzrestart.{step}.",
                          data_dir=str(tmp_path / "data"), admin_timeout=10.0, broker_retry_seconds=120.0,
                          trim_every_seconds=1.0)
    register(s)  # the test's deltas are sealed: opened with the keys of this broker (sealed_support)
    return s


def _produce(s: Settings, values: list[tuple[str, bytes]]) -> None:
    """Produce, waiting out a node that may be restarting."""
    from confluent_kafka import Producer

    p = Producer(producer_config(s))
    for key, value in values:
        p.produce(s.topic("requests"), value=value, key=key.encode())
    assert p.flush(180) == 0


def _assert_exact(s: Settings, reader: Reader, retained: dict, accepted: list[str], reasons: list[str]) -> None:
    """Every accepted event once in the deduplicated deltas, the heads equal to the from-scratch
    ledger of the retained samples, every bad request dead-lettered."""
    rows_expected = sorted(accepted + ["forget-s5"] * 2 + ["forget-s6"])  # one row per deleted sample
    got = reader.until(lambda g: sorted(ledgers_from(g["deltas"])[1]) == rows_expected
                       and set(reasons) <= {decode_deadletter(m.value()).reason for m in g["deadletter"]},
                       timeout=180.0)
    time.sleep(1.0)  # anything more (there must be nothing) would arrive now
    got = reader.until(lambda g: True)
    ledgers, events = ledgers_from(got["deltas"])
    assert sorted(events) == rows_expected  # nothing lost, nothing doubled
    for head in ("h1", "h2"):
        assert ledgers[head].digest() == reference(retained, head, ledgers[head].n_outputs), head


def _alive(run: Running) -> None:
    assert run.thread.is_alive() and run.error is None, run.error


_HOOKS = {"phase0": "after_cache_commit", "phase1": "after_changelog"}
# step -> (class whose method is wrapped, the method, whether a call has work to do)
_METHODS: dict[str, tuple[type, str, Callable[..., bool]]] = {
    "route": (Router, "forward", lambda _self, records: bool(list(records))),
    "trim": (Trimmer, "trim", lambda _self, partitions: bool(list(partitions))),
    "transit_rotation": (TransitKeys, "rotate", lambda *a: True),
    "key_destroy": (KeyStore, "destroy", lambda _self, partition, refs: bool(list(refs))),
}
_TRANSIT = {"transit_rotate_seconds": 4.0, "transit_grace_seconds": 3.0}  # rotations and destructions every few s


@pytest.mark.parametrize("step", [*_HOOKS, *_METHODS])
def test_a_broker_restart_in_each_step_leaves_the_featurizer_running_and_the_heads_exact(
        settings: Settings, cluster: LocalKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    s = _settings(settings, cluster, tmp_path, step)
    if step in ("transit_rotation", "key_destroy"):
        s = s.with_(**_TRANSIT)
    create_topics(s)
    reqs, retained, accepted, reasons = workload()
    if step in _HOOKS:
        restarter = Restarter(cluster)
        fault = restarter.hook(_HOOKS[step])
    else:
        owner, name, busy = _METHODS[step]
        monkeypatch.setattr(owner, name, getattr(owner, name))  # undone after the test
        restarter = Restarter(cluster, owner, name, busy=busy)
        fault = None
    run = Running(s, group=f"fz-restart-{step}", fault=fault, max_batch=8)
    reader = Reader(s)
    try:
        assert run.service.ready.wait(60)
        _produce(s, reqs[:12])
        reader.until(lambda g: {f"a{i}" for i in range(12)} <= set(ledgers_from(g["deltas"])[1]), timeout=60)
        restarter.armed = True  # the next call of the step meets a broker that is going away
        _produce(s, reqs[12:])
        restarter.wait_done()
        _assert_exact(s, reader, retained, accepted, reasons)
        _alive(run)
        assert run.stop(60) == 0
    finally:
        reader.close()
        run.stop_event.set()


def test_a_broker_restart_during_the_changelog_restore_leaves_the_featurizer_running_and_exact(
        settings: Settings, cluster: LocalKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A featurizer on an empty data dir takes the partitions over and rebuilds its caches from the
    changelog while the node restarts under it; the deletes it judges then reuse the adds' exact q."""
    s = _settings(settings, cluster, tmp_path, "restore")
    create_topics(s)
    reqs, retained, accepted, reasons = workload()
    reader = Reader(s)
    try:
        first = Running(s, group="fz-restart-restore", max_batch=8)
        _produce(s, reqs[:36])  # the adds
        reader.until(lambda g: {f"a{i}" for i in range(36)} <= set(ledgers_from(g["deltas"])[1]), timeout=60)
        assert first.stop(60) == 0
        monkeypatch.setattr(ChangelogReader, "restore", ChangelogReader.restore)  # undone after the test
        restarter = Restarter(cluster, ChangelogReader, "restore")
        restarter.armed = True
        second = Running(s.with_(data_dir=str(tmp_path / "empty")), group="fz-restart-restore", max_batch=8)
        try:
            restarter.wait_done()
            assert second.service.ready.wait(180)
            _produce(s, reqs[36:])
            _assert_exact(s, reader, retained, accepted, reasons)
            _alive(second)
            assert second.service.stats["events"] == len(reqs) - 36  # it judged the rest, nothing again
            assert second.stop(60) == 0
        finally:
            second.stop_event.set()
    finally:
        reader.close()
