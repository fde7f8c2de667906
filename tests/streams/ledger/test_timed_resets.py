"""The timer's resets (streams/ledger/timed_resets.py), without a broker: what a tick starts,
what a later tick publishes and adopts, and what it must not publish (a job a reset since made
void, a partition given up). ``Published`` stands in for the worker's ``Outputs`` and records
what would go to the heads topic; the worker's broker tests run the same class on Kafka."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from tests.streams.ledger.test_head_runtime import CFG, run_polls, stream
from unlearn.ledger import relative_deviation, solve_head
from unlearn.schemas.head import HeadUpdate
from unlearn.streams.ledger import timed_resets
from unlearn.streams.ledger.head_runtime import HeadRuntime
from unlearn.streams.ledger.outputs import head_update
from unlearn.streams.ledger.owned_partitions import OwnedPartitions, PartitionState
from unlearn.streams.ledger.timed_resets import TimedResets


@pytest.fixture(autouse=True)
def one_blas_thread() -> Iterator[None]:
    """One BLAS thread, as the ledger worker runs (``ledger_blas_threads``): with two, a reset in
    the job's thread and a sync on this one call BLAS at once, and how the library splits each
    call between its threads then depends on the timing, and so do W's last bits (a bitwise
    comparison below failed once in a loaded `make test`)."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


class Published:
    """The part of ``Outputs`` the resets use: updates recorded instead of produced."""

    publish_posterior = True

    def __init__(self) -> None:
        self.updates: list[tuple[int, HeadUpdate]] = []
        self.store = SimpleNamespace(heads_rewrites={})  # what ChangelogStore counts: heads rewrites begun

    def encode_update(self, update: HeadUpdate) -> bytes:
        return b"x" * 10

    def publish_update(self, part: int, update: HeadUpdate, value: bytes, traces: Any = ()) -> bool:
        self.updates.append((part, update))
        return True

    def publish_head(self, part: int, head: HeadRuntime, mode: Any = None, traces: Any = ()) -> bool:
        self.updates.append((part, head_update(head, mode, posterior=True)))
        return True


def owned_with(*heads: tuple[int, HeadRuntime]) -> OwnedPartitions:
    owned = OwnedPartitions()
    for part, head in heads:
        ps = owned.get(part) or PartitionState(part, 0)
        owned.add(ps)
        owned.place(ps, head)
    return owned


