"""The ledger worker: ``deltas`` in, exact per-head ledgers, head updates and receipts out.

``LedgerWorker`` is the processor the runtime's poll loop (runtime/poll_loop.py) runs;
each step is delegated to the module named for it:

1. on assignment, ``Recovery`` (recovery.py) rebuilds each partition from its checkpoint and
   resumes it at its floor, after making sure the state belongs to the log (docs/design.md
   section 4); the partitions are held in ``OwnedPartitions`` (owned_partitions.py);
2. poll up to 500 ``deltas`` messages, handed out one partition at a time, a delete lane's first
   (``DeltasPoller``, deltas_poller.py);
3. ``DeltaFold`` (delta_fold.py) folds each message into its head's exact ledger (one version per
   message; dead letters for what it refuses; a new head's gamma from ``ContractGammas``,
   contract_gammas.py); the heads with a lane's delta first, then the rest (``lane_first``);
4. ``Outputs`` (outputs.py) publishes what the poll owes: per touched head, the fast head catches
   up once, one head update (its last version), the receipts of every applied delete; a failed
   delivery stops the worker (``DeliveryError``); steps 3 and 4 run for the lanes' heads, then
   for the rest; a poll that fetched nothing multiplies instead a step of the exact products
   the folds left waiting (``idle``), and the next poll does not wait while any are left;
5. ``TimedResets`` (timed_resets.py) resets fast heads older than ``reset_every_seconds`` and
   publishes them as exact (the reset computed in a thread, from copies taken on this one);
6. ``Checkpointer`` (checkpointer.py) makes each partition durable when due: every
   ``checkpoint_every_messages`` / ``checkpoint_every_seconds`` (its snapshots written by a
   writer thread while the loop goes on), on an erasure rotation, and before a partition is
   given up;
7. superseded state and heads generations are retired once their grace is over
   (``ChangelogStore``, changelog_store.py).

Why not faust: its offset bookkeeping commits past an unacked message when acks have a gap
(faust-streaming #312, #606), can resume fetching before seeking to committed offsets (#216),
its exactly-once mode cannot start on the embedded broker, and its group join there is slow.
Kafka Streams' model (state in a changelog topic, restore before processing) is kept; the worker
owns its offsets so that exactness does not depend on a framework's.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from unlearn.common.key_tail import KeyTail
from unlearn.infra import tracing
from unlearn.infra.cli_args import log_ready
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.infra.worker_metrics import BATCH_BUCKETS, WorkerMetrics
from unlearn.runtime import clients
from unlearn.runtime.log_position import StaleStateError, topic_id
from unlearn.runtime.poll_loop import PollLoop
from unlearn.streams.ledger.changelog_store import ChangelogStore
from unlearn.streams.ledger.checkpointer import Checkpointer
from unlearn.streams.ledger.contract_gammas import ContractGammas
from unlearn.streams.ledger.delta_fold import DeltaFold
from unlearn.streams.ledger.deltas_poller import DeltasPoller, holds_lane, lane_first
from unlearn.streams.ledger.head_runtime import HeadConfig
from unlearn.streams.ledger.outputs import Outputs, PollOutputs
from unlearn.streams.ledger.owned_partitions import OwnedPartitions
from unlearn.streams.ledger.recovery import Recovery
from unlearn.streams.ledger.row_opener import RowOpener
from unlearn.streams.ledger.settings import LedgerSettings
from unlearn.streams.ledger.timed_resets import TimedResets

__all__ = [
    "LEDGER_OUTCOMES",
    "LedgerWorker",
    "run_ledger_worker",
]

log = logging.getLogger("unlearn.ledger")


#: Rows one idle turn multiplies (exact products: ~2.3 ms at d = 768 on one core) or folds into a
#: fast head's factor (~4 ms): the longest a message fetched meanwhile waits for them
#: (bench/results/pipeline_bench.md sections 33 and 36).
IDLE_STEP_ROWS = 64

#: The ledger's counters that are outcomes of a deltas message (``unlearn_ledger_events_total``).
LEDGER_OUTCOMES = {"applied": "applied", "skipped": "skipped_redelivered"}


class LedgerWorker:
    """One ledger worker process (one consumer-group member): the poll loop (module docstring)."""

    def __init__(self, settings: Settings, worker_id: str = "ledger-0", metrics: WorkerMetrics | None = None) -> None:

        self.settings = settings
        self.worker_id = worker_id
        self.deltas_topic = settings.topic("deltas")
        self.group = f"{settings.topic_prefix}ledger"
        self.metrics = metrics or WorkerMetrics("ledger")
        self.stats = {"applied": 0, "skipped": 0, "deadletters": 0, "deletes_applied": 0, "head_updates": 0}
        self.metrics.count(self.stats, LEDGER_OUTCOMES)
        # seconds the partition's processed messages have waited for a checkpoint (0: none waits)
        self.metrics.checkpoint_ages(lambda: {(self.deltas_topic, ps.partition): time.monotonic() - ps.last_checkpoint
                                              if ps.pending else 0.0 for ps in self.owned})
        self.delete_lag = self.metrics.histogram(
            "delete_to_head_published_seconds", "From a delete's deltas message (its Kafka timestamp) to the "
            "production of the head update that applied it.")
        self.consumer = clients.consumer(settings, self.group, **self.metrics.consumer_settings(), **{
            "client.id": worker_id,
            # Eager rebalances: every partition is checkpointed and given up, then reassigned and
            # rebuilt from its checkpoint. Simple to reason about; rebuilding costs the state size.
            "partition.assignment.strategy": "roundrobin",
        })
        # linger.ms=0: a poll's head update and receipts go out at once (librdkafka's default
        # 5 ms linger was on every delete->head path; each poll produces a few messages anyway)
        self.producer = clients.producer(settings, **{"client.id": worker_id, "linger.ms": 0})
        self.store = ChangelogStore(settings)
        self.contracts = ContractGammas(settings)
        self.owned = OwnedPartitions()
        self.outputs = Outputs(settings, self.producer, self.store, self.stats)
        self.tuning = LedgerSettings.of(settings)
        config = HeadConfig(HeadSettings.of(settings).gamma, self.tuning.reset_every_events,
                            self.tuning.drift_threshold, self.tuning.product_hold_rows,
                            self.tuning.factor_hold_rows)
        self.keys = KeyTail(settings)  # new keys in memory before their rows arrive (shared/key_tail.py)
        self.fold = DeltaFold(settings, self.owned, self.outputs, self.contracts, RowOpener(settings, tail=self.keys),
                              config)
        self.recovery = Recovery(settings, self.consumer, self.store, self.outputs, config)
        self.resets = TimedResets(self.outputs, config, self.tuning.reset_every_seconds, self.tuning.reset_in_thread)
        self.checkpointer = Checkpointer(settings, self.consumer, self.store, self.outputs,
                                         _CheckpointTimes(self.metrics))
        self.topic_id = ""
        self.failed = False  # a failure stopped the loop: revocations must not checkpoint (abandon)
        self._stop = threading.Event()
        self.on_ready: Callable[[], object] | None = None  # once, when first assigned (run_ledger_worker's)
        self._idle_work = False  # a turn folded since the last idle step that found nothing to do
        self.poller = DeltasPoller(busy=lambda: self._idle_work)
        self.loop = PollLoop(self.consumer, self, self.poller)

    @property
    def ready(self) -> bool:
        return self.loop.ready.is_set()

    @property
    def fatal(self) -> BaseException | None:
        return self.loop.fatal

    # ---------------------------------------------------------------- the poll loop
    def run(self) -> None:
        """Process until ``stop()`` (or SIGTERM/SIGINT in ``run_ledger_worker``): the runtime's
        poll loop (runtime/poll_loop.py) calls the steps below."""
        self.topic_id = topic_id(self.settings, self.deltas_topic)
        self.contracts.start()
        self.keys.start()
        self.loop.subscribe([self.deltas_topic])
        self.loop.run(self._stop)

    def stop(self) -> None:
        self._stop.set()

    def process(self, batch: list[Any]) -> None:
        """Steps 3 and 4: fold each message, then publish what the poll owes; the heads with a
        lane's delta folded and published first (``lane_first``)."""
        started = time.perf_counter()
        fresh = self._fresh(batch)
        for part in lane_first([(m.key(), holds_lane(m.value())) for m in fresh]):
            if part:
                poll = PollOutputs()
                for i in part:
                    self._on_message(fresh[i], poll)
                self._publish_poll(poll)  # before any checkpoint can cover these messages
        self._idle_work = True  # the folds may have left work waiting (``idle``)
        self.metrics.batch_duration.observe(time.perf_counter() - started)

    def idle(self) -> None:
        """Nothing fetched: one step (``IDLE_STEP_ROWS``) of the work the folds left waiting (exact
        products, ``product_hold_rows``; factor rows, ``factor_hold_rows``), so that it is off the
        path of the next message."""
        left = IDLE_STEP_ROWS
        for ps in self.owned:
            for head in ps.heads.values():
                left -= head.idle_work(left)
                if left <= 0:
                    return
        # nothing done: nothing waits until a turn folds, and the poller waits for messages
        # again (asking every head on every poll would cost O(heads) per poll)
        self._idle_work = left < IDLE_STEP_ROWS

    def tick(self) -> None:
        """Steps 5 to 7, after every poll."""
        self.outputs.serve()
        self.resets.tick(self.owned)
        self.checkpointer.advance(self.owned)
        for part, erasure in self.checkpointer.due(self.owned):
            self.checkpoint(part, erasure, background=True)
        self.store.retire_due()

    def finish(self) -> None:
        for ps in sorted(self.owned, key=lambda ps: ps.partition):
            self.checkpointer.settle(ps)
            if ps.pending:
                self.checkpoint(ps.partition)

    def abandon(self) -> None:
        # No checkpoint may be taken from state that a failure left half changed (a rotation that
        # stopped between its steps would write a checkpoint naming pieces of two generations), and
        # closing the consumer revokes the partitions: the restart recovers instead.
        self.failed = True

    def _fresh(self, batch: list[Any]) -> list[Any]:
        """The messages to fold, counted in their partitions' next offset and pending (all before
        folding any, as ``lane_first`` may fold them out of log order); the others are skipped:
        not ours (any more), or already covered by the partition's state."""
        fresh = []
        for m in batch:
            ps = self.owned.get(m.partition())
            if ps is None or m.offset() < ps.next_offset:
                self.stats["skipped"] += 1
                continue
            ps.next_offset = m.offset() + 1
            ps.pending += 1
            fresh.append(m)
        return fresh

    def _on_message(self, m: Any, poll: PollOutputs) -> None:
        poll.record_ts = m.timestamp()[1] / 1000.0
        poll.read_trace(m.headers())
        self.fold.fold(self.owned[m.partition()], m.offset(), m.key(), m.value() or b"", poll)

    def _publish_poll(self, poll: PollOutputs) -> None:
        self.outputs.publish_poll(poll)
        now = time.time()
        for ts in poll.delete_ts:
            if ts > 0:  # a message without a timestamp (-1) says nothing of its lag
                self.delete_lag.observe(max(0.0, now - ts))
        self.stats["applied"] += sum(len(o) for o in poll.outcomes.values())
        self.stats["deletes_applied"] += len(poll.delete_ts)

    def checkpoint(self, part: int, erasure: bool = False, background: bool = False) -> None:
        """Make ``part``'s processed messages durable (``Checkpointer``; ``erasure``: rotate its
        state and head updates away from before the deletes it applied; ``background``: its
        snapshots written while the loop goes on)."""
        self.checkpointer.checkpoint(self.owned[part], self.topic_id, erasure, background)

    def close(self, clean: bool) -> None:
        self.resets.close()
        self.checkpointer.close()
        clients.close_producer(self.producer, self.settings.admin_timeout)
        self.store.close()
        self.contracts.stop()
        self.keys.stop()

    # ---------------------------------------------------------------- rebalances
    def assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Step 1: rebuild each partition from its checkpoint, resume at its floor."""
        started = time.monotonic()
        self.poller.drop({tp.partition for tp in partitions})  # read again from their floors
        for tp in partitions:
            ps = self.recovery.recover(tp.partition, self.topic_id)
            self.owned.add(ps)
            tp.offset = ps.next_offset
        consumer.assign(partitions)
        owned = sorted(self.owned.states)
        took = time.monotonic() - started
        if not self.loop.ready.is_set():
            log_ready("ledger", worker=self.worker_id, group=self.group, deltas_topic=self.deltas_topic,
                      partitions=owned, recovery_s=round(took, 3))
            if self.on_ready is not None:
                self.on_ready()
        else:
            log.info("assigned deltas partitions %s (rebuilt in %.3fs)", owned, took)

    def revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Checkpoint what is not durable yet (not after a failure), then drop the state."""
        self.poller.drop({tp.partition for tp in partitions})
        failure: BaseException | None = None
        for tp in partitions:
            ps = self.owned.get(tp.partition)
            if ps is not None and not self.failed and failure is None:
                try:
                    self.checkpointer.settle(ps)
                    if ps.pending:  # nothing new: durable
                        self.checkpoint(tp.partition)
                except Exception as exc:  # raised by the loop once every partition is dropped
                    failure = exc
            self.checkpointer.forget(tp.partition)
            self.owned.drop(tp.partition)
        if failure is not None:
            raise failure

    def lost(self, consumer: Any, partitions: list[Any]) -> None:
        # Another worker owns them now: writing state for them could race its writes.
        self.poller.drop({tp.partition for tp in partitions})
        for tp in partitions:
            log.warning("deltas partition %d lost (session timeout); dropping its state", tp.partition)
            self.checkpointer.forget(tp.partition)
            self.owned.drop(tp.partition)


