"""One head inside the ledger processor: exact ledger + fast tracker + bookkeeping, no I/O.

The faust app is a thin shell around this: it hands each ``deltas`` message with its offset to
``HeadRuntime.apply`` and publishes what comes back. Keeping the logic here makes every rule
(skip redelivered offsets, reject bad entries without touching state, receipts, reset policy)
testable without a broker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from unlearn.ledger import ExactLedger, LedgerError, NonMemberDelete, TrackedHead
from unlearn.ledger.tracked import HeadMode
from unlearn.schemas.delta_codec import Delta, PackedEntry, RowsEntry
from unlearn.schemas.source_id import dedup_key

from .snapshot import HeadMeta


#: ("<stream>/<partition>", offset) of a delta's source: skips deltas a featurizer re-produced.
parse_source_id = dedup_key


@dataclass(frozen=True)
class Rejection:
    """An entry the ledger refused; it goes to deadletter and (for deletes) a rejected receipt."""

    entry_index: int
    sign: int
    reason: str  # machine-readable code
    detail: str
    event_ids: tuple[str, ...]
    sample_ids: tuple[str, ...]
    subject_ids: tuple[str, ...]


@dataclass(frozen=True)
class AppliedDelete:
    """A delete event whose rows left the ledger: the receipt's content."""

    event_id: str
    subject_id: str
    sample_ids: tuple[str, ...]


@dataclass
class ApplyOutcome:
    skipped: str = ""  # why nothing was done: "redelivered" | "duplicate_source" ("" = applied)
    rejections: list[Rejection] = field(default_factory=list)
    deletes: list[AppliedDelete] = field(default_factory=list)
    reset_reason: str = ""
    rows_applied: int = 0


@dataclass(frozen=True)
class HeadConfig:
    gamma: float
    reset_every: int
    drift_threshold: float


