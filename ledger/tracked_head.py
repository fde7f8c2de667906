"""A live head (:class:`TrackedHead`): the exact ledger (source of truth) plus a fast head in
either form (``tracker``: SMW or Cholesky factor), and the policy that resets it from the ledger.

This is the pure core the ledger processor wraps. Every update goes to the exact ledger first
(which rejects invalid deletes atomically), then to the fast tracker: at once (``add``,
``delete``), or, for a caller that applies many messages between publications (the ledger
processor), ``apply`` now and ``sync`` once later (apply-then-sync: the rows of every message
applied since in one tracker update). Float drift accumulates, so ``reset`` restores the canonical
head (bit-identical to ``solve_head``) and reports how far the fast head had drifted: every
``reset_every`` updates, on an infeasible/ill-conditioned downdate, when the drift estimate
passes ``drift_threshold``, when ``sync`` has packed statistics or at least ``d / 2`` rows to take,
or when the caller asks (e.g. a timer). A caller that cannot stop for a reset (the ledger
processor's timer) computes one elsewhere from a copy of the ledger (``mark``, then ``adopt``):
the canonical head at the mark, moved by the rows tracked since.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from unlearn.ledger.cholesky_tracker import DEFAULT_FACTOR_KERNEL, CholeskyTracker, FactorKernel
from unlearn.ledger.exact_ledger import ExactLedger
from unlearn.ledger.smw_tracker import SMWTracker

__all__ = [
    "DEFAULT_TRACKER",
    "HeadMode",
    "TrackedHead",
    "TrackerKind",
    "UpdateReport",
]


HeadMode = Literal["exact", "fast"]
#: Rows the ledger holds and the fast head has not taken yet: (Q, Y, sign) from ``prepare_rows``.
Rows = list[tuple[NDArray[np.int64], NDArray[np.int64], int]]
TrackerKind = Literal["smw", "cholesky"]
#: The fast head's default form: the factor, 1.6-4x faster than SMW per update with the compiled kernel
#: and 2x cheaper to reset (docs/design.md section 2, bench/results/ledger_kernel.md section 8).
DEFAULT_TRACKER: TrackerKind = "cholesky"


@dataclass(frozen=True)
class UpdateReport:
    """What an update did to the served head."""

    mode: HeadMode  # "exact" right after a reset, else "fast"
    reset_reason: str = ""  # why a reset ran ("" when none)
    drift: float = 0.0  # drift of the fast head measured at that reset
    measured: bool = True  # False: the replaced fast head had not taken every row, so drift compares nothing


class TrackedHead:
    """Exact ledger + fast tracker (SMW or Cholesky factor) with periodic Cholesky resets."""

    def __init__(self, ledger: ExactLedger, gamma: float = 1.0, reset_every: int = 1000,
                 drift_threshold: float = 1e-9, drift_check_every: int = 64, min_pivot: float = 1e-8,
                 tracker: TrackerKind = DEFAULT_TRACKER,
                 factor_kernel: FactorKernel = DEFAULT_FACTOR_KERNEL, factor_hold_rows: int = 0) -> None:
        if reset_every < 1 or drift_check_every < 1:
            raise ValueError("reset_every and drift_check_every must be >= 1")
        if tracker not in ("smw", "cholesky"):
            raise ValueError(f"tracker must be 'smw' or 'cholesky', got {tracker!r}")
        self.ledger = ledger
        self.gamma = float(gamma)
        self.reset_every = int(reset_every)
        self.drift_threshold = float(drift_threshold)
        self.drift_check_every = int(drift_check_every)
        self.tracker: SMWTracker | CholeskyTracker = (
            CholeskyTracker.from_ledger(ledger, gamma, min_pivot, factor_kernel, factor_hold_rows)
            if tracker == "cholesky"
            else SMWTracker.from_ledger(ledger, gamma, min_pivot))
        self.mode: HeadMode = "exact"
        self.resets = 0
        self._pending: Rows = []  # applied to the ledger, not yet to the fast head
        self._reset_due = ""  # why the next ``sync`` must reset ("" = it need not)
        self._journal: Rows | None = None  # rows tracked since ``mark`` (None: no mark in force)
        self._marks = 0  # marks taken: ``adopt`` takes only the latest
        self._checked = 0  # tracker updates since the reset when the drift was last measured by ``release``

    @property
    def weights(self) -> NDArray[np.float64]:
        """The served head W (d, c): canonical after a reset, tracker-updated otherwise."""
        return self.tracker.W

    @property
    def posterior(self) -> NDArray[np.float64]:
        """(F^T F + gamma I)^-1 (d, d) as the fast head holds it: exact right after a reset."""
        return self.tracker.T

    @property
    def last_reset_drift(self) -> float:
        return self.tracker.last_reset_drift

    def _factor(self, Q: NDArray[np.int64], Y: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        # U = Q * 2^-k is exact in float64 (|q| <= 2^30); U^T U is the real-scale delta S. The labels
        # go instead of dG = U^T Y: the trackers update W from them by products of the live columns
        # only (dG spans every column of the head: 0.45 ms for 90 rows at d = 768 and 100 columns).
        U = Q.astype(np.float64) * (2.0 ** -self.ledger.frac_bits)
        Yf = Y.astype(np.float64) * (2.0 ** -self.ledger.label_frac_bits)
        return U, Yf

    def add(self, Q: ArrayLike, y: ArrayLike) -> UpdateReport:
        """Add rows to the ledger (exact) and to the fast head."""
        return self._update(Q, y, +1)

    def delete(self, Q: ArrayLike, y: ArrayLike) -> UpdateReport:
        """Delete rows; a non-member delete raises (from the ledger) and changes nothing."""
        return self._update(Q, y, -1)

    def _update(self, Q: ArrayLike, y: ArrayLike, sign: int) -> UpdateReport:
        Qc, Y, idx = self.ledger.prepare_rows(Q, y)
        self.ledger.apply_prepared(Qc, Y, idx, sign)
        return self.track([(Qc, Y, sign)])

    def apply(self, Q: ArrayLike, y: ArrayLike, sign: int) -> None:
        """Apply rows to the ledger now, all or nothing (a refused entry raises and changes
        nothing); the fast head takes them at the next ``sync``."""
        Qc, Y, idx = self.ledger.prepare_rows(Q, y)
        self.ledger.apply_prepared(Qc, Y, idx, sign)
        self._pending.append((Qc, Y, sign))

    def apply_packed(self, other: ExactLedger, sign: int) -> None:
        """Packed statistics into the ledger now; the next ``sync`` resets (no rows to factor, and
        factoring a Gram costs as much as the reset itself)."""
        self.ledger.absorb(other, sign)
        self._reset_due = "packed statistics"

    def sync(self) -> UpdateReport:
        """Bring the fast head up to the ledger: every row ``apply`` took since the last sync in one
        ``track``, or a reset when one is due (packed statistics) or cheaper (at least ``d / 2``
        rows: a tracker update of rank r costs O(r d^2), and at d = 768 a rank-384 update costs
        about as much as a reset). A reset here measures nothing (the replaced head lagged)."""
        pending, reason = self._pending, self._reset_due
        self.ledger_outputs_sync()  # columns the ledger grew (a contract's classes) serve as zeros
        rows = sum(Q.shape[0] for Q, _, _ in pending)
        if not reason and 2 * rows >= self.ledger.dim:
            reason = f"coalesced {rows} rows"
        if reason:
            return self.reset(reason, measured=self.mode == "fast")
        self._pending = []
        return self.track(pending)

    def track(self, batches: Sequence[tuple[NDArray[np.int64], NDArray[np.int64], int]]) -> UpdateReport:
        """Move the fast head by rows the ledger already holds: ``(Q, Y, sign)`` as ``prepare_rows``
        gave them. A caller that applies many batches to the ledger (the ledger processor, once
        per poll) updates the tracker once: all adds as one rank-r update, then all deletes as one
        (after the adds, so that the Lemma-1 check sees the largest H), then the reset policy.
        With deletes among the batches the adds may wait outside a Cholesky factor
        (``factor_hold_rows``; ``fold_waiting`` takes them at idle time): the deletes' receipts
        then do not wait for the factor's update."""
        before = self.tracker.updates_since_reset
        if self._journal is not None:
            self._journal.extend(batches)
        urgent = any(s < 0 and Q.shape[0] for Q, _, s in batches)  # a delete waits for the adds' update
        for sign in (1, -1):
            parts = [(Q, Y) for Q, Y, s in batches if s == sign and Q.shape[0]]
            if not parts:
                continue
            c = max(Y.shape[1] for _, Y in parts)
            Qs = np.concatenate([Q for Q, _ in parts])
            Ys = np.concatenate([np.pad(Y, ((0, 0), (0, c - Y.shape[1]))) for _, Y in parts])
            U, Yf = self._factor(Qs, Ys)
            if sign > 0:
                try:
                    if isinstance(self.tracker, CholeskyTracker):
                        self.tracker.add(U, None, Yf, wait=urgent)
                    else:
                        self.tracker.add(U, None, Yf)
                except FloatingPointError as exc:  # folding rows that waited outside the factor failed
                    return self.reset(f"add: {exc}", measured=False)
            else:
                chk = self.tracker.delete(U, None, Yf)
                if not chk.feasible:  # the fast head did not take the delete: nothing to measure
                    return self.reset(f"downdate {chk.reason}", measured=False)
        if self.tracker.updates_since_reset == before:
            return UpdateReport(self.mode)
        return self._after_update(before)

    def fold_waiting(self, most: int) -> int:
        """Fold up to ``most`` of the rows the fast head holds outside its factor (the Cholesky
        tracker's ``waiting`` rows, ``factor_hold_rows``) into it: idle work, W does not change;
        returns how many. A fold that loses positive definiteness in rounding folds nothing and
        makes the next ``sync`` reset."""
        tracker = self.tracker
        if not isinstance(tracker, CholeskyTracker) or self._reset_due:
            return 0
        try:
            return tracker.fold_waiting(most)
        except FloatingPointError as exc:
            self._reset_due = str(exc)
            return 0

    def absorb(self, other: ExactLedger, sign: int) -> UpdateReport:
        """Packed statistics (federated mode): exact in the ledger, then a canonical reset (no rows
        to factor, and factoring a Gram costs as much as the reset itself)."""
        self.ledger.absorb(other, sign)
        return self.reset("packed statistics")

    def _after_update(self, before: int) -> UpdateReport:
        self.mode = "fast"
        t = self.tracker.updates_since_reset
        if t >= self.reset_every:
            return self.reset(f"periodic ({t} updates)")
        k, off = self.drift_check_every, self._checked
        if (t - off) // k > (before - off) // k:  # passed a multiple since the last measurement: check
            est = self.tracker.drift_estimate(self.ledger)
            if est > self.drift_threshold:
                return self.reset(f"drift estimate {est:.3g} > {self.drift_threshold:.3g}")
        return UpdateReport(self.mode)

    def reset(self, reason: str = "requested", measured: bool = True) -> UpdateReport:
        """Canonical head from the ledger (Variant A), which also covers rows applied and not yet
        synced; the served head becomes exact. ``measured``: the caller knows the fast head was
        worth measuring, so the drift reported is the fast path's error; never while rows or
        statistics wait for ``sync`` (a stale head was replaced: its drift means nothing)."""
        measured = measured and not self._pending and not self._reset_due
        self._pending, self._reset_due, self._journal = [], "", None  # a mark is void: this head is newer
        self._checked = 0
        self.ledger_outputs_sync()
        drift = self.tracker.reset(self.ledger)
        self.mode = "exact"
        self.resets += 1
        return UpdateReport("exact", reason, drift, measured)

    def mark(self) -> int | None:
        """Start a reset computed elsewhere, from a copy of the ledger taken now: the rows tracked
        from here on are kept so that ``adopt`` can move the canonical head of that copy up to the
        ledger. Returns the mark (``adopt`` takes it back); None while rows or a reset wait for
        ``sync`` (the fast head is not at the ledger, so its drift would compare nothing)."""
        if self._pending or self._reset_due:
            return None
        self._journal = []
        self._marks += 1
        return self._marks

    def rows_since(self, mark: int) -> int | None:
        """Rows tracked since ``mark`` (what ``adopt`` would move the adopted head by: a rank-r
        update, ~0.05-0.15 ms per row at d = 768); None when the mark is void (a reset ran since,
        or a newer mark replaced it)."""
        if self._journal is None or mark != self._marks:
            return None
        return sum(Q.shape[0] for Q, _, _ in self._journal)

    def release(self, mark: int, drift: float | None = None) -> None:
        """Give up ``mark`` without adopting (its rows are no longer kept). ``drift``, the fast
        head's deviation measured at the mark, stands for a drift check: the next estimate is due
        ``drift_check_every`` updates from now, and past the threshold the next ``sync`` resets."""
        if mark != self._marks:
            return
        self._journal = None
        if drift is not None:
            self._checked = self.tracker.updates_since_reset
            if drift > self.drift_threshold:
                self._reset_due = f"drift measured {drift:.3g} > {self.drift_threshold:.3g}"

    def adopt(self, tracker: SMWTracker | CholeskyTracker, drift: float, mark: int,
              reason: str = "timer") -> UpdateReport | None:
        """Make ``tracker`` (canonical for the ledger as it was at ``mark``; ``drift`` the fast
        head's deviation from it then) the fast head, moved by every row tracked since in one
        update: exact when there were none. None, and nothing changes, when a reset ran since the
        mark (this head is canonical at a later point already) or another mark replaced it."""
        journal = self._journal
        if journal is None or mark != self._marks:
            return None
        self._journal, self._checked = None, 0
        tracker.last_reset_drift = drift
        self.tracker, self.mode = tracker, "exact"
        self.resets += 1
        self.ledger_outputs_sync()
        moved = self.track(journal)
        return moved if moved.reset_reason else UpdateReport(self.mode, reason, drift, True)

    def ledger_outputs_sync(self) -> None:
        self.tracker.grow_outputs(self.ledger.n_outputs)
