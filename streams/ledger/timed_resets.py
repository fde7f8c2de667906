"""Canonical heads on a clock (:class:`TimedResets`): a fast head older than
``reset_every_seconds`` is reset and published as an exact update, the reset computed in a thread.

Why a thread: at d = 768 a reset (the factor, W), its digest and its posterior cost ~60 ms of
CPU, and publishing them ~4.8 MB; on the poll thread every delete of the worker's partitions
waited for them, and under a flow of adds they made the slowest deletes (bench/results/
pipeline_bench.md, section 24). The poll thread now takes copies of the head's state at its
version v (a few ms), the thread computes the canonical head of those copies, and a later tick
publishes it as the exact update of version v: an active head still gets an exact update every
few seconds. The drift measured there (the fast W served at v against the canonical one) becomes
the fast head's published ``drift``. When the head took few rows since (at most d / 8, or 16), it
adopts the canonical factor moved by them (``TrackedHead.adopt``; exact when none); under a
steady flow it took more, and moving the factor by them again would cost the poll thread what
the reset saved, so the fast head goes on, measured (its periodic and drift resets bound it, as
before). Readers keep the newest update by
``(version, exact > fast)``, so an exact v that arrives after a fast v + k is a certificate of v
and changes no served head.

A reset that ran since the copies were taken (a refused downdate, coalesced rows) voids the
job: the head is canonical at a later version already. A heads rotation since (a size bound, or
an erasure rotation after a delete) keeps the exact v from being published: it is older than
what the rotation left, and nothing from before a delete may outlive the rotation
(docs/erasure.md); the head still adopts the factor. One job at a time, the most overdue head
first: one copy of state in memory, at most one core of resets. ``UNLEARN_RESET_IN_THREAD=false``
resets on the poll thread instead.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from unlearn.schemas.head import HeadUpdate
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime, ResetCopy, canonical_copy
from unlearn.streams.ledger.outputs import Outputs, head_update
from unlearn.streams.ledger.owned_partitions import OwnedPartitions, PartitionState

__all__ = [
    "TimedResets",
]

log = logging.getLogger("unlearn.ledger")

#: A head adopts a reset's factor when it took at most this many rows since the copies (or d / 8):
#: moving the factor by them costs the poll thread ~0.05-0.15 ms per row at d = 768.
ADOPT_ROWS = 16


@dataclass(frozen=True)
class _Canonical:
    """What the thread made of a job's copies: the canonical head, the fast head's drift from
    it, and its exact update encoded."""

    head: HeadRuntime
    drift: float
    update: HeadUpdate
    value: bytes


@dataclass(frozen=True)
class _Job:
    ps: PartitionState
    head: HeadRuntime
    start: ResetCopy
    rewrites: int  # the partition's heads rewrites begun when the copies were taken
    done: Future[_Canonical]


class TimedResets:
    """The ledger worker's step 5 (streams/ledger/worker.py): start, finish and publish the
    timer's resets (module docstring)."""

    def __init__(self, outputs: Outputs, config: HeadConfig, every_seconds: float, in_thread: bool) -> None:
        self.outputs = outputs
        self.config = config
        self.every_seconds = every_seconds
        self.in_thread = in_thread
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-reset") if in_thread else None
        self._job: _Job | None = None
        self.voided = 0  # jobs a reset since their copies made void (tests read it)
        self.adopted = 0  # jobs whose factor the head adopted

    def tick(self, owned: OwnedPartitions) -> None:
        """Publish and adopt the reset the thread finished, if any; then start the next one due
        (on the poll thread, every one due, when ``in_thread`` is off)."""
        if self._thread is None:
            for ps, head in self._due(owned):
                head.reset("timer")
                self.outputs.publish_head(ps.partition, head)
            return
        if self._job is not None and self._job.done.done():
            job, self._job = self._job, None
            self._finish(owned, job, job.done.result())  # a failure raises: the worker stops, as a reset would
        if self._job is None:
            for ps, head in self._due(owned):
                start = head.begin_reset()
                if start is not None:
                    self._job = _Job(ps, head, start, self._rewrites(ps.partition),
                                     self._thread.submit(self._compute, start))
                    return

    def close(self) -> None:
        """Drop the job in progress, if any (nothing is published after this)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
        self._job = None

    def _due(self, owned: OwnedPartitions) -> list[tuple[PartitionState, HeadRuntime]]:
        """Fast heads last reset ``every_seconds`` ago or more, the most overdue first."""
        now = time.monotonic()
        due = [(ps, h) for ps in owned for h in ps.heads.values() if h.timed_reset_due(self.every_seconds, now)]
        return sorted(due, key=lambda x: x[1].last_reset_at)

    def _compute(self, start: ResetCopy) -> _Canonical:
        """In the thread: the canonical head of the copies and its exact update, encoded."""
        head, drift = canonical_copy(start, self.config)
        update = head_update(head, "exact", posterior=self.outputs.publish_posterior)
        update = replace(update, weights=update.weights.copy())  # adopting moves the tracker's W in place
        return _Canonical(head, drift, update, self.outputs.encode_update(update))

    def _finish(self, owned: OwnedPartitions, job: _Job, done: _Canonical) -> None:
        ps = job.ps
        if owned.get(ps.partition) is not ps or ps.heads.get(job.head.head_id) is not job.head:
            return  # the partition was given up meanwhile: its state is another's now
        taken = job.head.end_reset(job.start, done.head, done.drift, max(ADOPT_ROWS, job.head.ledger.dim // 8))
        if not taken:
            self.voided += 1
            log.debug("head %r: timer reset of version %d void (a reset ran since)", job.head.head_id,
                      done.update.version)
            return
        self.adopted += taken == "adopted"
        published = job.rewrites == self._rewrites(ps.partition)
        if published:
            self.outputs.publish_update(ps.partition, done.update, done.value)
        if job.head.mode == "exact" and (job.head.version != done.update.version or not published):
            # no rows since, yet messages (refused entries only), or a rotation since: the exact
            # update of the version served, from the head itself
            self.outputs.publish_head(ps.partition, job.head)

    def _rewrites(self, part: int) -> int:
        return self.outputs.store.heads_rewrites.get(part, 0)
