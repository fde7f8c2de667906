"""Broker reads off a poll loop: :class:`Probes`, one background thread running named reads, and
:func:`run_with_consumers`.

Reads that take broker round trips (the ledger's checkpoint floors, log ends, committed offsets
for the featurizer's shredding) would stall every record processed meanwhile on the poll loop
(bench/results/pipeline_bench.md section 14). The caller instead *asks* for a read
(:meth:`Probes.ask`) and takes its answer on a later turn (:meth:`Probes.take`); each read gets
consumers of its own (never the poll loop's), closed when it returns.

**Sampled after the condition**: a read starts only after it was asked, so a caller that asks
only once the condition a read serves holds never uses a snapshot taken before it.
:class:`Answer` keeps ``asked`` and ``started`` (``started >= asked``) to make that checkable
(docs/erasure.md, section 4, for the featurizer's use).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Answer", "Job", "Probes", "run_with_consumers"]

log = logging.getLogger("unlearn.runtime")


Job = Callable[[Callable[[], Any]], Any]  # gets a consumer factory; returns the answer's value


@dataclass(frozen=True)
class Answer:
    """A finished read: its value (or the exception it raised), when it was asked and when it
    started (both ``time.monotonic()``)."""

    value: Any
    error: BaseException | None
    asked: float
    started: float

    def result(self) -> Any:
        """The value; the read's exception re-raised on the caller's thread (as a read on the poll
        loop raised before)."""
        if self.error is not None:
            raise self.error
        return self.value


def run_with_consumers(make: Callable[[], Any], job: Job) -> Any:
    """Run ``job`` with a factory of fresh consumers, all closed when it returns: a reader must not
    hold a topic its writer deletes (``topic_reader.source_partitions``)."""
    made: list[Any] = []

    def new() -> Any:
        made.append(make())
        return made[-1]

    try:
        return job(new)
    finally:
        for c in made:
            try:
                c.close()
            except Exception as exc:  # a close failing must not hide the answer
                log.debug("probe consumer close: %s", exc)


class Probes:
    """One background thread running named reads, at most one in flight per name."""

    def __init__(self, make: Callable[[], Any], name: str = "probes") -> None:
        self._make, self._name = make, name
        self._cv = threading.Condition()
        self._queue: list[tuple[str, Job, float]] = []
        self._busy: set[str] = set()
        self._done: dict[str, Answer] = {}
        self._closed = False
        self._thread: threading.Thread | None = None

    def ask(self, name: str, job: Job) -> bool:
        """Queue ``job`` under ``name``; False (nothing queued) while one of that name is in
        flight or its answer not yet taken."""
        with self._cv:
            if self._closed or name in self._busy or name in self._done:
                return False
            self._busy.add(name)
            self._queue.append((name, job, time.monotonic()))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify()
            return True

    def busy(self, name: str) -> bool:
        """Whether a read of ``name`` is queued, running, or answered and not yet taken."""
        with self._cv:
            return name in self._busy or name in self._done

    def take(self, name: str) -> Answer | None:
        """The finished answer of ``name`` (removed), or None if there is none (yet)."""
        with self._cv:
            return self._done.pop(name, None)

    def wait(self, name: str, timeout: float) -> Answer | None:
        """Block until ``name`` is answered (tests and a forced tick); the answer, removed."""
        with self._cv:
            self._cv.wait_for(lambda: name in self._done or name not in self._busy, timeout)
            return self._done.pop(name, None)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                name, job, asked = self._queue.pop(0)
            started = time.monotonic()
            try:
                answer = Answer(run_with_consumers(self._make, job), None, asked, started)
            except BaseException as exc:  # handed to the tick, which raises it on the poll loop
                answer = Answer(None, exc, asked, started)
            with self._cv:
                self._busy.discard(name)
                self._done[name] = answer
                self._cv.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread after the read in progress (its answer is dropped)."""
        with self._cv:
            self._closed = True
            self._queue.clear()
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
