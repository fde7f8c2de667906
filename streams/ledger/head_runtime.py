"""One head inside the ledger processor (:class:`HeadRuntime`): exact ledger + fast tracker +
bookkeeping, no I/O.

The ledger worker hands each ``deltas`` message with its offset to ``HeadRuntime.apply``
(``DeltaFold``, delta_fold.py), which applies it to the exact ledger and the retained rows'
multiset hash (one version per message, by the rules of ``delta_rules``); once per poll, before
publishing the head, ``HeadRuntime.sync`` (``Outputs``, outputs.py) brings the fast head up to the
ledger in one tracker update or a reset (``TrackedHead.sync``: coalescing,
docs/ledger-processor.md). Keeping the logic here makes every rule (skip redelivered offsets,
reject bad entries without touching state, receipts, reset policy) testable without a broker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from unlearn.ledger import ExactLedger, MultisetHash, TrackedHead, relative_deviation
from unlearn.ledger.limb_products import DEFER_ROWS
from unlearn.ledger.tracked_head import HeadMode
from unlearn.schemas.delta_codec import Delta, Entry, PackedEntry, RowsEntry
from unlearn.streams.ledger.delta_rules import (
    AppliedDelete,
    Rejection,
    admit,
    apply_entries,
    declare_outputs,
    fold_multiset,
    group_by_event,
    record_applied,
)
from unlearn.streams.ledger.snapshots import HeadMeta, HeadState


@dataclass
class ApplyOutcome:
    """What one deltas message did. ``version`` is the version it made and ``retained_hash`` that
    version's fingerprint (computed only when it applied deletes: their receipts carry it), so a
    receipt names the same pair whatever the poll boundaries of the run that issued it."""

    skipped: str = ""  # why nothing was done: "redelivered" | "duplicate_source" ("" = applied)
    rejections: list[Rejection] = field(default_factory=list)
    deletes: list[AppliedDelete] = field(default_factory=list)
    rows_applied: int = 0
    version: int = 0
    retained_hash: str | None = None


@dataclass(frozen=True)
class HeadConfig:
    gamma: float
    reset_every: int
    drift_threshold: float
    hold_rows: int = DEFER_ROWS  # rows whose exact products may wait for idle time (``idle_work``)
    factor_hold_rows: int = 0  # rows the fast head's factor may take at idle time (``idle_work``)


class HeadRuntime:
    """Live state of one head. ``version`` counts applied delta messages, so the same deltas log
    always yields the same (version, digest, retained hash) triples, also after a crash and replay.

    ``multiset`` is the multiset hash of the retained rows (docs/design.md section 6), kept next
    to the ledger; None once it is unknown (a packed entry without one, or a version 1 snapshot).
    The ledger and the hash take each message in ``apply``; the fast head lags until ``sync``."""

    def __init__(self, head_id: str, ledger: ExactLedger, config: HeadConfig, *,
                 multiset: MultisetHash | None = None, version: int = 0,
                 events_covered: int = 0, applied_offset: int = -1, input_partition: int = -1,
                 last_reset_drift: float = 0.0, source_offsets: dict[str, int] | None = None,
                 contract_version: int | None = None) -> None:
        self.head_id = head_id
        self.config = config
        self.multiset = multiset
        ledger.hold_rows = config.hold_rows
        self.tracked = TrackedHead(ledger, config.gamma, reset_every=config.reset_every,
                                   drift_threshold=config.drift_threshold,
                                   factor_hold_rows=config.factor_hold_rows)
        self.fast_drift = float(last_reset_drift)
        self.version = version
        self.events_covered = events_covered
        self.applied_offset = applied_offset
        self.input_partition = input_partition
        self.source_offsets: dict[str, int] = dict(source_offsets or {})
        self.contract_version = contract_version
        self.last_reset_at = time.monotonic()
        self.dirty_since_snapshot = 0
        self._digest: tuple[int, str] | None = None
        self._retained_hash: tuple[int, str | None] | None = None

    # ---------------------------------------------------------------- construction
    @classmethod
    def new(cls, head_id: str, delta: Delta, config: HeadConfig) -> HeadRuntime:
        """A head is created by its first add; its dimension and grids come from that delta, its
        label columns from the contract the delta names (``apply`` sizes them: ``declare_outputs``)."""
        return cls(head_id, ExactLedger(delta.d, 0, delta.frac_bits, delta.label_frac_bits), config,
                   multiset=MultisetHash(delta.d, delta.frac_bits, delta.label_frac_bits))

    @classmethod
    def from_snapshot(cls, state: HeadState, config: HeadConfig) -> HeadRuntime:
        meta = state.meta
        cfg = replace(config, gamma=meta.gamma)
        return cls(meta.head_id, state.ledger, cfg, multiset=state.multiset, version=meta.version,
                   events_covered=meta.events_covered, applied_offset=meta.applied_offset,
                   input_partition=meta.input_partition, last_reset_drift=meta.last_reset_drift,
                   source_offsets=meta.source_offsets, contract_version=meta.contract_version)

    def meta(self) -> HeadMeta:
        return HeadMeta(self.head_id, self.config.gamma, self.version, self.events_covered, self.applied_offset,
                        self.input_partition, self.last_reset_drift, dict(self.source_offsets),
                        self.contract_version)

    def state(self) -> HeadState:
        """What a snapshot keeps (the ledger and the hash are the live objects, not copies)."""
        return HeadState(self.meta(), self.ledger, self.multiset)

    def frozen_state(self) -> HeadState:
        """``state()`` copied (a few ms at d = 768): a background writer encodes it while the
        head goes on taking messages."""
        return HeadState(self.meta(), self.ledger.copy(), None if self.multiset is None else self.multiset.copy())

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
    def posterior(self) -> NDArray[np.float64]:
        """(F^T F + gamma I)^-1 as the fast head holds it (what an exact head update may carry)."""
        return self.tracked.posterior

    @property
    def last_reset_drift(self) -> float:
        """The fast path's error as last measured (snapshots keep it under this name): ``fast_drift``."""
        return self.fast_drift

    def retained_classes(self) -> np.ndarray | None:
        """bool (c,) over the served head's columns: True where the ledger's exact per-class count
        is > 0. None when some retained row has a target-vector label (the class counts then do
        not describe every row: every column is an output)."""
        counts = self.ledger.class_counts
        if int(counts.sum()) != self.ledger.count:
            return None
        c = int(self.weights.shape[1])
        mask = np.zeros(c, dtype=bool)
        k = min(c, counts.shape[0])
        mask[:k] = counts[:k] > 0
        return mask

    def digest(self) -> str:
        """Ledger digest, cached per version (it costs O(d^2): exact head updates only carry it)."""
        if self._digest is None or self._digest[0] != self.version:
            self._digest = (self.version, self.ledger.digest())
        return self._digest[1]

    def retained_hash(self) -> str | None:
        """Fingerprint of the retained rows' multiset hash (None: unknown), cached per version."""
        if self._retained_hash is None or self._retained_hash[0] != self.version:
            self._retained_hash = (self.version, None if self.multiset is None else self.multiset.fingerprint())
        return self._retained_hash[1]

    # ---------------------------------------------------------------- updates
    def apply(self, delta: Delta, offset: int, partition: int) -> ApplyOutcome:
        """Apply one deltas message at input ``offset`` to the exact ledger and the multiset hash:
        one version. Entries apply atomically one by one; a bad entry is rejected (state
        untouched) and the others proceed. The fast head takes the rows at the next ``sync``."""
        skipped = admit(self, delta, offset)
        if skipped:
            return ApplyOutcome(skipped=skipped)
        out = ApplyOutcome()
        self.contract_version = declare_outputs(self.ledger, delta, self.contract_version)
        for _, entry, rep in apply_entries(self.head_id, delta, self.ledger, self._apply_entry):
            if isinstance(rep, Rejection):
                out.rejections.append(rep)
                continue
            out.rows_applied += entry.n
            self.events_covered += len(set(entry.event_ids))
            if entry.sign < 0:
                out.deletes.extend(_group_deletes(entry))
        record_applied(self, delta, offset)
        self.input_partition = partition
        self.version += 1
        self.dirty_since_snapshot += 1
        out.version = self.version
        if out.deletes:
            out.retained_hash = self.retained_hash()
        return out

    def _apply_entry(self, entry: RowsEntry | PackedEntry) -> None:
        if isinstance(entry, RowsEntry):
            self.tracked.apply(entry.q, entry.labels, entry.sign)
        else:
            self.tracked.apply_packed(ExactLedger.from_bytes(entry.ledger_blob), entry.sign)
        self.multiset = fold_multiset(self.multiset, entry)  # only after the ledger took the entry

    def idle_work(self, most: int) -> int:
        """A step of idle work on at most ``most`` rows, no change of value, so no version: the
        exact products that wait (``config.hold_rows``), or once none do, the rows the fast
        head's factor has not taken (``config.factor_hold_rows``); returns how many rows. One kind
        per step: a step of both took twice as long (9 ms at d = 768), and a message fetched
        meanwhile waits for the step."""
        products = self.ledger.products
        done = 0 if products is None else products.multiply_some(most)
        return done if done else self.tracked.fold_waiting(most)

    def sync(self) -> str:
        """Bring the fast head up to the ledger, once per poll (``TrackedHead.sync``: one tracker
        update for every message applied since, or a reset). Returns why a reset ran ("" when
        none)."""
        rep = self.tracked.sync()
        if rep.reset_reason:
            self.last_reset_at = time.monotonic()
            if rep.measured:
                self.fast_drift = rep.drift
        return rep.reset_reason

    def timed_reset_due(self, every_seconds: float, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.mode == "fast" and now - self.last_reset_at >= every_seconds

    def begin_reset(self) -> ResetCopy | None:
        """A reset to be computed off the poll thread (``canonical_copy``): copies of the state
        and of the served W taken now (a few ms at d = 768, against ~60 ms for the reset, its
        digest and its posterior), and the fast head's mark (``TrackedHead.mark``). None while
        the fast head lags the ledger (take it after ``sync``)."""
        mark = self.tracked.mark()
        if mark is None:
            return None
        self.last_reset_at = time.monotonic()
        return ResetCopy(self.frozen_state(), self.weights.copy(), mark)

    def end_reset(self, start: ResetCopy, canonical: HeadRuntime, drift: float, max_rows: int) -> str:
        """Take ``canonical`` (``canonical_copy`` of ``start``): its ``drift`` becomes the fast
        head's measured deviation, and when the head took at most ``max_rows`` rows since, its
        factor becomes the fast head, moved by them (exact when there were none). More rows
        would cost the poll thread a tracker update of them again: the fast head goes on, its
        deviation now measured (in place of a drift estimate: past the threshold the next sync
        resets; the periodic resets still bound it). Returns
        "adopted", "measured", or "" when a reset ran since ``begin_reset`` (a refused downdate,
        coalesced rows): then ``canonical`` is older than this head, and nothing changes."""
        rows = self.tracked.rows_since(start.mark)
        if rows is None:
            return ""
        if rows > max_rows:
            self.tracked.release(start.mark, drift)  # a drift check: past the threshold, the next sync resets
            self.fast_drift = drift
            return "measured"
        rep = self.tracked.adopt(canonical.tracked.tracker, drift, start.mark)
        if rep is not None and rep.measured:
            self.fast_drift = rep.drift
        self.last_reset_at = time.monotonic()
        return "adopted"

    def reset(self, reason: str) -> None:
        """Canonical head now, from the ledger (which also covers any rows the fast head has not
        taken). The version is unchanged: same ledger. ``fast_drift`` takes the replaced head's
        deviation only when that was a fast head that had taken every row (a timer, a rotation):
        a head rebuilt instead of tracked (coalesced rows, packed statistics) measured nothing."""
        rep = self.tracked.reset(reason, measured=self.mode == "fast")
        if rep.measured:
            self.fast_drift = rep.drift
        self.last_reset_at = time.monotonic()


@dataclass(frozen=True)
class ResetCopy:
    """What ``HeadRuntime.begin_reset`` took: the head's state at one version (copies), the fast
    W served then, and the fast head's mark."""

    state: HeadState
    fast_weights: NDArray[np.float64]
    mark: int


def canonical_copy(start: ResetCopy, config: HeadConfig) -> tuple[HeadRuntime, float]:
    """The head of ``start``'s copies, reset (canonical: ``mode == "exact"``, bit-identical to
    ``solve_head``), and the deviation from it of the fast W served then. Touches only the copies,
    so a thread may run it while the live head goes on."""
    head = HeadRuntime.from_snapshot(start.state, config)
    fast, exact = start.fast_weights, head.weights
    if fast.shape[1] < exact.shape[1]:  # classes declared since the last reset: zero columns
        fast = np.hstack([fast, np.zeros((fast.shape[0], exact.shape[1] - fast.shape[1]))])
    drift = relative_deviation(fast, exact) if fast.shape == exact.shape else float("inf")
    return head, drift


def _group_deletes(entry: Entry) -> list[AppliedDelete]:
    return group_by_event(entry.event_ids, entry.sample_ids, entry.subject_ids)
