"""The ledger worker: ``deltas`` in, exact per-head ledgers, head updates and receipts out.

``LedgerWorker`` owns the consumer and its poll loop; everything else is delegated:

- ``DeltaFold`` folds each deltas message into its head's exact ledger (one version
  per message; dead letters for what it refuses);
- ``Outputs`` produces head updates (with their size policy), receipts and dead
  letters: per poll, each touched head's fast head catches up once, then one head update per
  head (its last version) and the receipts of every applied delete;
- ``Checkpointer`` makes a partition durable, in the steps its docstring
  numbers, every ``checkpoint_every_messages`` / ``checkpoint_every_seconds``, on an erasure
  rotation, and before a partition is given up;
- ``Recovery`` rebuilds an assigned partition from its checkpoint and resumes it
  at its floor, after making sure the state belongs to the log (docs/design.md section 4).

**OwnedPartitions**: the ``deltas`` partitions one ledger worker owns, their heads, and where each head lives.

**DeltaFold**: one ``deltas`` message into its head's ledger: decode, open, check the partition, apply.

Per message (key = head id, so one head's deltas are totally ordered): decode, check the key and
open sealed rows (``head_runtime.RowOpener``) -> refuse a head that lives on another partition, or a head whose
first delta is not an add -> create the head on its first add -> ``HeadRuntime.apply`` (one
version) -> dead letters and rejected receipts for refused entries. What the poll then owes
(head updates, applied receipts) is collected in a ``PollOutputs``.

**Head gamma (HeadGammas)**: which gamma a new head gets in the ledger: its contract's (docs/registry.md).

A declared head's contract (``unlearn heads create --gamma``) and an auto-created head's
(the featurizer's settings) both name the head's ridge gamma; the ledger takes it from there, so
a ledger worker with other ``UNLEARN_GAMMA`` / ``UNLEARN_HEAD_GAMMAS`` settings solves the same
head. The registry is followed; a head the follower has not seen yet (its contract is written
before its first delta, but the follower may lag by a poll) makes one synchronous read of the
registry, once per new head. A head whose contract cannot be found (no registry topic, or deltas
written without the featurizer) falls back to the settings, with a warning. A head's gamma is
fixed at its creation in the ledger and then travels with its state (``HeadMeta.gamma``).

**Outputs**: what the ledger worker produces: head updates, receipts and dead letters.

Everything goes through the worker's producer, and a failed delivery stops the worker
(:class:`DeliveryError`): an output that cannot be delivered must not be covered by a checkpoint,
so the restart replays from the last floor instead (nothing lost, nothing doubled). A head too
large for one message is published without its posterior, and if still too large dead-lettered
(the size policy), never a crash loop.

**Checkpointer**: making a partition's processed messages durable: the steps of a checkpoint, in order.

The rules the steps keep (a floor never passes durable state, recovery starts at the floor) are
pure functions in ``state_store`` (``safe_floor``, ``check_recovery``); the checkpointer does the
I/O, in the order that keeps them.

**Recovery**: rebuilding an assigned ``deltas`` partition from its ``ledger-state`` (docs/design.md section 4).

The partition's latest checkpoint and the snapshots it names are read back
(``ChangelogStore.recover``); ``check_recovery`` makes sure they belong to the log the worker
reads (invariant 2 of ``state_store``'s rules) and gives the floor to resume at. Every restored head is
republished as an exact update (into a new heads generation, or the same topic where the store
trims), and the older updates go once those are durable (``state_store``).

Why not faust: its offset bookkeeping commits past an unacked message when acks have a gap
(faust-streaming #312, #606), can resume fetching before seeking to committed offsets (#216),
its exactly-once mode cannot start on the embedded broker, and its group join there is slow.
Kafka Streams' model (state in a changelog topic, restore before processing) is kept; the worker
owns its offsets so that exactness does not depend on a framework's.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from unlearn.infra import tracing
from unlearn.infra.between_stages import Checkpoint, HeadPointer
from unlearn.infra.cli_args import log_ready
from unlearn.infra.log_position import StaleStateError, log_bounds, topic_id
from unlearn.infra.registry import RegistryView, read_contracts
from unlearn.infra.retry import RetryPolicy, flush_within
from unlearn.infra.settings import ErasureSettings, HeadSettings, Settings, consumer_config, producer_config
from unlearn.infra.topic_reader import TopicReadError
from unlearn.infra.worker_metrics import WorkerMetrics
from unlearn.ledger.tracked_head import HeadMode
from unlearn.schemas.deadletter import DeadLetter, encode_deadletter_bounded
from unlearn.schemas.delta_codec import CodecError, Delta, decode_delta
from unlearn.schemas.head import HeadContract, HeadUpdate, encode_head
from unlearn.schemas.receipts import Receipt, encode_receipt
from unlearn.schemas.redaction import redact_delta
from unlearn.schemas.sealed import SealError
from unlearn.streams.ledger.head_runtime import (
    ApplyOutcome,
    HeadConfig,
    HeadRuntime,
    Rejection,
    RowOpener,
    creates_head,
    group_by_event,
)
from unlearn.streams.ledger.settings import LedgerSettings
from unlearn.streams.ledger.state_store import ChangelogStore, check_recovery, safe_floor

__all__ = [
    "OwnedPartitions",
    "PartitionState",
    "ContractGammas",
    "STAGE",
    "DeliveryError",
    "Outputs",
    "PollOutputs",
    "head_update",
    "DeltaFold",
    "Recovery",
    "Checkpointer",
]

log = logging.getLogger("unlearn.ledger")

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


class OwnedPartitions:
    """Partition -> its state, and head id -> its partition: a head's deltas must share one
    partition, so a head met on another one is refused (``owner``)."""

    def __init__(self) -> None:
        self.states: dict[int, PartitionState] = {}
        self._head_partition: dict[str, int] = {}

    def add(self, ps: PartitionState) -> None:
        self.states[ps.partition] = ps
        for head_id in ps.heads:
            self._head_partition[head_id] = ps.partition

    def place(self, ps: PartitionState, head: HeadRuntime) -> None:
        """A new head, on the partition its first delta came from."""
        ps.heads[head.head_id] = head
        self._head_partition[head.head_id] = ps.partition

    def drop(self, partition: int) -> None:
        ps = self.states.pop(partition, None)
        if ps is not None:
            for head_id in ps.heads:
                self._head_partition.pop(head_id, None)

    def owner(self, head_id: str) -> int | None:
        """The partition ``head_id`` lives on (None: no partition this worker owns)."""
        return self._head_partition.get(head_id)

    def get(self, partition: int) -> PartitionState | None:
        return self.states.get(partition)

    def __getitem__(self, partition: int) -> PartitionState:
        return self.states[partition]

    def __iter__(self) -> Iterator[PartitionState]:
        """The states in the order they were added (a copy: a checkpoint may revoke as it goes)."""
        return iter(list(self.states.values()))

    def __len__(self) -> int:
        return len(self.states)


class ContractGammas:
    """Head id -> gamma from the head registry (module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.view = RegistryView(settings)
        self._read: dict[str, HeadContract] = {}

    def start(self) -> None:
        """Start following the registry (does not wait: a missing topic only means fallbacks)."""
        self.view.start()

    def stop(self) -> None:
        """Stop following."""
        self.view.stop()

    def contract(self, head_id: str) -> HeadContract | None:
        """The head's latest contract: the follower's, else one synchronous read of the registry."""
        c = self.view.get(head_id) or self._read.get(head_id)
        if c is None:
            timeout = min(self.settings.admin_timeout, 10.0)
            try:  # a broker restarting is waited for (infra.retry): only a missing registry falls back
                self._read = RetryPolicy.of(self.settings).call(
                    "reading the head registry", lambda: read_contracts(self.settings, timeout=timeout))
            except TopicReadError as exc:
                log.warning("head registry not readable (%s)", exc)
            c = self._read.get(head_id)
        return c

    def gamma(self, head_id: str) -> float:
        """The gamma of a new head: its contract's, else the settings' (with a warning)."""
        c = self.contract(head_id)
        if c is not None:
            return c.gamma
        log.warning("head %r has no contract in the head registry: gamma from the settings (%g)", head_id,
                    HeadSettings.of(self.settings).gamma_for(head_id))
        return HeadSettings.of(self.settings).gamma_for(head_id)


STAGE = "ledger"


class DeliveryError(RuntimeError):
    """An output was not delivered: the worker stops before any checkpoint could cover it."""


@dataclass
class PollOutputs:
    """What one poll's applied messages owe, per head in the order first touched: the head
    (published once, at its last version, to its partition's heads topic) and its messages'
    outcomes in log order (receipts)."""

    heads: dict[str, tuple[int, HeadRuntime]] = field(default_factory=dict)
    outcomes: dict[str, list[ApplyOutcome]] = field(default_factory=dict)
    record_ts: float = 0.0  # the Kafka timestamp (s) of the message being folded
    delete_ts: list[float] = field(default_factory=list)  # one per applied delete: its message's timestamp
    record_trace: bytes | None = None  # the valid traceparent of the message being folded (infra/tracing.py)
    record_events: dict[str, bytes] = field(default_factory=dict)  # its event id -> traceparent header
    traces: dict[str, list[tuple[bool, bytes]]] = field(default_factory=dict)  # head id -> (no deletes, context)
    events: dict[str, bytes] = field(default_factory=dict)  # event id -> its request's context

    def add(self, part: int, head: HeadRuntime, outcome: ApplyOutcome) -> None:
        self.heads[head.head_id] = (part, head)
        self.outcomes.setdefault(head.head_id, []).append(outcome)
        self.delete_ts += [self.record_ts] * len(outcome.deletes)
        if self.record_trace is not None:
            self.traces.setdefault(head.head_id, []).append((not outcome.deletes, self.record_trace))
            self.events.update(self.record_events)

    def head_traces(self, head_id: str) -> list[bytes]:
        """The contexts of the head's traced deltas in this poll: those that deleted first (the
        head update's parent is the first), then the others, each in log order."""
        return [tp for _, tp in sorted(self.traces.get(head_id, ()), key=lambda x: x[0])]

    def read_trace(self, headers: Any) -> None:
        """The trace context of the message about to be folded (only header bytes are read)."""
        self.record_trace = tracing.traceparent_of(headers) if headers else None
        self.record_events = tracing.events_of(headers) if self.record_trace is not None else {}


def head_update(head: HeadRuntime, mode: HeadMode | None = None, *, posterior: bool = False) -> HeadUpdate:
    """The head's update at its version. Only an exact update carries the ledger digest (the
    certificate, O(d^2)) and, with ``posterior``, T; a fast one carries the retained-rows hash
    alone. ``drift`` is this W's deviation from the canonical solve as the ledger knows it: 0.0 on
    an exact update (it is the canonical solve), the fast path's last measured deviation on a fast
    one. ``retained_classes`` comes from the ledger's exact per-class counts."""
    mode = mode or head.mode
    exact = mode == "exact"
    return HeadUpdate(
        head_id=head.head_id, version=head.version, mode=mode, digest=head.digest() if exact else None,
        n_retained=head.ledger.count, events_covered=head.events_covered,
        offsets=((head.input_partition, head.applied_offset),), drift=0.0 if exact else float(head.fast_drift),
        gamma=head.config.gamma, created_ts=time.time(), weights=head.weights,
        posterior=head.posterior if (exact and posterior) else None,
        retained_hash=head.retained_hash(), contract_version=head.contract_version,
        retained_classes=head.retained_classes())


def receipt_headers(event_id: str, traces: Mapping[str, bytes] | None) -> tuple[tuple[str, bytes | None], ...]:
    """A receipt's headers: its delete's own trace context as parent (none when it had none)."""
    tp = traces.get(event_id) if traces else None
    if tp is None:
        return ()
    return tracing.headers_with(tracing.span_header("ledger.receipt", [tp], {"unlearn.event_id": event_id}))


class Outputs:
    """The worker's producer and the rules of what it sends (module docstring)."""

    def __init__(self, settings: Settings, producer: Any, store: ChangelogStore,
                 stats: dict[str, int] | None = None) -> None:
        self.settings = settings
        self.stats = stats if stats is not None else {}  # counts its dead letters (the worker's metrics)
        self.producer = producer
        self.store = store  # names each partition's current heads topic and counts its bytes
        self.deltas_topic = settings.topic("deltas")
        self.receipts_topic = settings.topic("receipts")
        self.deadletter_topic = settings.topic("deadletter")
        self.publish_posterior = LedgerSettings.of(settings).publish_posterior
        self.redact_inputs = ErasureSettings.of(settings).deadletter_inputs == "redact"
        self.delivery_errors: list[str] = []
        self.retry = RetryPolicy.of(settings)

    # ---------------------------------------------------------------- delivery
    def produce(self, topic: str, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes | None]] = ()) -> None:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                self.delivery_errors.append(f"{topic}: {err}")

        while True:
            try:
                self.producer.produce(topic, key=key, value=value, on_delivery=on_delivery,
                                      **({"headers": list(headers)} if headers else {}))
                return
            except BufferError:
                self.producer.poll(0.1)

    def serve(self) -> None:
        """Serve delivery reports; DeliveryError if one failed."""
        self.producer.poll(0)
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self.delivery_errors:
            raise DeliveryError(f"output delivery failed: {self.delivery_errors[:3]}")

    def flush(self, why: str) -> None:
        """Wait until every output produced so far is durable (DeliveryError before ``why`` if not).
        While the broker restarts the outputs wait in the client's queue and the client retries
        them; only ``UNLEARN_BROKER_RETRY_SECONDS`` without delivery stops the worker
        (BrokerUnavailable), as does a failed delivery report (the client gave up on a message)."""
        flush_within(self.producer, self.retry, f"delivering outputs before the {why}")
        self.raise_if_failed()

    # ---------------------------------------------------------------- head updates
    def publish_head(self, part: int, head: HeadRuntime, mode: HeadMode | None = None,
                     traces: Sequence[bytes] = ()) -> bool:
        """Produce the head's update to ``part``'s heads topic; False if it cannot fit in a message
        even without the posterior. Then the state stays exact and a dead letter says why: a head
        too large to publish must not stop the worker (and every head on its partition) in a crash
        loop."""
        update = head_update(head, mode, posterior=self.publish_posterior)
        value = encode_head(update)
        limit = self.settings.max_message_bytes
        if len(value) > limit and update.posterior is not None:
            value = encode_head(replace(update, posterior=None))
            log.warning("head %r version %d: published without its posterior (%d bytes over the limit)",
                        head.head_id, head.version, len(value) - limit)
        if len(value) > limit:
            detail = (f"head {head.head_id!r} version {head.version} (d={head.ledger.dim}, c={head.ledger.n_outputs}) "
                      f"encodes to {len(value)} bytes, over UNLEARN_MAX_MESSAGE_BYTES={limit}: not published")
            self.deadletter(DeadLetter(b"", "head_too_large", detail, STAGE, self.store.heads_topic(part), None,
                                       None, head.head_id.encode(), None, time.time()))
            return False
        key = head.head_id.encode()
        headers = tracing.headers_with(tracing.span_header("ledger.head_update", traces, {
            "unlearn.head_id": head.head_id, "unlearn.version": head.version})) if traces else ()
        self.produce(self.store.heads_topic(part), key, value, headers)
        self.store.count_head_bytes(part, len(key) + len(value))
        self.stats["head_updates"] = self.stats.get("head_updates", 0) + 1
        return True

    def publish_poll(self, poll: PollOutputs) -> None:
        """Per head touched in the poll: the fast head catches up once, one head update (the last
        version), then the receipt of every applied delete. A receipt names the version of the
        message that applied it and that version's retained-rows hash, never the published
        version: those depend on poll boundaries, so replays would issue conflicting receipts."""
        for head_id, (part, head) in poll.heads.items():
            head.sync()
            self.publish_head(part, head, traces=poll.head_traces(head_id))
            now = time.time()
            for outcome in poll.outcomes[head_id]:
                for d in outcome.deletes:
                    r = Receipt.applied(d.event_id, d.subject_id, head_id, d.sample_ids, outcome.version, None, now,
                                        retained_hash=outcome.retained_hash)
                    self.produce(self.receipts_topic, d.subject_id.encode(), encode_receipt(r),
                                 receipt_headers(d.event_id, poll.events))

    # ---------------------------------------------------------------- refusals
    def dead_original(self, raw: bytes) -> bytes:
        """What a dead letter of the refused deltas message ``raw`` keeps: under
        UNLEARN_DEADLETTER_INPUTS=redact (the default) no plaintext row, label or ledger bytes,
        which no delete could reach there (``schemas/redaction.redact_delta``); ``keep``: ``raw``."""
        return redact_delta(raw) if self.redact_inputs else raw

    def bad_delta(self, raw: bytes, part: int, offset: int, key: bytes | None, detail: str) -> None:
        """A deltas message that does not decode or open: one dead letter, no receipt."""
        self.deadletter(DeadLetter(self.dead_original(raw), "bad_delta", detail, STAGE, self.deltas_topic,
                                   part, offset, key, None, time.time()))

    def reject_all(self, delta: Delta, raw: bytes, part: int, offset: int, key: bytes | None, reason: str,
                   detail: str, traces: Mapping[str, bytes] | None = None) -> None:
        """Every entry of ``delta`` refused for one ``reason``."""
        original = self.dead_original(raw)
        for i, e in enumerate(delta.entries):
            rej = Rejection(i, e.sign, reason, detail, e.event_ids, e.sample_ids, e.subject_ids)
            self.rejected(delta.head_id, rej, original, part, offset, key, traces)

    def rejected(self, head_id: str, rej: Rejection, original: bytes, part: int, offset: int,
                 key: bytes | None, traces: Mapping[str, bytes] | None = None) -> None:
        """One refused entry: a dead letter, and a rejected receipt per delete event in it (with the
        delete's trace context, ``traces``: event id -> traceparent)."""
        first_event = rej.event_ids[0] if rej.event_ids else None
        kind = "add" if rej.sign > 0 else "delete"
        detail = f"entry {rej.entry_index} ({kind}, {len(rej.event_ids)} rows): {rej.detail}"
        self.deadletter(DeadLetter(original, rej.reason, detail, STAGE, self.deltas_topic, part, offset, key,
                                   first_event, time.time()))
        if rej.sign < 0:
            for d in group_by_event(rej.event_ids, rej.sample_ids, rej.subject_ids):
                r = Receipt.rejected(d.event_id, d.subject_id, head_id, d.sample_ids, rej.reason, time.time())
                self.produce(self.receipts_topic, d.subject_id.encode(), encode_receipt(r),
                             receipt_headers(d.event_id, traces))

    def deadletter(self, rec: DeadLetter) -> None:
        log.warning("deadletter %s: %r", rec.reason, rec.detail)
        self.stats["deadletters"] = self.stats.get("deadletters", 0) + 1
        value = encode_deadletter_bounded(rec, self.settings.max_message_bytes)
        self.produce(self.deadletter_topic, rec.key or b"", value)


