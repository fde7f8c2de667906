"""Verification after erasure (docs/erasure.md, "Verification survives erasure").

Before the replay, :func:`open_records` turns each sealed ``deltas`` message into the plaintext
delta the live ledger applied (``streams.ledger.row_opener.RowOpener``, the same transform as the
ledger worker's), so the replay and every check (``checks.py``, ``live_head_checks.py``) run
unchanged. Rows whose key is destroyed cannot be opened: they are *erased*. Each erased add must
be cancelled by a later erased delete of the same (sample, key id, commitment) in the same
head: the pair contributes
``+x - x = 0``, so the final digest equals a from-scratch build on the retained set
(:func:`check_erased_pairs`; an unpaired erased row fails it). The ledger states strictly between
an erased add and its delete held that row and can be reproduced by no one, by design:
:func:`unreproducible_versions` names those versions, and the head updates and receipts at them
are left out of the per-version checks (counted in the certificate). Head creation is decided on
the message as sent: a sealed message with an add creates the head even when every row of it is
erased (:attr:`ErasureEvidence.sealed_adds`, passed to the replay), so versions match the live ledger's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.delta_codec import decode_delta, encode_delta
from unlearn.schemas.sealed import ErasedRow, SealError, is_sealed
from unlearn.streams.ledger.delta_rules import creates_head
from unlearn.streams.ledger.row_opener import RowOpener

from .certificate import Check
from .reading import record_value
from .replay import replay_log

__all__ = ["ErasureEvidence", "check_erased_pairs", "open_records", "unreproducible_versions"]


@dataclass
class ErasureEvidence:
    """Erased rows of one head's deltas, paired."""

    sealed_messages: int = 0
    erased: list[tuple[int, int, ErasedRow]] = field(default_factory=list)  # (partition, offset, row)
    pairs: list[tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=list)  # (add at, delete at)
    unpaired: list[tuple[int, int, ErasedRow]] = field(default_factory=list)
    unopenable: list[tuple[int, int, str]] = field(default_factory=list)
    #: (partition, offset) of every sealed message with an add entry, as sent: it may create the
    #: head even when all its adds are erased (``replay_log(created_at=...)``).
    sealed_adds: set[tuple[int, int]] = field(default_factory=set)


def open_records(records: Sequence[LogRecord], head_id: str, opener: RowOpener) -> tuple[list[LogRecord],
                                                                                          ErasureEvidence]:
    """Records with sealed deltas of ``head_id`` opened (re-encoded as plaintext deltas), and the
    erased rows paired. A sealed message that does not open becomes undecodable (empty), as the
    live ledger dead-letters it."""
    ev = ErasureEvidence()
    out: list[LogRecord] = []
    for r in records:
        try:
            delta = decode_delta(record_value(r))
        except CodecError:
            out.append(r)
            continue
        if delta.head_id != head_id or not is_sealed(delta):
            out.append(r)
            continue
        ev.sealed_messages += 1
        if creates_head(delta):  # decided on the message as sent, before anything is erased from it
            ev.sealed_adds.add((r.partition, r.offset))
        try:
            opened = opener.open(delta)
        except SealError as exc:
            ev.unopenable.append((r.partition, r.offset, str(exc)))
            out.append(replace(r, value=b""))
            continue
        ev.erased.extend((r.partition, r.offset, e) for e in opened.erased)
        out.append(replace(r, value=encode_delta(opened.delta)))
    adds: dict[tuple[str, str, bytes], list[tuple[int, int, ErasedRow]]] = {}
    for part, off, row in ev.erased:
        if row.sign > 0:
            adds.setdefault(row.pair_key(), []).append((part, off, row))
            continue
        waiting = adds.get(row.pair_key())
        if waiting:
            a_part, a_off, _ = waiting.pop(0)
            ev.pairs.append(((a_part, a_off), (part, off)))
        else:
            ev.unpaired.append((part, off, row))
    ev.unpaired.extend(x for waiting in adds.values() for x in waiting)
    return out, ev


def unreproducible_versions(records: Sequence[LogRecord], head_id: str, ev: ErasureEvidence) -> set[int]:
    """Versions v with v(add) <= v < v(delete) for an erased pair: the live ledger held the erased
    row there; nobody can rebuild those states any more."""
    if not ev.pairs:
        return set()
    rep = replay_log(records, head_id, created_at=ev.sealed_adds)
    version_at = {where: v for v, where in rep.offset_of_version.items()}
    out: set[int] = set()
    for add_at, del_at in ev.pairs:
        va, vd = version_at.get(add_at), version_at.get(del_at)
        if va is not None and vd is not None:
            out.update(range(va, vd))
    return out


def check_erased_pairs(ev: ErasureEvidence, skipped_versions: int, skipped_claims: int) -> Check | None:
    """Every erased add is cancelled by a later erased delete of the same sample, key id and
    commitment; no sealed message failed to open. None when nothing was sealed."""
    if not ev.sealed_messages:
        return None
    data = {"sealed_messages": ev.sealed_messages, "erased_rows": len(ev.erased), "erased_pairs": len(ev.pairs),
            "unreproducible_versions": skipped_versions, "claims_skipped": skipped_claims}
    problems = [f"unpaired erased {'add' if row.sign > 0 else 'delete'} of sample {row.sample_id!r} (key "
                f"{row.key_id}) at {part}/{off}" for part, off, row in ev.unpaired]
    problems += [f"sealed delta at {part}/{off} does not open: {why}" for part, off, why in ev.unopenable]
    if problems:
        return Check("erased_pairs", "fail", f"{len(problems)} problems: " + "; ".join(problems[:5]),
                     {**data, "problems": problems[:50]})
    if not ev.erased:
        return Check("erased_pairs", "pass", f"{ev.sealed_messages} sealed messages opened, no erased rows", data)
    return Check("erased_pairs", "pass",
                 f"{len(ev.pairs)} erased add/delete pairs cancel (same sample, key id and commitment); "
                 f"{skipped_versions} versions between them are not reproducible by design, "
                 f"{skipped_claims} head updates/receipts at them not checked", data)