def fast_head(head_id: str, seed: int, n: int = 30) -> tuple[HeadRuntime, list[Any]]:
    msgs = [replace(m, head_id=head_id) for m in stream(n + 10, 24, seed)]
    head, _, _ = run_polls(msgs[:n], [3] * (n // 3))
    head.head_id = head_id
    assert head.mode == "fast"
    return head, msgs


def resets(out: Published, in_thread: bool = True) -> TimedResets:
    return TimedResets(cast(Any, out), CFG, every_seconds=0.0, in_thread=in_thread)


def settle(r: TimedResets, owned: OwnedPartitions) -> None:
    """Wait for the job in the thread, then tick (which takes it, and may start the next)."""
    assert r._job is not None
    r._job.done.result(timeout=30)
    r.tick(owned)


def started_then_one_more(head_id: str, seed: int) -> tuple[HeadRuntime, OwnedPartitions, Published, TimedResets]:
    """A fast head on partition 0 whose reset job started, and which took one more message."""
    head, msgs = fast_head(head_id, seed)
    owned = owned_with((0, head))
    out = Published()
    r = resets(out)
    r.tick(owned)
    head.apply(msgs[30], 30, 0)
    head.sync()
    return head, owned, out, r


def test_a_due_head_is_published_exact_at_the_version_copied_and_adopted() -> None:
    head, msgs = fast_head("h", 1)
    twin, _ = fast_head("h", 1)
    twin.reset("timer")
    owned = owned_with((0, head))
    out = Published()
    r = resets(out)
    r.tick(owned)  # starts the job: nothing published yet
    assert r._job is not None and out.updates == []
    for off in range(30, 33):  # the head goes on meanwhile
        head.apply(msgs[off], off, 0)
        head.sync()
    settle(r, owned)
    ((part, update),) = out.updates
    assert part == 0 and update.mode == "exact" and update.version == 30
    assert replace(update, created_ts=0.0) == replace(head_update(twin, posterior=True), created_ts=0.0)
    assert head.mode == "fast" and head.version == 33 and head.fast_drift > 0
    assert relative_deviation(head.weights, solve_head(head.ledger, CFG.gamma)) < 1e-9
    r.close()


def test_under_a_flow_the_update_is_published_and_the_head_goes_on_measured(monkeypatch: Any) -> None:
    """More rows since the copies than a head adopts (d / 8, or ``ADOPT_ROWS``): the exact
    update of the copies' version is published all the same, and the fast head keeps its factor,
    its drift now the one measured at that version."""
    monkeypatch.setattr(timed_resets, "ADOPT_ROWS", 0)  # d = 24: a head adopts up to 3 rows
    head, msgs = fast_head("h", 12)
    owned = owned_with((0, head))
    out = Published()
    r = resets(out)
    r.tick(owned)
    for off in range(30, 36):
        head.apply(msgs[off], off, 0)
        head.sync()
    served, drift = head.weights.copy(), head.fast_drift
    settle(r, owned)
    ((_, update),) = out.updates
    assert update.mode == "exact" and update.version == 30 and r.adopted == 0
    assert head.mode == "fast" and np.array_equal(head.weights, served) and head.fast_drift != drift
    r.close()


def test_with_nothing_since_the_copies_the_head_is_exact_and_the_update_is_its_own() -> None:
    head, _ = fast_head("h", 2)
    owned = owned_with((0, head))
    out = Published()
    r = resets(out)
    r.tick(owned)
    settle(r, owned)
    ((_, update),) = out.updates
    assert head.mode == "exact" and update.version == head.version
    assert np.array_equal(update.weights, head.weights) and np.array_equal(head.weights,
                                                                          solve_head(head.ledger, CFG.gamma))
    r.tick(owned)  # an exact head is not due: nothing more
    assert r._job is None and len(out.updates) == 1
    r.close()


def test_a_reset_since_the_copies_or_a_partition_given_up_publishes_nothing() -> None:
    """A reset since the copies (a refused downdate, coalesced rows) left the head canonical at a
    later version: the job is void. A partition given up is another worker's now."""
    head, owned, out, r = started_then_one_more("h", 3)
    head.reset("downdate infeasible")
    served = head.weights.copy()
    settle(r, owned)
    assert out.updates == [] and r.voided == 1
    assert head.mode == "exact" and np.array_equal(head.weights, served)

    other, _ = fast_head("g", 4)
    owned = owned_with((1, other))
    r.tick(owned)
    owned.drop(1)
    settle(r, owned)
    assert out.updates == [] and other.mode == "fast"
    r.close()


def test_after_a_heads_rotation_the_copies_version_is_not_published() -> None:
    """A heads rotation since the copies republished every head at its version and dropped the
    older updates (after a delete: the erasure rotation): the exact update of the copies' older
    version must not follow it. The head still adopts the factor; when that leaves it exact,
    its own version's exact update is published instead."""
    head, owned, out, r = started_then_one_more("h", 9)
    out.store.heads_rewrites[0] = 1
    settle(r, owned)
    assert out.updates == [] and head.mode == "fast" and r.voided == 0
    assert relative_deviation(head.weights, solve_head(head.ledger, CFG.gamma)) < 1e-9

    other, _ = fast_head("g", 10)
    owned = owned_with((1, other))
    r.tick(owned)
    out.store.heads_rewrites[1] = 1
    settle(r, owned)
    ((_, update),) = out.updates
    assert other.mode == "exact" and update.mode == "exact" and update.version == other.version
    r.close()


def test_one_job_at_a_time_the_most_overdue_head_first() -> None:
    a, _ = fast_head("a", 5)
    b, _ = fast_head("b", 6)
    a.last_reset_at, b.last_reset_at = 100.0, 50.0
    owned = owned_with((0, a), (1, b))
    out = Published()
    r = resets(out)
    r.tick(owned)
    assert r._job is not None and r._job.head is b
    settle(r, owned)  # b's finish starts a's
    assert [u.head_id for _, u in out.updates] == ["b"] and r._job is not None and r._job.head is a
    settle(r, owned)
    assert [u.head_id for _, u in out.updates] == ["b", "a"] and a.mode == b.mode == "exact"
    r.close()


def test_without_the_thread_every_due_head_resets_on_the_tick() -> None:
    a, _ = fast_head("a", 7)
    b, _ = fast_head("b", 8)
    owned = owned_with((0, a), (0, b))
    out = Published()
    r = resets(out, in_thread=False)
    r.tick(owned)
    assert sorted(u.head_id for _, u in out.updates) == ["a", "b"]
    assert all(u.mode == "exact" for _, u in out.updates) and a.mode == b.mode == "exact"
