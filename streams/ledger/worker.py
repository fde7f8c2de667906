"""The ledger worker: ``deltas`` in, exact per-head ledgers, head updates and receipts out.

A thin shell around ``HeadRuntime`` (the rules), ``checkpoint`` (the crash-consistency
invariants) and ``ChangelogStore`` (durable state in the ``ledger-state`` topic). Per deltas
message (key = head id, so one head's deltas are totally ordered): decode -> apply to the head's
exact ledger and multiset hash (one version) -> dead letters for rejected entries. Per poll
(coalescing): each touched head's fast head catches up once, then one head update per head (its
last version) and the receipts of every applied delete, each naming the version of the message
that applied it. Every ``checkpoint_every_messages`` / ``checkpoint_every_seconds`` per
partition, and before a partition is given up:

1. wait until every output produced so far is durable (so no receipt can be lost behind a floor);
2. write a snapshot of every head touched since the last checkpoint to ``ledger-state``;
3. write the partition's checkpoint record (floor = next offset to read, by ``safe_floor``);
4. commit the floor to the consumer group (for lag monitoring only: recovery never reads it).

A partition that applied a delete is rotated (``ledger-state`` and ``heads`` to new generations,
the old ones deleted) ``UNLEARN_ERASURE_ROTATE_SECONDS`` after the first delete of the window, so
no snapshot or head update taken before a delete outlives it by more than that plus the heads'
retire grace (docs/ledger-processor.md, "Erasure rotation").

On assignment a partition is rebuilt from its checkpoint and resumed at its floor, after
``check_recovery`` made sure the state belongs to the log (docs/design.md section 4).

Why not faust: its offset bookkeeping commits past an unacked message when acks have a gap
(faust-streaming #312, #606), can resume fetching before seeking to committed offsets (#216),
its exactly-once mode cannot start on the embedded broker, and its group join there takes
~30 s. Kafka Streams' model (state in a changelog topic, restore before processing) is kept;
the worker owns its offsets so that exactness does not depend on a framework's.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from unlearn.infra.between_stages import Checkpoint, HeadPointer
from unlearn.infra.cli_args import log_ready
from unlearn.infra.log_position import StaleStateError, log_bounds, topic_id
from unlearn.infra.profiles import consumer_config, producer_config
from unlearn.infra.settings import Settings
from unlearn.ledger.tracked import HeadMode
from unlearn.schemas.deadletter import DeadLetter, encode_deadletter_bounded
from unlearn.schemas.delta_codec import CodecError, Delta, decode_delta
from unlearn.schemas.head_codec import HeadUpdate, encode_head
from unlearn.schemas.receipts import Receipt, encode_receipt
from unlearn.schemas.redaction import redact_delta
from unlearn.schemas.sealed import SealError

from .checkpoint import check_recovery, safe_floor
from .contracts import ContractGammas
from .head_runtime import ApplyOutcome, HeadConfig, HeadRuntime, Rejection, creates_head, group_by_event
from .state_store import ChangelogStore
from .unseal import RowOpener

log = logging.getLogger("unlearn.ledger")

STAGE = "ledger"


class LedgerWorkerError(RuntimeError):
    """The worker cannot go on safely (an output could not be delivered, state does not match)."""


@dataclass
class PartitionState:
    """What the worker holds for one ``deltas`` partition it owns."""

    partition: int
    next_offset: int  # next deltas offset to process
    heads: dict[str, HeadRuntime] = field(default_factory=dict)
    pointers: dict[str, HeadPointer] = field(default_factory=dict)  # latest durable snapshot per head
    last_touched: dict[str, int] = field(default_factory=dict)  # head -> offset of its last message since checkpoint
    pending: int = 0  # messages processed since the last checkpoint
    last_checkpoint: float = field(default_factory=time.monotonic)
    # When the first delete since the partition's last erasure rotation was applied (monotonic;
    # None: none). UNLEARN_ERASURE_ROTATE_SECONDS later, one rotation covers every delete since.
    erasure_since: float | None = None


@dataclass
class PollOutputs:
    """What one poll's applied messages owe, per head in the order first touched: the head
    (published once, at its last version) and its messages' outcomes in log order (receipts)."""

    heads: dict[str, HeadRuntime] = field(default_factory=dict)
    outcomes: dict[str, list[ApplyOutcome]] = field(default_factory=dict)

    def add(self, head: HeadRuntime, outcome: ApplyOutcome) -> None:
        self.heads[head.head_id] = head
        self.outcomes.setdefault(head.head_id, []).append(outcome)