class DeltaFold:
    """Folds deltas messages into the heads of the partitions a worker owns (module docstring)."""

    def __init__(self, settings: Settings, owned: OwnedPartitions, outputs: Outputs, contracts: ContractGammas,
                 opener: RowOpener, config: HeadConfig) -> None:
        self.settings = settings
        self.owned = owned
        self.outputs = outputs
        self.contracts = contracts  # a new head's gamma: its contract's
        self.opener = opener  # sealed rows -> rows (docs/erasure.md)
        self.config = config  # a new head's runtime settings, but for its gamma
        self.tuning = LedgerSettings.of(settings)

    def fold(self, ps: PartitionState, offset: int, key: bytes | None, raw: bytes, poll: PollOutputs) -> None:
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
            self.outputs.bad_delta(raw, part, offset, key, str(exc))
            return
        owner = self.owned.owner(delta.head_id)
        if owner is not None and owner != part:
            self.outputs.reject_all(delta, raw, part, offset, key, "wrong_partition",
                                    f"head {delta.head_id!r} lives on deltas partition {owner}, not {part}: "
                                    "a head's deltas must share one partition (key them by head id)",
                                    poll.record_events)
            return
        head = ps.heads.get(delta.head_id)
        if head is None:
            if not creates:
                self.outputs.reject_all(delta, raw, part, offset, key, "unknown_head",
                                        f"head {delta.head_id!r} does not exist yet: its first event must be an add",
                                        poll.record_events)
                return
            config = replace(self.config, gamma=self.contracts.gamma(delta.head_id))
            head = HeadRuntime.new(delta.head_id, delta, config)
            self.owned.place(ps, head)
            log.info("head %r created (d=%d)", delta.head_id, delta.d)
        outcome = head.apply(delta, offset, part)
        ps.last_touched[head.head_id] = offset
        if outcome.deletes and ps.erasure_since is None and self.tuning.erasure_rotate_seconds > 0:
            ps.erasure_since = time.monotonic()
        if outcome.skipped:
            log.info("head %r: offset %d/%d skipped (%s)", head.head_id, part, offset, outcome.skipped)
            return
        original = self.outputs.dead_original(raw) if outcome.rejections else raw
        for rej in outcome.rejections:
            self.outputs.rejected(head.head_id, rej, original, part, offset, key, poll.record_events)
        poll.add(part, head, outcome)