class _CheckpointTimes:
    """A checkpoint's times as two histograms: how long it held its partition (the poll thread's
    part) and how long until its record was durable (the writer thread's part included)."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.pause = metrics.histogram("checkpoint_pause_seconds", "Seconds a checkpoint held its partition's "
                                       "processing (the poll thread's part).", BATCH_BUCKETS)
        self.duration = metrics.histogram("checkpoint_duration_seconds", "Seconds from a checkpoint's start to its "
                                          "record being durable.", BATCH_BUCKETS)

    def observe(self, pause: float, duration: float) -> None:
        self.pause.observe(pause)
        self.duration.observe(duration)


def run_ledger_worker(settings: Settings, worker_id: str = "ledger-0", loglevel: str = "info",
                      metrics: WorkerMetrics | None = None) -> int:
    """Run one ledger worker until SIGINT/SIGTERM; 0 on a clean stop, 2 on state that does not
    match the log (the message names the mismatch)."""
    from threadpoolctl import threadpool_limits

    from unlearn.runtime.heap import freeze_heap
    from unlearn.runtime.topics import create_topics

    # Per-message work is O(d^2) BLAS-2/3 on small operands: a second BLAS thread buys little and,
    # when another process holds a core, stalls each call by milliseconds (bench/ledger_bench s.0).
    with threadpool_limits(limits=LedgerSettings.of(settings).ledger_blas_threads, user_api="blas"):
        create_topics(settings)
        tracing.configure_from_env("unlearn-ledger")
        worker = LedgerWorker(settings, worker_id, metrics)
        worker.on_ready = freeze_heap  # this process's long-lived heap: out of the collector's full passes
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        try:
            worker.run()
        except StaleStateError as exc:
            log.error("%s", exc)
            return 2
    log.info("ledger worker %r stopped", worker_id)
    return 0