class LedgerWorker:
    """One ledger worker process (one consumer-group member)."""

    def __init__(self, settings: Settings, worker_id: str = "ledger-0") -> None:
        from confluent_kafka import Consumer, Producer

        self.settings = settings
        self.worker_id = worker_id
        self.deltas_topic = settings.topic("deltas")
        self.receipts_topic = settings.topic("receipts")
        self.deadletter_topic = settings.topic("deadletter")
        self.group = f"{settings.topic_prefix}ledger"
        self.consumer = Consumer(consumer_config(settings, self.group, **{
            "client.id": worker_id,
            # Eager rebalances: every partition is checkpointed and given up, then reassigned and
            # rebuilt from its checkpoint. Simple to reason about; rebuilding costs the state size.
            "partition.assignment.strategy": "roundrobin",
        }))
        # linger.ms=0: a poll's head update and receipts go out at once (librdkafka's default
        # 5 ms linger was on every delete->head path; each poll produces a few messages anyway)
        self.producer = Producer(producer_config(settings, **{"client.id": worker_id, "linger.ms": 0}))
        self.store = ChangelogStore(settings)
        self.contracts = ContractGammas(settings)  # a new head's gamma: its contract's
        self.opener = RowOpener(settings)  # sealed rows -> rows (docs/erasure.md)
        self.partitions: dict[int, PartitionState] = {}
        self.head_partition: dict[str, int] = {}
        self.topic_id = ""
        self.delivery_errors: list[str] = []
        self.fatal: BaseException | None = None
        self.ready = False
        self.stopping = False
        self.on_ready: Callable[[], None] | None = None

    # ---------------------------------------------------------------- lifecycle
    def run(self) -> None:
        """Process until ``stop()`` (or SIGTERM/SIGINT in ``run_ledger_worker``)."""
        self.topic_id = topic_id(self.settings, self.deltas_topic)
        self.contracts.start()
        self.consumer.subscribe([self.deltas_topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        try:
            while not self.stopping:
                msgs = self._poll()
                self._raise_if_fatal()
                poll = PollOutputs()
                for m in msgs:
                    self._on_message(m, poll)
                self._publish_poll(poll)  # before any checkpoint can cover these messages
                self.producer.poll(0)
                self._raise_if_delivery_failed()
                self._timed_resets()
                self._checkpoint_due()
                self.store.retire_due()
            self._checkpoint_all()
        except BaseException as exc:
            # Closing the consumer revokes the partitions: no checkpoint may be taken from state
            # that a failure left half changed (a rotation that stopped between its steps would
            # write a checkpoint naming pieces of two generations). The restart recovers instead.
            if self.fatal is None:
                self.fatal = exc
            raise
        finally:
            self._close()

    def stop(self) -> None:
        self.stopping = True

    def _poll(self) -> list[Any]:
        """Up to 500 deltas messages: whatever is already fetched, waiting at most 50 ms for the
        first. A single ``consume(500, 0.05)`` would hold a lone message for the whole 50 ms
        (librdkafka waits for a full batch or the timeout); coalescing takes what is pending only."""
        first = self.consumer.consume(num_messages=1, timeout=0.05)
        if not first:
            return first
        return first + self.consumer.consume(num_messages=499, timeout=0)

    def _close(self) -> None:
        try:
            self.consumer.close()  # leaves the group: the others rebalance at once
        except Exception as exc:  # closing after a fatal error: nothing more to save
            log.debug("consumer close: %s", exc)
        self.producer.flush(self.settings.admin_timeout)
        self.store.close()
        self.contracts.stop()

    def _raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    def _raise_if_delivery_failed(self) -> None:
        if self.delivery_errors:
            # An output that cannot be delivered must not be covered by a checkpoint: stop, and
            # the restart replays from the last floor (nothing lost, nothing doubled).
            raise LedgerWorkerError(f"output delivery failed: {self.delivery_errors[:3]}")

    # ---------------------------------------------------------------- rebalances
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        started = time.monotonic()
        try:
            for tp in partitions:
                ps = self._recover(tp.partition)
                self.partitions[tp.partition] = ps
                tp.offset = ps.next_offset
            consumer.assign(partitions)
        except Exception as exc:  # surfaced from run(): never process a partition we could not rebuild
            self.fatal = exc
            consumer.assign([])
            return
        owned = sorted(self.partitions)
        took = time.monotonic() - started
        if not self.ready:
            self.ready = True
            log_ready("ledger", worker=self.worker_id, group=self.group, deltas_topic=self.deltas_topic,
                      partitions=owned, recovery_s=round(took, 3))
            if self.on_ready is not None:
                self.on_ready()
        else:
            log.info("assigned deltas partitions %s (rebuilt in %.3fs)", owned, took)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        for tp in partitions:
            ps = self.partitions.get(tp.partition)
            if ps is not None and ps.pending and self.fatal is None:  # nothing new: already durable
                try:
                    self.checkpoint(tp.partition)
                except Exception as exc:
                    self.fatal = exc
            self._drop(tp.partition)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        # Another worker owns them now: writing state for them could race its writes.
        for tp in partitions:
            log.warning("deltas partition %d lost (session timeout); dropping its state", tp.partition)
            self._drop(tp.partition)

    def _drop(self, partition: int) -> None:
        ps = self.partitions.pop(partition, None)
        if ps is not None:
            for head_id in ps.heads:
                self.head_partition.pop(head_id, None)

    def _recover(self, partition: int) -> PartitionState:
        """Rebuild a partition from its checkpoint and check it belongs to the log (invariant 2)."""
        cp, heads = self.store.recover(partition)
        log_start, log_end = log_bounds(self.settings, self.consumer, self.deltas_topic, partition,
                                        cp.floor if cp is not None else 0)
        floor = check_recovery(cp, self.topic_id, log_start, log_end)
        ps = PartitionState(partition, floor)
        superseded = self.store.begin_heads_generation(partition, fresh=True)
        for head_id, state in heads.items():
            head = HeadRuntime.from_snapshot(state, self._head_config(None))
            if head.multiset is None:
                log.warning("head %r: the multiset hash of its retained rows is unknown (a packed entry without "
                            "one): head updates and receipts carry none", head_id)
            ps.heads[head_id] = head
            self.head_partition[head_id] = partition
            # The last update a reader saw may be a fast one that its writer never got to reset:
            # republish the restored version as canonical (same version, same digest).
            if head.mode == "fast":
                head.reset("restored")
            self.publish_head(head, "exact")
        # The republished heads went to a new heads generation: the older ones hold nothing a
        # reader still needs once those are durable (infra.topic_family).
        self._flush_outputs("recovery")
        self.store.end_heads_generation(superseded)
        if cp is not None:
            ps.pointers = dict(cp.heads)
            if cp.erasure_pending and self.settings.erasure_rotate_seconds > 0:
                # A delete made durable before the crash, not yet rotated away: its window restarts
                # now (a delete past the floor is replayed, and marks the partition again).
                ps.erasure_since = time.monotonic()
        log.info("deltas partition %d: %d heads restored, resuming at offset %d", partition, len(ps.heads), floor)
        return ps

    # ---------------------------------------------------------------- the fold
    def _head_config(self, head_id: str | None) -> HeadConfig:
        """A head's runtime settings: a new head's gamma is its contract's (None: a restored head,
        whose gamma is in its state)."""
        s = self.settings
        gamma = self.contracts.gamma(head_id) if head_id is not None else s.gamma
        return HeadConfig(gamma, s.reset_every_events, s.drift_threshold)

    def _on_message(self, m: Any, poll: PollOutputs) -> None:
        from confluent_kafka import KafkaError

        err = m.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("deltas consumer: %s", err)
            return
        ps = self.partitions.get(m.partition())
        if ps is None or m.offset() < ps.next_offset:
            return  # not ours (any more), or already covered by the partition's state
        ps.next_offset = m.offset() + 1
        ps.pending += 1
        self.handle(ps, m.offset(), m.key(), m.value() or b"", poll)

    def handle(self, ps: PartitionState, offset: int, key: bytes | None, raw: bytes, poll: PollOutputs) -> None:
        """Fold one deltas message (already counted in ``ps``) into its head's ledger; its head
        update and receipts are owed in ``poll``, its dead letters go out now."""
        part = ps.partition
        try:
            delta = decode_delta(raw)
            if key and key.decode("utf-8", "replace") != delta.head_id:
                raise CodecError(f"message key {key!r} is not the head id {delta.head_id!r}: "
                                 "deltas must be keyed by head id to stay ordered")
            # Creation is decided on the message as sent: a first message whose adds are all erased
            # (keys destroyed since) still created the head, with the grid its header carries.
            creates = creates_head(delta)
            delta = self.opener.open(delta).delta
        except (CodecError, SealError) as exc:
            self._deadletter(DeadLetter(self._dead_original(raw), "bad_delta", str(exc), STAGE, self.deltas_topic,
                                        part, offset, key, None, time.time()))
            return
        owner = self.head_partition.get(delta.head_id)
        if owner is not None and owner != part:
            self._reject_all(delta, raw, part, offset, key, "wrong_partition",
                             f"head {delta.head_id!r} lives on deltas partition {owner}, not {part}: "
                             "a head's deltas must share one partition (key them by head id)")
            return
        head = ps.heads.get(delta.head_id)
        if head is None:
            if not creates:
                self._reject_all(delta, raw, part, offset, key, "unknown_head",
                                 f"head {delta.head_id!r} does not exist yet: its first event must be an add")
                return
            head = HeadRuntime.new(delta.head_id, delta, self._head_config(delta.head_id))
            ps.heads[delta.head_id] = head
            self.head_partition[delta.head_id] = part
            log.info("head %r created (d=%d)", delta.head_id, delta.d)
        outcome = head.apply(delta, offset, part)
        ps.last_touched[head.head_id] = offset
        if outcome.deletes and ps.erasure_since is None and self.settings.erasure_rotate_seconds > 0:
            ps.erasure_since = time.monotonic()
        if outcome.skipped:
            log.info("head %r: offset %d/%d skipped (%s)", head.head_id, part, offset, outcome.skipped)
            return
        original = self._dead_original(raw) if outcome.rejections else raw
        for rej in outcome.rejections:
            self._rejected(head.head_id, rej, original, part, offset, key)
        poll.add(head, outcome)

    # ---------------------------------------------------------------- outputs
    def _produce(self, topic: str, key: bytes, value: bytes) -> None:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                self.delivery_errors.append(f"{topic}: {err}")

        while True:
            try:
                self.producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                return
            except BufferError:
                self.producer.poll(0.1)

    def head_update(self, head: HeadRuntime, mode: HeadMode | None = None) -> HeadUpdate:
        """The head's update at its version. Only an exact update carries the ledger digest (the
        certificate, O(d^2)); a fast one carries the retained-rows hash alone. ``drift`` is this
        W's deviation from the canonical solve as the ledger knows it: 0.0 on an exact update (it
        is the canonical solve), the fast path's last measured deviation on a fast one.
        ``retained_classes`` comes from the ledger's exact per-class counts."""
        mode = mode or head.mode
        exact = mode == "exact"
        posterior = head.tracked.tracker.T if (exact and self.settings.publish_posterior) else None
        return HeadUpdate(
            head_id=head.head_id, version=head.version, mode=mode, digest=head.digest() if exact else None,
            n_retained=head.ledger.count, events_covered=head.events_covered,
            offsets=((head.input_partition, head.applied_offset),), drift=0.0 if exact else float(head.fast_drift),
            gamma=head.config.gamma, created_ts=time.time(), weights=head.weights, posterior=posterior,
            retained_hash=head.retained_hash(), contract_version=head.contract_version,
            retained_classes=head.retained_classes())

    def publish_head(self, head: HeadRuntime, mode: HeadMode | None = None) -> bool:
        """Produce the head's update; False if it cannot fit in a message even without the
        posterior. Then the state stays exact and a dead letter says why: a head too large to
        publish must not stop the worker (and every head on its partition) in a crash loop."""
        part = self.head_partition[head.head_id]
        update = self.head_update(head, mode)
        value = encode_head(update)
        limit = self.settings.max_message_bytes
        if len(value) > limit and update.posterior is not None:
            value = encode_head(replace(update, posterior=None))
            log.warning("head %r version %d: published without its posterior (%d bytes over the limit)",
                        head.head_id, head.version, len(value) - limit)
        if len(value) > limit:
            detail = (f"head {head.head_id!r} version {head.version} (d={head.ledger.dim}, c={head.ledger.n_outputs}) "
                      f"encodes to {len(value)} bytes, over UNLEARN_MAX_MESSAGE_BYTES={limit}: not published")
            self._deadletter(DeadLetter(b"", "head_too_large", detail, STAGE, self.store.heads_topic(part), None,
                                        None, head.head_id.encode(), None, time.time()))
            return False
        key = head.head_id.encode()
        self._produce(self.store.heads_topic(part), key, value)
        self.store.count_head_bytes(part, len(key) + len(value))
        return True

    def _publish_poll(self, poll: PollOutputs) -> None:
        """Per head touched in the poll: the fast head catches up once, one head update (the last
        version), then the receipt of every applied delete. A receipt names the version of the
        message that applied it and that version's retained-rows hash, never the published
        version: those depend on poll boundaries, so replays would issue conflicting receipts."""
        for head_id, head in poll.heads.items():
            head.sync()
            self.publish_head(head)
            now = time.time()
            for outcome in poll.outcomes[head_id]:
                for d in outcome.deletes:
                    r = Receipt.applied(d.event_id, d.subject_id, head_id, d.sample_ids, outcome.version, None, now,
                                        retained_hash=outcome.retained_hash)
                    self._produce(self.receipts_topic, d.subject_id.encode(), encode_receipt(r))

    def _dead_original(self, raw: bytes) -> bytes:
        """What a dead letter of the refused deltas message ``raw`` keeps: under
        UNLEARN_DEADLETTER_INPUTS=redact (the default) no plaintext row, label or ledger bytes,
        which no delete could reach there (``schemas/redaction.redact_delta``); ``keep``: ``raw``."""
        return redact_delta(raw) if self.settings.deadletter_inputs == "redact" else raw

    def _reject_all(self, delta: Delta, raw: bytes, part: int, offset: int, key: bytes | None, reason: str,
                    detail: str) -> None:
        original = self._dead_original(raw)
        for i, e in enumerate(delta.entries):
            rej = Rejection(i, e.sign, reason, detail, e.event_ids, e.sample_ids, e.subject_ids)
            self._rejected(delta.head_id, rej, original, part, offset, key)

    def _rejected(self, head_id: str, rej: Rejection, original: bytes, part: int, offset: int,
                  key: bytes | None) -> None:
        first_event = rej.event_ids[0] if rej.event_ids else None
        kind = "add" if rej.sign > 0 else "delete"
        detail = f"entry {rej.entry_index} ({kind}, {len(rej.event_ids)} rows): {rej.detail}"
        self._deadletter(DeadLetter(original, rej.reason, detail, STAGE, self.deltas_topic, part, offset, key,
                                    first_event, time.time()))
        if rej.sign < 0:
            for d in group_by_event(rej.event_ids, rej.sample_ids, rej.subject_ids):
                r = Receipt.rejected(d.event_id, d.subject_id, head_id, d.sample_ids, rej.reason, time.time())
                self._produce(self.receipts_topic, d.subject_id.encode(), encode_receipt(r))

    def _deadletter(self, rec: DeadLetter) -> None:
        log.warning("deadletter %s: %r", rec.reason, rec.detail)
        value = encode_deadletter_bounded(rec, self.settings.max_message_bytes)
        self._produce(self.deadletter_topic, rec.key or b"", value)

    # ---------------------------------------------------------------- checkpoints
    def _checkpoint_due(self) -> None:
        now = time.monotonic()
        for part, ps in list(self.partitions.items()):
            if ps.erasure_since is not None and now - ps.erasure_since >= self.settings.erasure_rotate_seconds:
                self.checkpoint(part, erasure=True)
            elif ps.pending and (ps.pending >= self.settings.checkpoint_every_messages
                                 or now - ps.last_checkpoint >= self.settings.checkpoint_every_seconds):
                self.checkpoint(part)

    def _checkpoint_all(self) -> None:
        for part in sorted(self.partitions):
            if self.partitions[part].pending:
                self.checkpoint(part)

    def checkpoint(self, part: int, erasure: bool = False) -> None:
        """Make ``part``'s processed messages durable: outputs, snapshots, then the checkpoint.

        ``erasure``: the partition applied deletes since its last erasure rotation; rotate both its
        head updates and its ledger state whatever their size, so the generations that hold
        aggregates from before those deletes are deleted (the state's at once, the heads' after
        their retire grace). Every delete applied so far is covered: no message is processed
        while this runs, so the next delete opens the next window."""
        ps = self.partitions[part]
        started = time.monotonic()
        self._flush_outputs("checkpoint")
        if erasure:
            log.info("deltas partition %d: erasure rotation starts (%d heads)", part, len(ps.heads))
        if erasure or self.store.needs_heads_rotation(part):
            self._rotate_heads(ps)
        rotating = erasure or self.store.needs_rotation(part)
        old_generation = self.store.begin_generation(part) if rotating else None
        for head_id, head in sorted(ps.heads.items()):
            ptr = ps.pointers.get(head_id)
            last = ps.last_touched.get(head_id)
            stale = ptr is None or head.dirty_since_snapshot > 0 or (last is not None and ptr.applied_offset < last)
            if rotating or stale:  # a new generation gets every head: the old one is deleted
                ps.pointers[head_id] = self.store.write_snapshot(part, head.state(), ptr)
                head.dirty_since_snapshot = 0
        floor = safe_floor(ps.next_offset, ps.last_touched,
                           {h: p.applied_offset for h, p in ps.pointers.items()})
        self.store.write_checkpoint(Checkpoint(part, floor, self.topic_id, dict(ps.pointers),
                                               erasure_pending=ps.erasure_since is not None and not erasure))
        if old_generation is not None:
            self.store.end_generation(part, old_generation)
            log.info("deltas partition %d: ledger state moved to generation %d", part, old_generation + 1)
        if erasure:
            ps.erasure_since = None  # done only now: a rotation cut short leaves the deletes pending
            log.info("deltas partition %d: erasure rotation done: %d heads in %.3fs (%d state bytes, %d head bytes "
                     "written); the superseded heads generation goes in %.0fs", part, len(ps.heads),
                     time.monotonic() - started, self.store.written.get(part, 0),
                     self.store.heads_written.get(part, 0), self.settings.heads_retire_seconds)
        self._commit_floor(part, floor)
        ps.last_touched = {h: o for h, o in ps.last_touched.items() if o >= floor}
        ps.pending = 0
        ps.last_checkpoint = time.monotonic()

    def _flush_outputs(self, why: str) -> None:
        if self.producer.flush(self.settings.admin_timeout):
            raise LedgerWorkerError(f"outputs not delivered within the admin timeout; stopping before the {why}")
        self._raise_if_delivery_failed()

    def _rotate_heads(self, ps: PartitionState) -> None:
        """Move the partition's head updates to a new heads topic: every head's current version as
        an exact update first (a fast head is reset: each generation then holds a digest for every
        head), then the old topic goes."""
        superseded = self.store.begin_heads_generation(ps.partition)
        for _, head in sorted(ps.heads.items()):
            if head.mode == "fast":
                head.reset("heads rotation")
            self.publish_head(head)
        self._flush_outputs("heads rotation")
        self.store.end_heads_generation(superseded)
        log.info("deltas partition %d: head updates moved to %s", ps.partition, self.store.heads_topic(ps.partition))

    def _commit_floor(self, part: int, floor: int) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            self.consumer.commit(offsets=[TopicPartition(self.deltas_topic, part, floor)], asynchronous=True)
        except KafkaException as exc:  # informative only (lag monitoring); the checkpoint is what counts
            log.debug("commit of partition %d floor %d: %s", part, floor, exc)

    # ---------------------------------------------------------------- timers
    def _timed_resets(self) -> None:
        """Canonical heads on a clock: a fast head older than ``reset_every_seconds`` is reset
        and republished as exact (same version: the ledger did not change)."""
        for ps in self.partitions.values():
            for head in ps.heads.values():
                if head.timed_reset_due(self.settings.reset_every_seconds):
                    head.reset("timer")
                    self.publish_head(head)


def run_ledger_worker(settings: Settings, worker_id: str = "ledger-0", loglevel: str = "info") -> int:
    """Run one ledger worker until SIGINT/SIGTERM; 0 on a clean stop, 2 on state that does not
    match the log (the message names the mismatch)."""
    from threadpoolctl import threadpool_limits

    from unlearn.infra.topics import create_topics

    # Per-message work is O(d^2) BLAS-2/3 on small operands: a second BLAS thread buys little and,
    # when another process holds a core, stalls each call by milliseconds (bench/ledger_bench s.0).
    with threadpool_limits(limits=settings.ledger_blas_threads, user_api="blas"):
        create_topics(settings)
        worker = LedgerWorker(settings, worker_id)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        try:
            worker.run()
        except StaleStateError as exc:
            log.error("%s", exc)
            return 2
    log.info("ledger worker %r stopped", worker_id)
    return 0
