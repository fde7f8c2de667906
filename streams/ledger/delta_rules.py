"""The rules a deltas message is applied by, without I/O: which messages a head skips
(redelivered offsets, duplicate sources), which entries it refuses (off its grid, sealed, zero
rows, non-member deletes), how its label columns are sized, how the retained rows' multiset hash
follows, and how delete rows group into receipts.

Module functions, not methods, so the replay verifier (services/verifier/replay.py) applies the
very same rules to a bare ExactLedger instead of re-coding them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from unlearn.ledger import ExactLedger, LedgerError, MultisetHash, NonMemberDelete
from unlearn.schemas.delta_codec import Delta, Entry, PackedEntry, RowsEntry, SealedRowsEntry
from unlearn.schemas.source_id import dedup_key

#: Why a deltas message is skipped whole ("" = it applies).
SkipReason = Literal["", "redelivered", "duplicate_source"]

_T = TypeVar("_T")


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


class InputPosition(Protocol):
    """Where a head is in its deltas input (HeadRuntime, or the verifier's replay)."""

    applied_offset: int
    source_offsets: dict[str, int]


def creates_head(delta: Delta) -> bool:
    """A head is created by its first delta with an add; a delete-only delta before that is
    rejected as ``unknown_head`` (there is nothing to delete from). Ask it of the message as sent
    (sealed entries included): an add whose rows are erased since still created the head, and its
    grid (d, frac_bits, label_frac_bits) is in the delta's header (docs/erasure.md)."""
    return any(e.sign > 0 for e in delta.entries)


def admit(pos: InputPosition, delta: Delta, offset: int) -> SkipReason:
    """"" when the deltas message at ``offset`` applies, else why it is skipped whole: an offset at or
    below the last applied one is ``redelivered``; a source offset not beyond what was applied from
    that source is a ``duplicate_source`` (a featurizer's outbox replay), which still moves
    ``pos.applied_offset`` past the message so it is not looked at again."""
    if offset <= pos.applied_offset:
        return "redelivered"
    src = dedup_key(delta.source_id)
    if src is not None and src[1] <= pos.source_offsets.get(src[0], -1):
        # the same requests were already applied from an earlier copy of this delta
        pos.applied_offset = offset
        return "duplicate_source"
    return ""


def record_applied(pos: InputPosition, delta: Delta, offset: int) -> None:
    """After ``delta`` at ``offset`` applied: later redeliveries and copies of its source are skipped."""
    pos.applied_offset = offset
    src = dedup_key(delta.source_id)
    if src is not None:
        pos.source_offsets[src[0]] = src[1]


def declare_outputs(ledger: ExactLedger, delta: Delta, contract_version: int | None) -> int | None:
    """Size ``ledger``'s label columns from the contract ``delta`` names, before its entries
    apply: a head's columns are its contract's class count (label width for vectors), so its shape
    never reveals which labels were seen, and they grow only when a later delta names a larger
    contract (``unlearn heads extend``: class-incremental learning; new columns are zero). Returns
    the head's contract version after ``delta``: the highest one its deltas named (a delta judged
    by a featurizer whose registry view lagged never moves it back, as it never shrinks the
    columns), ``contract_version`` when ``delta`` names none. A
    delta that names none (the old format) keeps the old rule: the largest class index seen plus
    one; so does a delta off ``ledger``'s grid (its entries are all rejected)."""
    if delta.n_classes is None or delta.contract_version is None:
        return contract_version
    if (delta.d, delta.frac_bits, delta.label_frac_bits) != (ledger.dim, ledger.frac_bits, ledger.label_frac_bits):
        return contract_version
    if delta.n_classes > ledger.n_outputs:
        ledger.grow_outputs(delta.n_classes)
    return max(delta.contract_version, contract_version or 0)


def apply_entries(head_id: str, delta: Delta, ledger: ExactLedger,
                  apply_entry: Callable[[RowsEntry | PackedEntry], _T]
                  ) -> Iterator[tuple[int, Entry, _T | Rejection]]:
    """The per-entry rules: yields (index, entry, what ``apply_entry`` returned, or a Rejection).
    An entry off ``ledger``'s grid is rejected unapplied; an entry ``apply_entry`` refuses
    (NonMemberDelete, LedgerError; it must leave state untouched then) is rejected and the next
    one proceeds. Lazy: each entry applies when its result is taken."""
    grid = (delta.d, delta.frac_bits, delta.label_frac_bits)
    mine = (ledger.dim, ledger.frac_bits, ledger.label_frac_bits)
    for i, entry in enumerate(delta.entries):
        if grid != mine:
            reason = "dimension_mismatch" if delta.d != ledger.dim else "grid_mismatch"
            yield i, entry, _reject(i, entry, reason,
                                    f"delta has (d, frac_bits, label_frac_bits) = {grid}, head {head_id!r} has {mine}")
            continue
        if isinstance(entry, SealedRowsEntry):  # the shell opens sealed rows first (schemas.sealed)
            yield i, entry, _reject(i, entry, "sealed_entry", "sealed rows reached the ledger unopened")
            continue
        if isinstance(entry, RowsEntry) and entry.sign > 0 and len(entry.q) and not entry.q.any(axis=1).all():
            # The featurizer refuses a vector of no information (zero_norm_feature): a zero add row
            # would count in n and the class counts while carrying nothing, so the ledger (and the
            # verifier's replay, which runs this) refuses one too. Deletes of old zero rows still apply.
            yield i, entry, _reject(i, entry, "zero_norm_feature", "an add row whose q is all zeros")
            continue
        try:
            result: _T | Rejection = apply_entry(entry)
        except NonMemberDelete as exc:
            result = _reject(i, entry, "non_member_delete", str(exc))
        except LedgerError as exc:
            result = _reject(i, entry, "invalid_entry", str(exc))
        yield i, entry, result


def fold_multiset(h: MultisetHash | None, entry: Entry) -> MultisetHash | None:
    """The retained rows' multiset hash after the ledger applied ``entry`` (``h`` is updated in
    place): a rows entry's rows join (add) or leave (delete); a packed entry joins with the hash
    of its rows it carries. One without makes the hash unknown (None) from then on, never wrong."""
    if h is None:
        return None
    if isinstance(entry, RowsEntry):
        (h.add if entry.sign > 0 else h.delete)(entry.q, entry.labels)
        return h
    if not isinstance(entry, PackedEntry) or entry.multiset_hash is None:
        return None
    h.absorb(MultisetHash.from_bytes(entry.multiset_hash, *h.grid), entry.sign)
    return h


def _reject(i: int, entry: Entry, reason: str, detail: str) -> Rejection:
    return Rejection(i, entry.sign, reason, detail, entry.event_ids, entry.sample_ids, entry.subject_ids)


def group_by_event(event_ids: Iterable[str], sample_ids: Iterable[str],
                   subject_ids: Iterable[str]) -> list[AppliedDelete]:
    """Rows of one delete event (delete_subject expands to many) make one receipt, applied or
    rejected: the one grouping the ledger uses for both."""
    groups: dict[str, tuple[str, list[str]]] = {}
    for ev, sample, subject in zip(event_ids, sample_ids, subject_ids):
        groups.setdefault(ev, (subject, []))[1].append(sample)
    return [AppliedDelete(ev, subj, tuple(samples)) for ev, (subj, samples) in groups.items()]