class HeadRuntime:
    """Live state of one head. ``version`` counts applied delta messages, so the same deltas log
    always yields the same (version, digest) pairs, also after a crash and replay."""

    def __init__(self, head_id: str, ledger: ExactLedger, config: HeadConfig, *, version: int = 0,
                 events_covered: int = 0, applied_offset: int = -1, input_partition: int = -1,
                 last_reset_drift: float = 0.0, source_offsets: dict[str, int] | None = None) -> None:
        self.head_id = head_id
        self.config = config
        self.tracked = TrackedHead(ledger, config.gamma, reset_every=config.reset_every,
                                   drift_threshold=config.drift_threshold)
        self.tracked.tracker.last_reset_drift = last_reset_drift
        self.version = version
        self.events_covered = events_covered
        self.applied_offset = applied_offset
        self.input_partition = input_partition
        self.source_offsets: dict[str, int] = dict(source_offsets or {})
        self.last_reset_at = time.monotonic()
        self.dirty_since_snapshot = 0
        self._digest: tuple[int, str] | None = None

    # ---------------------------------------------------------------- construction
    @classmethod
    def new(cls, head_id: str, delta: Delta, config: HeadConfig) -> "HeadRuntime":
        """A head is created by its first add; its dimension and grids come from that delta."""
        return cls(head_id, ExactLedger(delta.d, 0, delta.frac_bits, delta.label_frac_bits), config)

    @classmethod
    def from_snapshot(cls, meta: HeadMeta, ledger: ExactLedger, config: HeadConfig) -> "HeadRuntime":
        cfg = HeadConfig(meta.gamma, config.reset_every, config.drift_threshold)
        return cls(meta.head_id, ledger, cfg, version=meta.version, events_covered=meta.events_covered,
                   applied_offset=meta.applied_offset, input_partition=meta.input_partition,
                   last_reset_drift=meta.last_reset_drift, source_offsets=meta.source_offsets)

    def meta(self) -> HeadMeta:
        return HeadMeta(self.head_id, self.config.gamma, self.version, self.events_covered, self.applied_offset,
                        self.input_partition, self.last_reset_drift, dict(self.source_offsets))

    # ---------------------------------------------------------------- views
    @property
    def ledger(self) -> ExactLedger:
        return self.tracked.ledger

    @property
    def mode(self) -> HeadMode:
        return self.tracked.mode

    @property
    def weights(self) -> np.ndarray:
        return self.tracked.weights

    @property
    def last_reset_drift(self) -> float:
        return self.tracked.last_reset_drift

    def digest(self) -> str:
        """Ledger digest, cached per version (it costs O(d^2))."""
        if self._digest is None or self._digest[0] != self.version:
            self._digest = (self.version, self.ledger.digest())
        return self._digest[1]

    # ---------------------------------------------------------------- updates
    def apply(self, delta: Delta, offset: int, partition: int) -> ApplyOutcome:
        """Apply one deltas message at input ``offset``. Entries apply atomically one by one; a bad
        entry is rejected (state untouched) and the others proceed."""
        if offset <= self.applied_offset:
            return ApplyOutcome(skipped="redelivered")
        src = parse_source_id(delta.source_id)
        if src is not None and src[1] <= self.source_offsets.get(src[0], -1):
            # the same requests were already applied from an earlier copy of this delta
            self.applied_offset = offset
            return ApplyOutcome(skipped="duplicate_source")
        out = ApplyOutcome()
        grid = (delta.d, delta.frac_bits, delta.label_frac_bits)
        mine = (self.ledger.dim, self.ledger.frac_bits, self.ledger.label_frac_bits)
        for i, entry in enumerate(delta.entries):
            if grid != mine:
                reason = "dimension_mismatch" if delta.d != self.ledger.dim else "grid_mismatch"
                out.rejections.append(_reject(i, entry, reason,
                                              f"delta has (d, frac_bits, label_frac_bits) = {grid}, head {self.head_id!r} has {mine}"))
                continue
            try:
                if isinstance(entry, RowsEntry):
                    rep = (self.tracked.add if entry.sign > 0 else self.tracked.delete)(entry.q, entry.labels)
                else:
                    rep = self.tracked.absorb(ExactLedger.from_bytes(entry.ledger_blob), entry.sign)
            except NonMemberDelete as exc:
                out.rejections.append(_reject(i, entry, "non_member_delete", str(exc)))
                continue
            except LedgerError as exc:
                out.rejections.append(_reject(i, entry, "invalid_entry", str(exc)))
                continue
            if rep.reset_reason:
                out.reset_reason = rep.reset_reason
                self.last_reset_at = time.monotonic()
            out.rows_applied += entry.n
            self.events_covered += len(set(entry.event_ids))
            if entry.sign < 0:
                out.deletes.extend(_group_deletes(entry))
        self.applied_offset = offset
        self.input_partition = partition
        if src is not None:
            self.source_offsets[src[0]] = src[1]
        self.version += 1
        self.dirty_since_snapshot += 1
        return out

    def timed_reset_due(self, every_seconds: float, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.mode == "fast" and now - self.last_reset_at >= every_seconds

    def reset(self, reason: str) -> None:
        """Canonical head now (timer or operator request). The version is unchanged: same ledger."""
        self.tracked.reset(reason)
        self.last_reset_at = time.monotonic()


def _reject(i: int, entry: RowsEntry | PackedEntry, reason: str, detail: str) -> Rejection:
    return Rejection(i, entry.sign, reason, detail, entry.event_ids, entry.sample_ids, entry.subject_ids)


def _group_deletes(entry: RowsEntry | PackedEntry) -> list[AppliedDelete]:
    """Rows of one delete event (delete_subject expands to many) become one receipt."""
    groups: dict[str, tuple[str, list[str]]] = {}
    for ev, sample, subject in zip(entry.event_ids, entry.sample_ids, entry.subject_ids):
        groups.setdefault(ev, (subject, []))[1].append(sample)
    return [AppliedDelete(ev, subj, tuple(samples)) for ev, (subj, samples) in groups.items()]
