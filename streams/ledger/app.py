"""The ledger processor: a faust-streaming app folding ``deltas`` into exact per-head ledgers.

Thin shell around ``HeadRuntime`` (the rules) and ``snapshot`` (the crash-consistent state
format). Flow per ``deltas`` message (key = head id, so a head's deltas are totally ordered):
decode -> apply to the head's exact ledger and SMW fast head -> publish a head update, receipts
for applied deletes, deadletters for rejected entries. Input events are *not* acked when
processed: every ``checkpoint_every_messages`` / ``checkpoint_every_seconds`` per partition, the
state of every dirty head of that partition is written to the changelog-backed table (pieces +
manifest, see snapshot.py) and only then are that partition's events acked, so committed input
offsets never run ahead of durable state. After a crash, faust recovers the table, the consumer
resumes from the committed offset, and ``HeadRuntime`` skips what the snapshot already covers.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import faust
from faust.types import TP, EventT, StreamT

from unlearn.infra.profiles import faust_app_kwargs, tune_faust_consumer
from unlearn.infra.settings import Settings
from unlearn.ledger.tracked import HeadMode
from unlearn.schemas.deadletter import DeadLetter, encode_deadletter
from unlearn.schemas.delta_codec import CodecError, Delta, decode_delta
from unlearn.schemas.head_codec import HeadUpdate, encode_head
from unlearn.schemas.receipts import Receipt, encode_receipt

from .head_runtime import ApplyOutcome, HeadConfig, HeadRuntime, Rejection
from .snapshot import (SnapshotError, decode_state, encode_state, join_pieces, manifest, manifest_key, piece_key,
                       split_pieces, state_sha)

log = logging.getLogger("unlearn.ledger")

TABLE_NAME = "ledger-state"


@dataclass
class PartitionState:
    """Per input partition: events processed but not yet covered by a snapshot."""

    pending: list[EventT] = field(default_factory=list)
    heads: set[str] = field(default_factory=set)
    last_checkpoint: float = field(default_factory=time.monotonic)


class LedgerProcessor:
    """State and behaviour of one ledger worker (one faust app instance)."""

    def __init__(self, settings: Settings, app: faust.App, table: Any, heads_topic: Any, receipts_topic: Any,
                 deadletter_topic: Any) -> None:
        self.settings = settings
        self.app = app
        self.table = table
        self.heads_topic = heads_topic
        self.receipts_topic = receipts_topic
        self.deadletter_topic = deadletter_topic
        self.heads: dict[str, HeadRuntime] = {}
        self.partitions: dict[int, PartitionState] = {}
        self.generations: dict[str, int] = {}
        self.deltas_topic_name = settings.topic("deltas")

    # ---------------------------------------------------------------- config
    def head_config(self, head_id: str) -> HeadConfig:
        s = self.settings
        return HeadConfig(s.gamma_for(head_id), s.reset_every_events, s.drift_threshold)

    # ---------------------------------------------------------------- the fold
    async def handle(self, stream: StreamT, event: EventT) -> None:
        msg = event.message
        part, offset = msg.partition, msg.offset
        if part not in self.owned_partitions():
            # Fetched before a rebalance moved the partition away: its new owner replays it from
            # the committed offset. Not acked, so it comes back here if the partition does.
            return
        ps = self.partitions.setdefault(part, PartitionState())
        ps.pending.append(event)
        raw: bytes = event.value if isinstance(event.value, bytes) else bytes(event.value or b"")
        key = msg.key if isinstance(msg.key, bytes) else (msg.key or b"")
        try:
            delta = decode_delta(raw)
            if key and key.decode("utf-8", "replace") != delta.head_id:
                raise CodecError(f"message key {key!r} is not the head id {delta.head_id!r}: "
                                 "deltas must be keyed by head id to stay ordered")
        except CodecError as exc:
            await self._deadletter(DeadLetter(raw, "bad_delta", str(exc), "ledger", self.deltas_topic_name, part,
                                              offset, key, None, time.time()))
            await self._maybe_checkpoint(stream, part)
            return
        head = self._head_for(delta, part)
        if head is None:
            await self._reject_all(delta, raw, part, offset, key, "unknown_head",
                                   f"head {delta.head_id!r} does not exist yet: its first event must be an add")
        else:
            outcome = head.apply(delta, offset, part)
            if outcome.skipped:
                log.info("head %s: offset %d/%d skipped (%s)", head.head_id, part, offset, outcome.skipped)
            else:
                ps.heads.add(head.head_id)
                await self._publish(head, outcome, raw, part, offset, key)
        await self._maybe_checkpoint(stream, part)

    def _head_for(self, delta: Delta, part: int) -> HeadRuntime | None:
        head = self.heads.get(delta.head_id)
        if head is not None:
            return head
        head = self._load_snapshot(delta.head_id)
        if head is None and any(e.sign > 0 for e in delta.entries):
            head = HeadRuntime.new(delta.head_id, delta, self.head_config(delta.head_id))
            log.info("head %s created (d=%d)", delta.head_id, delta.d)
        if head is not None:
            self.heads[delta.head_id] = head
            self.partitions.setdefault(part, PartitionState()).heads.add(delta.head_id)
        return head

    def _load_snapshot(self, head_id: str) -> HeadRuntime | None:
        man_raw = self.table.get(manifest_key(head_id).encode())
        if man_raw is None:
            return None
        import orjson

        man = orjson.loads(man_raw)
        pieces = [self.table.get(piece_key(head_id, man["slot"], i).encode()) for i in range(man["count"])]
        try:
            meta, ledger = decode_state(join_pieces(man_raw, pieces))
        except (SnapshotError, ValueError) as exc:
            # A snapshot that does not verify is never used; fail loudly rather than serve a wrong head.
            raise RuntimeError(f"snapshot of head {head_id!r} is corrupt: {exc}") from exc
        self.generations[head_id] = man["generation"]
        log.info("head %s restored from snapshot (version %d, offset %d)", head_id, meta.version, meta.applied_offset)
        return HeadRuntime.from_snapshot(meta, ledger, self.head_config(head_id))

    # ---------------------------------------------------------------- outputs
    def head_update(self, head: HeadRuntime, mode: HeadMode | None = None) -> HeadUpdate:
        mode = mode or head.mode
        posterior = head.tracked.tracker.T if (mode == "exact" and self.settings.publish_posterior) else None
        return HeadUpdate(
            head_id=head.head_id, version=head.version, mode=mode, digest=head.digest(),
            n_retained=head.ledger.count, events_covered=head.events_covered,
            offsets=((head.input_partition, head.applied_offset),), drift=float(head.last_reset_drift),
            gamma=head.config.gamma, created_ts=time.time(), weights=head.weights, posterior=posterior)

    async def _publish(self, head: HeadRuntime, outcome: ApplyOutcome, raw: bytes, part: int, offset: int,
                       key: bytes) -> None:
        await self.heads_topic.send(key=head.head_id.encode(), value=encode_head(self.head_update(head)))
        now = time.time()
        for d in outcome.deletes:
            r = Receipt.applied(d.event_id, d.subject_id, head.head_id, d.sample_ids, head.version, head.digest(), now)
            await self.receipts_topic.send(key=d.subject_id.encode(), value=encode_receipt(r))
        for rej in outcome.rejections:
            await self._rejected(head.head_id, rej, raw, part, offset, key)

    async def _reject_all(self, delta: Delta, raw: bytes, part: int, offset: int, key: bytes, reason: str,
                          detail: str) -> None:
        for i, e in enumerate(delta.entries):
            rej = Rejection(i, e.sign, reason, detail, e.event_ids, e.sample_ids, e.subject_ids)
            await self._rejected(delta.head_id, rej, raw, part, offset, key)

    async def _rejected(self, head_id: str, rej: Rejection, raw: bytes, part: int, offset: int, key: bytes) -> None:
        first_event = rej.event_ids[0] if rej.event_ids else None
        detail = f"entry {rej.entry_index} ({'add' if rej.sign > 0 else 'delete'}, {len(rej.event_ids)} rows): {rej.detail}"
        await self._deadletter(DeadLetter(raw, rej.reason, detail, "ledger", self.deltas_topic_name, part, offset,
                                          key, first_event, time.time()))
        if rej.sign < 0:
            groups: dict[str, tuple[str, list[str]]] = {}
            for ev, sample, subject in zip(rej.event_ids, rej.sample_ids, rej.subject_ids):
                groups.setdefault(ev, (subject, []))[1].append(sample)
            for ev, (subject, samples) in groups.items():
                r = Receipt.rejected(ev, subject, head_id, samples, rej.reason, time.time())
                await self.receipts_topic.send(key=subject.encode(), value=encode_receipt(r))

    async def _deadletter(self, rec: DeadLetter) -> None:
        log.warning("deadletter %s: %s", rec.reason, rec.detail)
        await self.deadletter_topic.send(key=rec.key or b"", value=encode_deadletter(rec))

    # ---------------------------------------------------------------- checkpoints
    async def _maybe_checkpoint(self, stream: StreamT, part: int) -> None:
        ps = self.partitions.get(part)
        if ps is None:
            return  # moved away during this message (a rebalance ran while it was publishing)
        due = (len(ps.pending) >= self.settings.checkpoint_every_messages
               or time.monotonic() - ps.last_checkpoint >= self.settings.checkpoint_every_seconds)
        if due:
            await self.checkpoint(stream, part)

    async def checkpoint(self, stream: StreamT, part: int) -> None:
        """Snapshot every dirty head of ``part`` (inside that partition's event context, so the
        changelog is co-partitioned), then ack the partition's pending events. A worker that no
        longer owns ``part`` writes nothing: its late snapshot could interleave with the new
        owner's (the pieces would then fail verification, by design, but why risk it)."""
        ps = self.partitions.get(part)
        if ps is None or part not in self.owned_partitions():
            return
        for head_id in sorted(ps.heads):
            head = self.heads.get(head_id)
            if head is None or head.dirty_since_snapshot == 0:
                continue
            gen = self.generations.get(head_id, 0) + 1
            slot = gen % 2
            state = encode_state(head.meta(), head.ledger)
            pieces = split_pieces(state, gen, head.applied_offset, self.settings.changelog_max_bytes)
            for i, piece in enumerate(pieces):
                self.table[piece_key(head_id, slot, i).encode()] = piece
            self.table[manifest_key(head_id).encode()] = manifest(gen, slot, head.applied_offset, len(pieces),
                                                                  state_sha(state))
            self.generations[head_id] = gen
            head.dirty_since_snapshot = 0
        for ev in ps.pending:
            await stream.ack(ev)
        ps.pending.clear()
        ps.last_checkpoint = time.monotonic()

    # ---------------------------------------------------------------- timers and rebalances
    async def timed_resets(self) -> None:
        """Canonical heads on a clock: a fast head older than ``reset_every_seconds`` is reset
        and republished as exact (same version: the ledger did not change)."""
        for head in list(self.heads.values()):
            if head.timed_reset_due(self.settings.reset_every_seconds):
                head.reset("timer")
                await self.heads_topic.send(key=head.head_id.encode(), value=encode_head(self.head_update(head)))

    def owned_partitions(self) -> set[int]:
        """``deltas`` partitions currently assigned to this worker."""
        return {tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.deltas_topic_name}

    def on_assigned(self, assigned: set[TP]) -> None:
        """After a rebalance, forget the heads of partitions that moved away.

        faust's rebalances are eager: every partition is revoked, then the new assignment is
        handed out. A partition this worker keeps keeps its in-memory state -- whether the
        consumer continues from its position or restarts from the committed offset, offsets at or
        below a head's applied offset are skipped. A partition that left is forgotten: its new
        owner rebuilds it from the table and the uncommitted input, and if it ever comes back
        here, so do we (dropping state for a kept partition would lose the events between its
        snapshot and the consumer's position).
        """
        owned = {tp.partition for tp in assigned if tp.topic == self.deltas_topic_name} | self.owned_partitions()
        gone = sorted(p for p in self.partitions if p not in owned)
        log.info("assigned deltas partitions %s; forgetting %s", sorted(owned), gone)
        for part in gone:
            ps = self.partitions.pop(part)
            for head_id in ps.heads:
                self.heads.pop(head_id, None)
                self.generations.pop(head_id, None)