class Recovery:
    """Rebuilds partitions for one worker (module docstring)."""

    def __init__(self, settings: Settings, consumer: Any, store: ChangelogStore, outputs: Outputs,
                 config: HeadConfig) -> None:
        self.settings = settings
        self.consumer = consumer  # asks the deltas partition's bounds
        self.store = store
        self.outputs = outputs
        self.config = config  # a restored head's runtime settings (its gamma is in its state)
        self.deltas_topic = settings.topic("deltas")
        self.tuning = LedgerSettings.of(settings)

    def recover(self, partition: int, topic_id: str) -> PartitionState:
        """Rebuild ``partition`` from its checkpoint and check it belongs to the log whose topic id
        is ``topic_id`` (StaleStateError naming the mismatch if not)."""
        cp, heads = self.store.recover(partition)
        log_start, log_end = RetryPolicy.of(self.settings).call(
            f"reading the bounds of deltas partition {partition}",
            lambda: log_bounds(self.settings, self.consumer, self.deltas_topic, partition,
                               cp.floor if cp is not None else 0))
        floor = check_recovery(cp, topic_id, log_start, log_end)
        ps = PartitionState(partition, floor)
        rewrite = self.store.begin_heads_rewrite(partition, fresh=True)
        for head_id, state in heads.items():
            head = HeadRuntime.from_snapshot(state, self.config)
            if head.multiset is None:
                log.warning("head %r: the multiset hash of its retained rows is unknown (a packed entry without "
                            "one): head updates and receipts carry none", head_id)
            ps.heads[head_id] = head
            # The last update a reader saw may be a fast one that its writer never got to reset:
            # republish the restored version as canonical (same version, same digest).
            if head.mode == "fast":
                head.reset("restored")
            self.outputs.publish_head(partition, head, "exact")
        # The older updates hold nothing a reader still needs once the republished ones are durable.
        self.outputs.flush("recovery")
        self.store.end_heads_rewrite(rewrite)
        if cp is not None:
            ps.pointers = dict(cp.heads)
            if cp.erasure_pending and self.tuning.erasure_rotate_seconds > 0:
                # A delete made durable before the crash, not yet rotated away: its window restarts
                # now (a delete past the floor is replayed, and marks the partition again).
                ps.erasure_since = time.monotonic()
        log.info("deltas partition %d: %d heads restored, resuming at offset %d", partition, len(ps.heads), floor)
        return ps


