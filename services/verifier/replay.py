"""The log-order replay: a head's deltas through a pure ``ExactLedger`` with the live ledger's rules.

The rules are not re-coded here: redelivered / duplicate-source skips and the per-entry
rejections come from ``streams/ledger/delta_rules.py`` (``admit``, ``record_applied``,
``apply_entries``, the functions ``HeadRuntime.apply`` itself runs), head creation from its
``creates_head``. Only what the ledger processor's shell does before the runtime (decoding, the
key check) is mirrored: an undecodable message or a key/head mismatch is a ``bad_delta``.

Accepted entries are collected as ``Units`` (one per row of a rows entry, one per packed entry),
the material the shuffled orders and partitionings re-apply (``orders.py``). The multiset hash of
the retained rows is folded along with the ledger by the runtime's own ``fold_multiset``, and its
fingerprint recorded at every version, for the receipts that name one. The rows' event times are
followed over the whole log (``remove_wins.EventTimes``), so remove-wins is judged on the state
every applied delta describes.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from unlearn.ledger import ExactLedger, MultisetHash
from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.delta_codec import CodecError, Delta, PackedEntry, RowsEntry, decode_delta
from unlearn.schemas.source_id import dedup_key
from unlearn.streams.ledger.delta_rules import (
    Rejection,
    admit,
    apply_entries,
    creates_head,
    declare_outputs,
    fold_multiset,
    record_applied,
)

from .event_ids import EventIds
from .reading import record_value
from .remove_wins import EventTimes

#: What a unit is: one row with a class label, one row with a target vector, one packed entry.
UNIT_CLASS_ROW = 0
UNIT_VECTOR_ROW = 1
UNIT_PACKED = 2


@dataclass
class Units:
    """Accepted entries split into units: one per row (rows entries), one per packed entry."""

    d: int = 0
    k: int = 0
    k_y: int = 0
    #: Label columns of the replayed ledger at the stop version (its contract's class count when
    #: its deltas name one, else the largest class seen plus one): every re-built ledger starts
    #: with them, so the digests compare whatever labels a shuffled prefix has seen.
    c: int = 0
    sign: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    ref: list[int] = field(default_factory=list)  # row index, or packed index
    samples: list[tuple[str, ...]] = field(default_factory=list)
    events: list[tuple[str, ...]] = field(default_factory=list)  # the event ids each unit carries
    q_chunks: list[np.ndarray] = field(default_factory=list)
    class_labels: list[int] = field(default_factory=list)  # per row; -1 for vector rows
    vector_labels: dict[int, np.ndarray] = field(default_factory=dict)  # row -> int64 (c,)
    packed: list[ExactLedger] = field(default_factory=list)
    n_rows: int = 0
    _Q: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.sign)

    def add_rows(self, e: RowsEntry) -> None:
        """One unit per row: rows can be reordered and repartitioned one by one."""
        q = np.asarray(e.q, dtype=np.int64)
        self.q_chunks.append(q)
        self._Q = None
        labels = np.asarray(e.labels)
        for i in range(e.n):
            row = self.n_rows + i
            self.sign.append(e.sign)
            self.ref.append(row)
            self.samples.append((e.sample_ids[i],))
            self.events.append((e.event_ids[i],))
            if labels.ndim == 1:
                self.kind.append(UNIT_CLASS_ROW)
                self.class_labels.append(int(labels[i]))
            else:
                self.kind.append(UNIT_VECTOR_ROW)
                self.class_labels.append(-1)
                self.vector_labels[row] = np.array(labels[i], dtype=np.int64)
        self.n_rows += e.n

    def add_packed(self, e: PackedEntry, led: ExactLedger) -> None:
        """A packed entry stays one unit: it carries statistics, not rows."""
        self.sign.append(e.sign)
        self.kind.append(UNIT_PACKED)
        self.ref.append(len(self.packed))
        self.samples.append(tuple(e.sample_ids))
        self.events.append(tuple(e.event_ids))
        self.packed.append(led)

    @property
    def Q(self) -> np.ndarray:
        """Every accepted row's quantized features, stacked once (row index = ``ref`` of a row unit)."""
        if self._Q is None:
            self._Q = (np.concatenate(self.q_chunks, axis=0) if self.q_chunks
                       else np.zeros((0, max(1, self.d)), np.int64))
        return self._Q

    @property
    def has_packed(self) -> bool:
        return bool(self.packed)


@dataclass
class Skipped:
    """A message or entry the replay left out, as the live ledger would have."""

    partition: int
    offset: int
    reason: str
    detail: str
    entry_index: int | None = None
    sign: int | None = None
    event_ids: tuple[str, ...] = ()

    @classmethod
    def rejected(cls, r: LogRecord, rej: Rejection) -> Skipped:
        """An entry the live rules rejected, where its message was."""
        return cls(r.partition, r.offset, rej.reason, rej.detail, rej.entry_index, rej.sign, rej.event_ids)

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "offset": self.offset, "reason": self.reason, "detail": self.detail,
                "entry_index": self.entry_index,
                "op": None if self.sign is None else ("add" if self.sign > 0 else "delete"),
                "events": len(self.event_ids), "event_ids": list(self.event_ids[:5])}


