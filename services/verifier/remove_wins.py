"""Remove-wins, re-judged by the replay: no retained add is dated at or before a delete of it.

The featurizer refuses an add whose event time is not later than a matching tombstone, and a
delete removes every cached add dated at or before it (``streams/featurizer/tombstones.py``).
So in the state the whole ``deltas`` log describes, no retained add may be dated at or before
a tombstone that matches it. The replay rebuilds the tombstones from what it reads:

- every applied delete row: a tombstone of its (head, sample, subject), or of its (head,
  subject) when a delete_subject removed it (``by_subject``), dated with the row's event time
  and scoped to the row's client (the delete's, carried in the delta: ``schemas/delta_codec.py``;
  "" matches every client);
- every delete row erased since (its key destroyed: ``erasure.open_records``), the same way;
- every ``tombstoned`` receipt (a delete that removed nothing): a sample tombstone when it names
  its sample, else (a delete_subject) a subject tombstone, dated ``tombstone_ts`` and scoped to
  ``tombstone_client_id`` (absent: every client);

and judges every retained add, as the client its row names, with the featurizer's own rule
(``blocking_tombstone``): in signed mode a client without ``may_delete_others`` leaves
tombstones of its own adds only, so another client's older add may stay. An add row that names
no client ("") is judged against every tombstone, scoped or not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from unlearn.schemas.delta_codec import PackedEntry, RowsEntry, SealedRowsEntry
from unlearn.schemas.receipts import Receipt
from unlearn.schemas.sealed import ErasedRow
from unlearn.streams.featurizer.tombstones import Tombstone, blocking_tombstone, seconds_to_us

__all__ = ["EventTimes", "RetainedAdd", "erased_tombstones", "receipt_tombstones", "violations"]


@dataclass(frozen=True, slots=True)
class RetainedAdd:
    """An add row the log retains, named as the rule needs it (``tombstones.AddName``)."""

    head_id: str
    sample_id: str
    subject_id: str
    event_id: str
    event_us: int
    client_id: str = ""  # "": no client named, every tombstone matches it


@dataclass
class EventTimes:
    """The applied rows' event times in log order: per sample the stack of adds no delete has
    removed yet (a delete removes the latest earlier add, as ``orders.dependencies`` matches them),
    and the tombstones the delete rows leave."""

    adds: dict[str, list[RetainedAdd]] = field(default_factory=dict)
    tombstones: list[Tombstone] = field(default_factory=list)

    def apply(self, head_id: str, e: RowsEntry | PackedEntry | SealedRowsEntry) -> None:
        """One applied entry: push its adds, or pop the adds its deletes remove and keep their tombstones."""
        rows = zip(e.event_ids, e.sample_ids, e.subject_ids, e.event_us, e.client_ids, strict=True)
        for ev, sample, subject, t, client in rows:
            if e.sign > 0:
                self.adds.setdefault(sample, []).append(RetainedAdd(head_id, sample, subject, ev, t, client))
                continue
            stack = self.adds.get(sample)
            if stack:
                stack.pop()
            self.tombstones.append(_delete_tombstone(head_id, sample, subject, t, ev, e.by_subject, client))

    def retained(self) -> list[RetainedAdd]:
        """Every add no delete removed, in sample order."""
        return [a for sample in sorted(self.adds) for a in self.adds[sample]]


def _delete_tombstone(head_id: str, sample: str, subject: str, t: int, event_id: str, by_subject: bool,
                      scope: str) -> Tombstone:
    """The tombstone a delete row stands for: its subject's when a delete_subject removed it,
    scoped to the row's client ("": every client)."""
    if by_subject:
        return Tombstone(head_id, "subject", subject, subject, scope, t, event_id)
    return Tombstone(head_id, "sample", sample, subject, scope, t, event_id)


def erased_tombstones(head_id: str, rows: Iterable[ErasedRow]) -> list[Tombstone]:
    """The tombstones of erased delete rows (sealed rows whose key is destroyed: the replay never
    applies them, but their deletes happened)."""
    return [_delete_tombstone(head_id, r.sample_id, r.subject_id, r.event_us, r.event_id, r.by_subject, r.client_id)
            for r in rows if r.sign < 0]


def receipt_tombstones(receipts: Iterable[Receipt]) -> list[Tombstone]:
    """The tombstones ``tombstoned`` receipts say their deletes left (a delete names its sample,
    a delete_subject none)."""
    out = []
    for r in receipts:
        if r.status != "tombstoned" or r.tombstone_ts is None:
            continue
        t, scope = seconds_to_us(r.tombstone_ts), r.tombstone_client_id or ""
        if r.sample_ids:
            out += [Tombstone(r.head_id, "sample", s, r.subject_id, scope, t, r.event_id) for s in r.sample_ids]
        else:
            out.append(Tombstone(r.head_id, "subject", r.subject_id, r.subject_id, scope, t, r.event_id))
    return out


def violations(retained: Sequence[RetainedAdd], tombstones: Iterable[Tombstone]) -> list[tuple[RetainedAdd, Tombstone]]:
    """Each retained add a tombstone refuses, with the latest such tombstone (the featurizer's
    rule; an add that names no client meets every tombstone as if unscoped)."""
    by_name: dict[tuple[str, str, str], list[Tombstone]] = {}
    for t in tombstones:
        by_name.setdefault((t.kind, t.id, t.subject_id), []).append(t)
    out = []
    for a in retained:
        found = by_name.get(("sample", a.sample_id, a.subject_id), []) + by_name.get(
            ("subject", a.subject_id, a.subject_id), [])
        if not a.client_id:
            found = [replace(t, client_id="") for t in found]
        block = blocking_tombstone(a, a.event_us, found)
        if block is not None:
            out.append((a, block))
    return out