class Checkpointer:
    """Checkpoints one worker's partitions. A checkpoint of a partition, in this order:

    1. wait until every output produced so far is durable (so no receipt or head update can be
       lost behind a floor);
    2. on an erasure rotation, or once the heads topic passed its size bound: republish every head
       as an exact update, wait for it, drop the older updates (trimmed at once where the broker
       has DeleteRecords, else a new heads generation and the old one retired: state_store.py);
    3. on an erasure rotation, or once the ledger-state topic passed its size bound: start a
       rewrite (a new ledger-state generation where the store does not trim);
    4. write a snapshot of every head touched since the last checkpoint (of every head on a
       rewrite);
    5. write the partition's checkpoint record (floor = next offset to read, by ``safe_floor``);
    6. drop what step 3 superseded: DeleteRecords below the new checkpoint's first piece, or
       retire the old generation;
    7. on an erasure rotation, mark its deletes rotated away (only now, and only if the trims of
       steps 2 and 6 succeeded: a rotation cut short leaves them pending, and the checkpoint of
       step 5 says so; recovery trims below its checkpoint's pieces too);
    8. commit the floor to the consumer group (for lag monitoring only: recovery never reads it).

    An erasure rotation runs ``UNLEARN_ERASURE_ROTATE_SECONDS`` after a partition's first delete
    since its last one, so no snapshot or head update taken before a delete outlives it by more
    than that (plus the heads' retire grace where generations rotate; docs/ledger-processor.md,
    "Erasure rotation"). Every delete applied so far is covered: no message is processed while a
    checkpoint runs."""

    def __init__(self, settings: Settings, consumer: Any, store: ChangelogStore, outputs: Outputs) -> None:
        self.settings = settings
        self.consumer = consumer  # commits floors
        self.store = store
        self.outputs = outputs
        self.deltas_topic = settings.topic("deltas")
        self.tuning = LedgerSettings.of(settings)

    def due(self, owned: OwnedPartitions) -> list[tuple[int, bool]]:
        """(partition, erasure) of every checkpoint due now: an erasure rotation whose window
        passed, or ``checkpoint_every_messages`` / ``checkpoint_every_seconds`` since the last."""
        s, now = self.tuning, time.monotonic()
        due: list[tuple[int, bool]] = []
        for ps in owned:
            if ps.erasure_since is not None and now - ps.erasure_since >= s.erasure_rotate_seconds:
                due.append((ps.partition, True))
            elif ps.pending and (ps.pending >= s.checkpoint_every_messages
                                 or now - ps.last_checkpoint >= s.checkpoint_every_seconds):
                due.append((ps.partition, False))
        return due

    def checkpoint(self, ps: PartitionState, topic_id: str, erasure: bool = False) -> None:
        """Steps 1-8 (class docstring) for ``ps``, whose state belongs to the deltas topic
        ``topic_id``. ``erasure``: the partition applied deletes since its last erasure rotation."""
        part, started = ps.partition, time.monotonic()
        self.outputs.flush("checkpoint")  # 1
        if erasure:
            log.info("deltas partition %d: erasure rotation starts (%d heads)", part, len(ps.heads))
        dropped = True
        if erasure or self.store.needs_heads_rotation(part):  # 2
            dropped = self._rewrite_heads(ps)
        rewriting = erasure or self.store.needs_rotation(part)
        old_generation = self.store.begin_rewrite(part) if rewriting else None  # 3
        self._write_snapshots(ps, rewriting)  # 4
        floor = safe_floor(ps.next_offset, ps.last_touched,
                           {h: p.applied_offset for h, p in ps.pointers.items()})
        self.store.write_checkpoint(Checkpoint(part, floor, topic_id, dict(ps.pointers),  # 5
                                               erasure_pending=ps.erasure_since is not None and not erasure))
        if rewriting:  # 6
            dropped = self.store.end_rewrite(part, old_generation, ps.pointers) and dropped
            log.info("deltas partition %d: ledger state rewritten (%s)", part, "trimmed" if old_generation is None
                     else f"moved to generation {old_generation + 1}")
        if erasure and not dropped:  # 7: tried again after another window, never in a loop
            ps.erasure_since = time.monotonic()
        elif erasure:
            ps.erasure_since = None
            log.info("deltas partition %d: erasure rotation done: %d heads in %.3fs (%d state bytes, %d head bytes "
                     "written); %s", part, len(ps.heads), time.monotonic() - started, self.store.written.get(part, 0),
                     self.store.heads_written.get(part, 0), "older records trimmed" if self.store.trims else
                     f"the superseded heads generation goes in {self.tuning.heads_retire_seconds:.0f}s")
        self._commit_floor(part, floor)  # 8
        ps.last_touched = {h: o for h, o in ps.last_touched.items() if o >= floor}
        ps.pending = 0
        ps.last_checkpoint = time.monotonic()

    def _write_snapshots(self, ps: PartitionState, every: bool) -> None:
        """Step 4: a snapshot of each head not in a durable one yet (``every``: of each head)."""
        for head_id, head in sorted(ps.heads.items()):
            ptr = ps.pointers.get(head_id)
            last = ps.last_touched.get(head_id)
            stale = ptr is None or head.dirty_since_snapshot > 0 or (last is not None and ptr.applied_offset < last)
            if every or stale:
                ps.pointers[head_id] = self.store.write_snapshot(ps.partition, head.state(), ptr)
                head.dirty_since_snapshot = 0

    def _rewrite_heads(self, ps: PartitionState) -> bool:
        """Step 2: every head's current version as an exact update first (a fast head is reset:
        what is left then holds a digest for every head), then the older updates go. False: the
        trim failed (the erasure stays pending)."""
        rewrite = self.store.begin_heads_rewrite(ps.partition)
        for _, head in sorted(ps.heads.items()):
            if head.mode == "fast":
                head.reset("heads rotation")
            self.outputs.publish_head(ps.partition, head)
        self.outputs.flush("heads rotation")
        dropped = self.store.end_heads_rewrite(rewrite)
        log.info("deltas partition %d: head updates rewritten into %s", ps.partition,
                 self.store.heads_topic(ps.partition))
        return dropped

    def _commit_floor(self, part: int, floor: int) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            self.consumer.commit(offsets=[TopicPartition(self.deltas_topic, part, floor)], asynchronous=True)
        except KafkaException as exc:  # informative only (lag monitoring); the checkpoint is what counts
            log.debug("commit of partition %d floor %d: %s", part, floor, exc)


