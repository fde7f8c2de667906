"""Sealing and opening the rows of a ``deltas`` message (pure; docs/erasure.md).

The featurizer seals each ROWS entry into a SEALED entry (:func:`seal_delta`), one key per
sample. The ledger worker and the verifier open it back (:func:`open_delta`) into the ordinary
ROWS entry the ledger applies, so ``streams/ledger/head_runtime.py`` never sees a sealed row. A row
whose key is destroyed (shredded) cannot be opened: it is reported as an :class:`ErasedRow` and
left out of the opened delta; an erased add and the erased delete of the same (head, sample, key
id, commitment) contribute ``+x - x = 0``, which is how a full replay stays exact after erasure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from unlearn.schemas.delta_codec import Delta, Entry, RowsEntry, SealedRowsEntry
from unlearn.schemas.sealed import PURPOSE_ROW, SampleKey, SealError, commitment, parse_row, row_bytes, seal, unseal

__all__ = ["ErasedRow", "KeyLookup", "Opened", "is_sealed", "open_delta", "seal_delta", "seal_entry"]

#: ``lookup(head_id, sample_id, key_id)``: the sample's key if it still exists with that id, else None.
KeyLookup = Callable[[str, str, str], SampleKey | None]


@dataclass(frozen=True)
class ErasedRow:
    """A sealed row whose key no longer exists: only its identifiers, commitment, event time,
    client (a delete's: its tombstone scope) and (a delete's) ``by_subject`` are known."""

    sign: int
    event_id: str
    sample_id: str
    subject_id: str
    key_id: str
    commitment: bytes
    event_us: int = 0
    by_subject: bool = False
    client_id: str = ""

    def pair_key(self) -> tuple[str, str, bytes]:
        """What an erased add and its erased delete share (the head is the delta's)."""
        return self.sample_id, self.key_id, self.commitment


@dataclass
class Opened:
    """A delta with its sealed entries opened (entries with no readable row left are dropped),
    and the rows that could not be opened because their key is destroyed."""

    delta: Delta
    erased: list[ErasedRow] = field(default_factory=list)
    sealed_rows: int = 0


def is_sealed(delta: Delta) -> bool:
    return any(isinstance(e, SealedRowsEntry) for e in delta.entries)


def seal_entry(head_id: str, e: RowsEntry, keys: list[SampleKey]) -> SealedRowsEntry:
    """``e`` sealed, row i under ``keys[i]`` (the key of sample ``e.sample_ids[i]``)."""
    labels = np.asarray(e.labels)
    vector = labels.ndim == 2
    coms, cts = [], []
    for i, (sample, key) in enumerate(zip(e.sample_ids, keys, strict=True)):
        row = row_bytes(e.q[i], labels[i])
        coms.append(commitment(key, head_id, sample, row))
        cts.append(seal(key, PURPOSE_ROW, head_id, sample, row))
    return SealedRowsEntry(e.sign, e.event_ids, e.sample_ids, e.subject_ids, 1 if vector else 0,
                           int(labels.shape[1]) if vector else 0, tuple(k.key_id for k in keys), tuple(coms),
                           tuple(cts), e.event_us, e.by_subject, e.client_ids)


def seal_delta(delta: Delta, key_for: Callable[[str, str], SampleKey]) -> Delta:
    """Every ROWS entry of ``delta`` sealed with ``key_for(head_id, sample_id)``; other entries
    (PACKED: statistics of many rows, federated mode) are kept as they are."""
    entries: list[Entry] = []
    for e in delta.entries:
        if isinstance(e, RowsEntry):
            entries.append(seal_entry(delta.head_id, e, [key_for(delta.head_id, s) for s in e.sample_ids]))
        else:
            entries.append(e)
    return replace(delta, entries=tuple(entries))  # the contract block (n_classes, version) stays


def open_delta(delta: Delta, lookup: KeyLookup) -> Opened:
    """Open every sealed entry. SealError if a row's key exists but the row does not open under
    it or does not match its commitment (a corrupt or forged message: the ledger refuses it)."""
    if not is_sealed(delta):
        return Opened(delta)
    out = Opened(delta)
    entries: list[Entry] = []
    for e in delta.entries:
        if not isinstance(e, SealedRowsEntry):
            entries.append(e)
            continue
        out.sealed_rows += e.n
        width = e.label_width
        size = 8 * (delta.d + width)
        keep: list[int] = []
        rows: list[bytes] = []
        for i in range(e.n):
            sample, kid = e.sample_ids[i], e.key_ids[i]
            key = lookup(delta.head_id, sample, kid)
            if key is None:
                out.erased.append(ErasedRow(e.sign, e.event_ids[i], sample, e.subject_ids[i], kid, e.commitments[i],
                                            e.event_us[i], e.by_subject, e.client_ids[i]))
                continue
            row = unseal(key, PURPOSE_ROW, delta.head_id, sample, e.ciphertexts[i])
            if commitment(key, delta.head_id, sample, row) != e.commitments[i]:
                raise SealError(f"row of sample {sample!r} (head {delta.head_id!r}) does not match its commitment")
            if len(row) != size:
                parse_row(row, delta.d, width)  # raises SealError with the sizes
            keep.append(i)
            rows.append(row)
        if not keep:
            continue
        # parse_row of every kept row at once: one buffer, two copies (q, labels), both C-contiguous int64
        flat = np.frombuffer(b"".join(rows), dtype="<i8").reshape(len(rows), delta.d + width)
        q = flat[:, :delta.d].astype(np.int64)
        labels = flat[:, delta.d].astype(np.int64) if e.label_kind == 0 else flat[:, delta.d:].astype(np.int64)
        entries.append(RowsEntry(e.sign, tuple(e.event_ids[i] for i in keep), tuple(e.sample_ids[i] for i in keep),
                                 tuple(e.subject_ids[i] for i in keep), labels, q,
                                 tuple(e.event_us[i] for i in keep), e.by_subject,
                                 tuple(e.client_ids[i] for i in keep)))
    out.delta = replace(delta, entries=tuple(entries))  # the contract block (n_classes, version) stays
    return out