def build_app(settings: Settings, worker_id: str = "ledger-0") -> tuple[faust.App, LedgerProcessor]:
    """The faust app and its processor. ``worker_id`` separates local data dirs of workers."""
    tune_faust_consumer(settings)
    datadir = os.path.join(settings.data_dir, "ledger", worker_id)
    os.makedirs(datadir, exist_ok=True)
    app = faust.App(
        f"{settings.topic_prefix}ledger",
        **faust_app_kwargs(settings),
        datadir=datadir,
        store="memory://",
        table_standby_replicas=0,
        stream_wait_empty=False,
        web_enabled=False,
        topic_allow_declare=True,
        key_serializer="raw",  # tables and topics carry our own binary formats
        value_serializer="raw",
    )
    deltas = app.topic(settings.topic("deltas"), key_serializer="raw", value_serializer="raw",
                       partitions=settings.partitions)
    heads = app.topic(settings.topic("heads"), key_serializer="raw", value_serializer="raw")
    receipts = app.topic(settings.topic("receipts"), key_serializer="raw", value_serializer="raw")
    deadletter = app.topic(settings.topic("deadletter"), key_serializer="raw", value_serializer="raw")
    table = app.Table(TABLE_NAME, partitions=settings.partitions, key_type=bytes, value_type=bytes)
    proc = LedgerProcessor(settings, app, table, heads, receipts, deadletter)

    @app.agent(deltas, name="fold-deltas")
    async def fold(stream: StreamT) -> None:
        s = stream.noack()
        async for event in s.events():
            await proc.handle(s, event)

    @app.timer(interval=max(0.2, min(1.0, settings.reset_every_seconds / 4)))
    async def reset_clock() -> None:
        await proc.timed_resets()

    @app.on_partitions_assigned.connect
    async def _assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        proc.on_assigned(assigned)

    return app, proc


def run_ledger_worker(settings: Settings, worker_id: str = "ledger-0", loglevel: str = "warning") -> None:
    """Run one ledger worker until SIGINT/SIGTERM (faust's Worker handles the signals)."""
    from threadpoolctl import threadpool_limits

    from unlearn.infra.topics import create_topics

    # Per-message work is O(d^2) BLAS-2/3 on small operands: a second BLAS thread buys little and,
    # when another process holds a core, stalls each call by milliseconds (bench/ledger_bench s.0).
    blas_limit = threadpool_limits(limits=settings.ledger_blas_threads, user_api="blas")  # noqa: F841 (kept alive)
    create_topics(settings)
    app, _ = build_app(settings, worker_id)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