@dataclass
class _Position:
    """The replay's place in the deltas input (``delta_rules.InputPosition``)."""

    applied_offset: int = -1
    source_offsets: dict[str, int] = field(default_factory=dict)


@dataclass
class LogReplay:
    """Result of the log-order pass."""

    head_id: str
    messages: int = 0  # deltas messages of this head read
    version: int = 0  # applied messages within the replayed range
    final_version: int = 0  # applied messages in the whole log
    pending: int = 0  # messages beyond the stop version that would apply
    ledger: ExactLedger | None = None  # at the stop version
    retained_hash_at: dict[int, str | None] = field(default_factory=dict)  # version -> fingerprint (None: unknown)
    contract_version_at: dict[int, int | None] = field(default_factory=dict)  # version -> named contract
    at_version: dict[int, ExactLedger] = field(default_factory=dict)
    offset_of_version: dict[int, tuple[int, int]] = field(default_factory=dict)
    units: Units = field(default_factory=Units)
    skipped: list[Skipped] = field(default_factory=list)  # whole messages
    rejected: list[Skipped] = field(default_factory=list)  # entries
    partitions: set[int] = field(default_factory=set)
    times: EventTimes = field(default_factory=EventTimes)  # every applied message, not only up to the stop version
    ids: EventIds = field(default_factory=EventIds)  # the event ids of every applied message (check event_ids)
    error: str | None = None

    def counts(self) -> dict[str, int]:
        """Skipped messages per reason."""
        out: dict[str, int] = {}
        for s in self.skipped:
            out[s.reason] = out.get(s.reason, 0) + 1
        return out

    @property
    def retained_hash(self) -> str | None:
        """The fingerprint of the retained rows' multiset hash at the stop version (None: unknown)."""
        return self.retained_hash_at.get(self.version)

    def to_json(self, digest: str | None) -> dict[str, Any]:
        """The certificate's ``replay`` section (``digest``: the ledger's, computed once by the caller)."""
        led = self.ledger
        return {
            "messages": self.messages,
            "applied_versions": self.final_version,
            "version": self.version,
            "pending": self.pending,
            "digest": digest,
            "retained_hash": self.retained_hash,
            "n_retained": led.count if led is not None else 0,
            "d": self.units.d,
            "c": led.n_outputs if led is not None else 0,
            "frac_bits": self.units.k,
            "label_frac_bits": self.units.k_y,
            "units": len(self.units),
            "partitions": sorted(self.partitions),
            "skipped_counts": self.counts(),
            "skipped_messages": [s.to_json() for s in self.skipped[:50]],
            "rejected_entries": [s.to_json() for s in self.rejected[:200]],
            "rejected_total": len(self.rejected),
        }


def _decode(r: LogRecord, head_id: str, rep: LogReplay) -> Delta | None:
    """The delta of a message for ``head_id``; None (a ``bad_delta`` when keyed to the head) when
    it is unreadable or for another head -- what the ledger processor does before its runtime."""
    try:
        delta = decode_delta(record_value(r))
    except CodecError as exc:
        if r.key:  # keyed to this head but unreadable: the live ledger dead-letters it
            rep.messages += 1
            rep.skipped.append(Skipped(r.partition, r.offset, "bad_delta", str(exc)))
        return None
    if delta.head_id != head_id:
        if r.key:
            rep.messages += 1
            rep.skipped.append(Skipped(r.partition, r.offset, "bad_delta",
                                       f"message key is {head_id!r} but the delta is for {delta.head_id!r}"))
        return None
    return delta


def _skip_detail(reason: str, delta: Delta, offset: int, pos: _Position, applied_before: int) -> str:
    if reason == "redelivered":
        return f"offset {offset} <= last applied offset {applied_before}"
    src = dedup_key(delta.source_id)
    up_to = f" (up to {src[0]}@{pos.source_offsets[src[0]]})" if src is not None else ""
    return f"source {delta.source_id!r} already applied{up_to}"


def _apply_to(ledger: ExactLedger, e: RowsEntry | PackedEntry) -> RowsEntry | tuple[PackedEntry, ExactLedger]:
    """Apply one entry to the bare ledger (the runtime applies it to its tracked head); returns what
    the units need: the rows entry, or the packed entry with its decoded ledger."""
    if isinstance(e, RowsEntry):
        (ledger.add if e.sign > 0 else ledger.delete)(e.q, e.labels)
        return e
    blob = ExactLedger.from_bytes(e.ledger_blob)
    ledger.absorb(blob, e.sign)
    return e, blob


