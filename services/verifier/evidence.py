"""The ``Evidence`` of one head that every check looks at: the log-order replay up to the live
head's version, its units' dependency DAG, the head updates and receipts; and the retained rows
dequantized, the input of an independent retrain.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field

import numpy as np

from unlearn.ledger import ExactLedger, one_hot, solve_head
from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.head import HeadUpdate
from unlearn.schemas.receipts import Receipt
from unlearn.streams.featurizer.tombstones import Tombstone

from .orders import Dependencies, components, dependencies, retained_rows
from .reading import live_updates
from .replay import UNIT_CLASS_ROW, UNIT_VECTOR_ROW, LogReplay, Units, replay_log

__all__ = ["Evidence", "retained_dataset"]


@dataclass
class Evidence:
    """What the checks look at: the log-order replay up to the live head's version, its units'
    dependency DAG and sample groups, the head updates (the live one and the latest exact) and the
    head's applied receipts."""

    head_id: str
    replay: LogReplay
    updates: list[HeadUpdate]
    latest: HeadUpdate | None
    latest_exact: HeadUpdate | None
    digest: str | None  # the replay ledger's: the baseline every other digest must equal
    deps: Dependencies
    comps: list[list[int]]
    receipts: list[Receipt] = field(default_factory=list)
    tombstoned: list[Receipt] = field(default_factory=list)  # the head's deletes that removed nothing
    erased_tombstones: list[Tombstone] = field(default_factory=list)  # of delete rows erased since
    _solved: dict[tuple[int, float], np.ndarray] = field(default_factory=dict)

    @classmethod
    def gather(cls, delta_records: Sequence[LogRecord], head_updates: Sequence[HeadUpdate] | None,
               head_id: str, receipts: Sequence[Receipt] = (),
               created_at: Container[tuple[int, int]] = frozenset(),
               erased_tombstones: Sequence[Tombstone] = ()) -> Evidence:
        """Replay to the live head's version (so every digest describes the events it covers),
        keeping a ledger copy at the latest exact update's version for the canonical check.
        ``receipts``: any receipts; the head's applied ones are kept. ``created_at``: see
        ``replay_log`` (messages that created the head as sent, though erased since);
        ``erased_tombstones``: ``remove_wins.erased_tombstones`` of the rows erased since."""
        updates = list(head_updates or [])
        latest, latest_exact = live_updates(updates)
        stop = latest.version if latest is not None else None
        capture = {v for v in (stop, latest_exact.version if latest_exact else None) if v}
        rep = replay_log(delta_records, head_id, stop, capture, created_at)
        digest = rep.ledger.digest() if rep.ledger is not None else None
        applied = [r for r in receipts if r.head_id == head_id and r.status == "applied"]
        tombstoned = [r for r in receipts if r.head_id == head_id and r.status == "tombstoned"]
        return cls(head_id, rep, updates, latest, latest_exact, digest, dependencies(rep.units),
                   components(rep.units), applied, tombstoned, list(erased_tombstones))

    @property
    def units(self) -> Units:
        return self.replay.units

    @property
    def ledger(self) -> ExactLedger | None:
        return self.replay.ledger

    @property
    def unmatched(self) -> list[int]:
        return self.deps.unmatched

    def retained(self) -> list[int] | None:
        """Row units of the retained multiset, when derivable and there is a replay."""
        return retained_rows(self.units, self.deps) if self.digest is not None else None

    def head_weights(self, version: int, gamma: float) -> np.ndarray:
        """``solve_head`` of the replayed ledger at ``version``, solved once for the canonical and the
        retrain checks (the solve is deterministic, so sharing it changes no result)."""
        key = (version, gamma)
        if key not in self._solved:
            led = self.replay.at_version.get(version)
            if led is None and version == self.replay.version:
                led = self.ledger
            if led is None:
                raise KeyError(f"the replay has no ledger at version {version}")
            self._solved[key] = solve_head(led, gamma)
        return self._solved[key]


def retained_dataset(ev: Evidence) -> tuple[np.ndarray, np.ndarray] | None:
    """The retained rows dequantized (F = q * 2^-k; Y one-hot, or target vectors * 2^-k_y), the
    input of an independent retrain; None when the retained rows are not derivable or empty."""
    retained = ev.retained()
    led = ev.ledger
    if retained is None or led is None:
        return None
    units = ev.units
    cls = [units.ref[u] for u in retained if units.kind[u] == UNIT_CLASS_ROW]
    vec = [units.ref[u] for u in retained if units.kind[u] == UNIT_VECTOR_ROW]
    rows_all = cls + vec
    if not rows_all:
        return None
    c = led.n_outputs
    F = units.Q[np.asarray(rows_all)].astype(np.float64) * (2.0 ** -units.k)
    Y = np.zeros((len(rows_all), c))
    if cls:
        Y[: len(cls)] = one_hot(np.asarray([units.class_labels[i] for i in cls]), c)
    for j, i in enumerate(vec):
        v = units.vector_labels[i].astype(np.float64) * (2.0 ** -units.k_y)
        Y[len(cls) + j, : v.shape[0]] = v
    return F, Y
