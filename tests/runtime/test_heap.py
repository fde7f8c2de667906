"""runtime/heap.py: what ``freeze_heap`` freezes and what it still collects (no broker)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from unlearn.runtime.heap import freeze_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    yield
    gc.unfreeze()  # the test process's heap goes back to normal collection


def _tracked(obj: object) -> bool:
    """Whether the collector's generations hold ``obj`` (frozen objects are in none of them)."""
    return any(o is obj for o in gc.get_objects())


def test_what_is_alive_is_frozen_out_of_the_collections() -> None:
    alive = [_Node()]
    assert _tracked(alive)
    frozen = freeze_heap()
    # Frozen objects can still die (reference counting: this process's other threads, the log
    # record freeze_heap writes), so the count may only have fallen since; nothing joins it.
    assert 0 < gc.get_freeze_count() <= frozen
    assert not _tracked(alive)  # a full collection no longer walks it
    after = [_Node()]
    assert _tracked(after)  # what comes later is collected as usual


def test_garbage_is_collected_first_not_frozen() -> None:
    gc.disable()  # no automatic collection may free the cycle before freeze_heap does
    try:
        garbage = _Node()
        gone = weakref.ref(garbage)
        del garbage
        assert gone() is not None  # a cycle: reference counting alone keeps it
        freeze_heap()
        assert gone() is None
    finally:
        gc.enable()


def test_a_frozen_cycle_that_dies_is_freed_by_the_next_freeze() -> None:
    holder = [_Node()]
    gone = weakref.ref(holder[0])
    freeze_heap()
    holder.clear()  # the frozen cycle becomes garbage: no collection sees it while frozen
    gc.collect()
    assert gone() is not None
    freeze_heap()  # unfreezes, collects, freezes again
    assert gone() is None