@dataclass
class _State:
    """What the replay carries from one message to the next (the live runtime's head state)."""

    ledger: ExactLedger | None = None
    mset: MultisetHash | None = None
    pos: _Position = field(default_factory=_Position)
    contract_version: int | None = None
    collecting: bool = True


def replay_log(records: Sequence[LogRecord], head_id: str, stop_version: int | None = None,
               capture: Iterable[int] = (), created_at: Container[tuple[int, int]] = frozenset()) -> LogReplay:
    """The log-order pass with the live ledger's rules (``delta_rules``).

    Records are the deltas messages in log order (other heads' messages are ignored). Units are
    collected up to ``stop_version`` applied messages (None: all), so every later digest describes
    the events the live head covers; ledgers are copied at every version in ``capture``.
    ``created_at``: (partition, offset) of messages that had an add as sent (sealed, before their
    erased rows were left out; ``erasure.open_records``): such a message creates the head even if
    nothing of it could be opened, as it did live."""
    rep = LogReplay(head_id)
    want = set(capture)
    key = head_id.encode("utf-8")
    st = _State()
    for r in records:
        if r.key and r.key != key:
            continue
        delta = _decode(r, head_id, rep)
        if delta is None:
            continue
        rep.messages += 1
        rep.partitions.add(r.partition)
        if st.ledger is None and not _create_head(rep, st, r, delta, created_at):
            continue
        applied_before = st.pos.applied_offset
        skipped = admit(st.pos, delta, r.offset)
        if skipped:
            rep.skipped.append(Skipped(r.partition, r.offset, skipped,
                                       _skip_detail(skipped, delta, r.offset, st.pos, applied_before)))
            continue
        accepted = _apply_message(rep, st, r, delta)
        record_applied(st.pos, delta, r.offset)
        rep.final_version += 1
        if st.collecting:
            _collect(rep, st, r, accepted, stop_version, want)
        else:
            rep.pending += 1
    if rep.ledger is None and st.ledger is not None:
        rep.ledger = st.ledger.copy()
        rep.units.c = st.ledger.n_outputs
    return rep


def _create_head(rep: LogReplay, st: _State, r: LogRecord, delta: Delta,
                 created_at: Container[tuple[int, int]]) -> bool:
    """Start the head's ledger at its first add (or a message that had one as sent); a delete
    before it is rejected as ``unknown_head``, as the live ledger does."""
    if not creates_head(delta) and (r.partition, r.offset) not in created_at:
        rep.rejected.extend(Skipped(r.partition, r.offset, "unknown_head", "a delete before the head's first add",
                                    i, e.sign, e.event_ids) for i, e in enumerate(delta.entries))
        return False
    st.ledger = ExactLedger(delta.d, 0, delta.frac_bits, delta.label_frac_bits)
    st.mset = MultisetHash(delta.d, delta.frac_bits, delta.label_frac_bits)
    rep.units.d, rep.units.k, rep.units.k_y = delta.d, delta.frac_bits, delta.label_frac_bits
    return True


def _apply_message(rep: LogReplay, st: _State, r: LogRecord,
                   delta: Delta) -> list[RowsEntry | tuple[PackedEntry, ExactLedger]]:
    """Apply an admitted message's entries with the runtime's rules; returns what the units need
    of the accepted ones (the multiset hash is folded only while collecting: nothing reads it later)."""
    ledger = st.ledger
    assert ledger is not None
    accepted: list[RowsEntry | tuple[PackedEntry, ExactLedger]] = []
    st.contract_version = declare_outputs(ledger, delta, st.contract_version)
    for _, entry, result in apply_entries(rep.head_id, delta, ledger, partial(_apply_to, ledger)):
        if isinstance(result, Rejection):
            rep.rejected.append(Skipped.rejected(r, result))
            continue
        accepted.append(result)
        rep.times.apply(rep.head_id, entry)
        rep.ids.apply(entry)
        if st.collecting:
            st.mset = fold_multiset(st.mset, entry)
    return accepted


def _collect(rep: LogReplay, st: _State, r: LogRecord, accepted: list[RowsEntry | tuple[PackedEntry, ExactLedger]],
             stop_version: int | None, want: set[int]) -> None:
    """Record the version just applied (units, hash, contract, captured ledger); stop collecting
    at ``stop_version``."""
    ledger = st.ledger
    assert ledger is not None
    rep.version = rep.final_version
    rep.offset_of_version[rep.version] = (r.partition, r.offset)
    rep.retained_hash_at[rep.version] = None if st.mset is None else st.mset.fingerprint()
    rep.contract_version_at[rep.version] = st.contract_version
    for a in accepted:
        if isinstance(a, RowsEntry):
            rep.units.add_rows(a)
        else:
            rep.units.add_packed(*a)
    if rep.final_version in want:
        rep.at_version[rep.final_version] = ledger.copy()
    if stop_version is not None and rep.final_version >= stop_version:
        st.collecting = False
        rep.ledger = ledger.copy()
        rep.units.c = ledger.n_outputs