#: The ledger's counters that are outcomes of a deltas message (``unlearn_ledger_events_total``).
LEDGER_OUTCOMES = {"applied": "applied", "skipped": "skipped_redelivered"}


class LedgerWorker:
    """One ledger worker process (one consumer-group member): the poll loop (module docstring)."""

    def __init__(self, settings: Settings, worker_id: str = "ledger-0", metrics: WorkerMetrics | None = None) -> None:
        from confluent_kafka import Consumer, Producer

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
        self.consumer = Consumer(consumer_config(settings, self.group, **self.metrics.consumer_settings(), **{
            "client.id": worker_id,
            # Eager rebalances: every partition is checkpointed and given up, then reassigned and
            # rebuilt from its checkpoint. Simple to reason about; rebuilding costs the state size.
            "partition.assignment.strategy": "roundrobin",
        }))
        # linger.ms=0: a poll's head update and receipts go out at once (librdkafka's default
        # 5 ms linger was on every delete->head path; each poll produces a few messages anyway)
        self.producer = Producer(producer_config(settings, **{"client.id": worker_id, "linger.ms": 0}))
        self.store = ChangelogStore(settings)
        self.contracts = ContractGammas(settings)
        self.owned = OwnedPartitions()
        self.outputs = Outputs(settings, self.producer, self.store, self.stats)
        self.tuning = LedgerSettings.of(settings)
        config = HeadConfig(HeadSettings.of(settings).gamma, self.tuning.reset_every_events,
                            self.tuning.drift_threshold)
        self.fold = DeltaFold(settings, self.owned, self.outputs, self.contracts, RowOpener(settings), config)
        self.recovery = Recovery(settings, self.consumer, self.store, self.outputs, config)
        self.checkpointer = Checkpointer(settings, self.consumer, self.store, self.outputs)
        self.topic_id = ""
        self.fatal: BaseException | None = None
        self.ready = False
        self.stopping = False
        self.on_ready: Callable[[], None] | None = None

    # ---------------------------------------------------------------- the poll loop
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
                started = time.perf_counter()
                poll = PollOutputs()
                for m in msgs:
                    self._on_message(m, poll)
                self._publish_poll(poll)  # before any checkpoint can cover these messages
                if msgs:
                    self.metrics.batch_duration.observe(time.perf_counter() - started)
                self.outputs.serve()
                self._timed_resets()
                for part, erasure in self.checkpointer.due(self.owned):
                    self.checkpoint(part, erasure)
                self.store.retire_due()
            for ps in sorted(self.owned, key=lambda ps: ps.partition):
                if ps.pending:
                    self.checkpoint(ps.partition)
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

    def _on_message(self, m: Any, poll: PollOutputs) -> None:
        from confluent_kafka import KafkaError, KafkaException

        err = m.error()
        if err is not None:
            if err.fatal():  # the client cannot go on (infra.retry): stop loudly, the restart recovers
                raise KafkaException(err)
            if err.code() != KafkaError._PARTITION_EOF:  # transient: the client retries the fetch itself
                log.warning("deltas consumer: %s", err)
            return
        ps = self.owned.get(m.partition())
        if ps is None or m.offset() < ps.next_offset:
            self.stats["skipped"] += 1
            return  # not ours (any more), or already covered by the partition's state
        ps.next_offset = m.offset() + 1
        ps.pending += 1
        poll.record_ts = m.timestamp()[1] / 1000.0
        poll.read_trace(m.headers())
        self.fold.fold(ps, m.offset(), m.key(), m.value() or b"", poll)

    def _publish_poll(self, poll: PollOutputs) -> None:
        self.outputs.publish_poll(poll)
        now = time.time()
        for ts in poll.delete_ts:
            if ts > 0:  # a message without a timestamp (-1) says nothing of its lag
                self.delete_lag.observe(max(0.0, now - ts))
        self.stats["applied"] += sum(len(o) for o in poll.outcomes.values())
        self.stats["deletes_applied"] += len(poll.delete_ts)

    def _timed_resets(self) -> None:
        """Canonical heads on a clock: a fast head older than ``reset_every_seconds`` is reset
        and republished as exact (same version: the ledger did not change)."""
        for ps in self.owned:
            for head in ps.heads.values():
                if head.timed_reset_due(self.tuning.reset_every_seconds):
                    head.reset("timer")
                    self.outputs.publish_head(ps.partition, head)

    def checkpoint(self, part: int, erasure: bool = False) -> None:
        """Make ``part``'s processed messages durable (``Checkpointer``; ``erasure``: rotate its
        state and head updates away from before the deletes it applied)."""
        self.checkpointer.checkpoint(self.owned[part], self.topic_id, erasure)

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

    # ---------------------------------------------------------------- rebalances
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        started = time.monotonic()
        try:
            for tp in partitions:
                ps = self.recovery.recover(tp.partition, self.topic_id)
                self.owned.add(ps)
                tp.offset = ps.next_offset
            consumer.assign(partitions)
        except Exception as exc:  # surfaced from run(): never process a partition we could not rebuild
            self.fatal = exc
            consumer.assign([])
            return
        owned = sorted(self.owned.states)
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
            ps = self.owned.get(tp.partition)
            if ps is not None and ps.pending and self.fatal is None:  # nothing new: already durable
                try:
                    self.checkpoint(tp.partition)
                except Exception as exc:
                    self.fatal = exc
            self.owned.drop(tp.partition)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        # Another worker owns them now: writing state for them could race its writes.
        for tp in partitions:
            log.warning("deltas partition %d lost (session timeout); dropping its state", tp.partition)
            self.owned.drop(tp.partition)


def run_ledger_worker(settings: Settings, worker_id: str = "ledger-0", loglevel: str = "info",
                      metrics: WorkerMetrics | None = None) -> int:
    """Run one ledger worker until SIGINT/SIGTERM; 0 on a clean stop, 2 on state that does not
    match the log (the message names the mismatch)."""
    from threadpoolctl import threadpool_limits

    from unlearn.infra.topics import create_topics

    # Per-message work is O(d^2) BLAS-2/3 on small operands: a second BLAS thread buys little and,
    # when another process holds a core, stalls each call by milliseconds (bench/ledger_bench s.0).
    with threadpool_limits(limits=LedgerSettings.of(settings).ledger_blas_threads, user_api="blas"):
        create_topics(settings)
        tracing.configure_from_env("unlearn-ledger")
        worker = LedgerWorker(settings, worker_id, metrics)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        try:
            worker.run()
        except StaleStateError as exc:
            log.error("%s", exc)
            return 2
    log.info("ledger worker %r stopped", worker_id)
    return 0
