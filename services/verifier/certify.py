"""Certify a head: run the checks on records from memory (``verify``), the broker
(``verify_broker``, ``verify_head``) or an export file (``verify_file``)."""

from __future__ import annotations

import secrets
from collections.abc import Container, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from unlearn.common.families import heads_family, keys_family
from unlearn.common.key_ring import KeysUnavailable
from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.delta_codec import decode_delta
from unlearn.schemas.head import HeadUpdate
from unlearn.schemas.receipts import Receipt
from unlearn.schemas.sealed import is_sealed
from unlearn.services.verifier.settings import VerifySettings
from unlearn.streams.featurizer.tombstones import Tombstone
from unlearn.streams.ledger.row_opener import RowOpener

from .certificate import Certificate, Check, head_json
from .checks import run_checks
from .erasure import check_erased_pairs, open_records, unreproducible_versions
from .errors import VerifyError
from .evidence import Evidence
from .export import read_export
from .reading import decode_receipts, delta_head, read_head_records, read_head_updates, read_receipt_records
from .remove_wins import erased_tombstones

#: What the replay needs of erased rows: the messages that created the head as sent, the deletes' tombstones.
_Erased = tuple[set[tuple[int, int]], list[Tombstone]]
_NOTHING_ERASED: _Erased = (set(), [])


def verify(delta_records: Sequence[LogRecord], head_updates: Sequence[HeadUpdate] | None, head_id: str, *,
           orders: int = 3, partitionings: int = 3, seed: int | None = None, tolerance: float = 1e-8,
           source: dict[str, Any] | None = None, require_live: bool = True,
           gamma: float | None = None, receipts: Sequence[Receipt] = (),
           created_at: Container[tuple[int, int]] = frozenset(),
           erased_tombstones: Sequence[Tombstone] = ()) -> Certificate:
    """Run every check on a head's deltas (log order) and its head updates (log order; None when
    there are none to compare with). ``require_live``: a missing live head fails the live check
    (broker mode) instead of skipping it (a file exported without heads). ``gamma`` is used for
    the retrain reference only when no head update says which gamma the head has. ``receipts``:
    the head's applied receipts are checked for their retained-rows hash, its tombstoned ones for
    removing nothing (rejected ones are ignored).
    ``created_at``: messages that had an add as sent though every row of it is erased since
    (``ErasureEvidence.sealed_adds``): they created the head live, so they do in the replay;
    ``erased_tombstones``: the tombstones of delete rows erased since, for remove-wins.

    Runs with one BLAS thread: the replays are many small exact GEMMs, which a multithreaded BLAS
    only slows down on a shared box (~3x here); results are exact integers either way."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        seed = int(seed) if seed is not None else secrets.randbits(63)  # recorded: the run can be redone
        rng = np.random.default_rng(seed)
        ev = Evidence.gather(delta_records, head_updates, head_id, receipts, created_at, erased_tombstones)
        rep = ev.replay
        warnings: list[str] = []
        if len(rep.partitions) > 1:
            warnings.append(f"the head's deltas are on {len(rep.partitions)} partitions {sorted(rep.partitions)}: "
                            "deltas must be keyed by head id; their live order is undefined (replayed by partition)")
        checks = run_checks(ev, rng, orders=orders, partitionings=partitionings, tolerance=tolerance,
                            require_live=require_live, gamma=gamma)
        if rep.pending:
            warnings.append(f"{rep.pending} deltas messages beyond the live head's version {rep.version} are not "
                            "yet covered by a published head (the ledger worker may be behind)")
        live_json = head_json(ev.latest) if ev.latest is not None else None
        return Certificate(head_id, source or {}, checks, rep.to_json(ev.digest), live_json, seed, warnings)


def _open_sealed(settings: Settings, deltas: Sequence[LogRecord], updates: list[HeadUpdate],
                 receipts: list[Receipt], head_id: str) -> tuple[list[LogRecord], list[HeadUpdate], list[Receipt],
                                                             Check | None, _Erased]:
    """Sealed rows opened with the key family (docs/erasure.md); the updates and receipts at
    versions nobody can reproduce after an erasure left out; the ``erased_pairs`` check; what
    the replay needs of the erased rows (the messages that created the head, the deletes' tombstones)."""
    try:
        opened, erased = open_records(deltas, head_id, RowOpener(settings, batch=True, role="verifier"))
    except KeysUnavailable as exc:
        raise VerifyError(f"cannot read the sample keys ({keys_family(settings.topic_prefix)}): {exc}") from None
    gone = unreproducible_versions(opened, head_id, erased)
    n_claims = len(updates) + len(receipts)
    updates = [u for u in updates if u.version not in gone]
    receipts = [r for r in receipts if int(r.head_version or 0) not in gone]
    return (opened, updates, receipts, check_erased_pairs(erased, len(gone), n_claims - len(updates) - len(receipts)),
            (erased.sealed_adds, erased_tombstones(head_id, (row for _, _, row in erased.erased))))


def _sealed(r: LogRecord) -> bool:
    try:
        return is_sealed(decode_delta(r.value or b""))
    except CodecError:
        return False


def verify_broker(settings: Settings, head_id: str, *, orders: int | None = None, partitionings: int | None = None,
                  seed: int | None = None, tolerance: float | None = None, timeout: float = 60.0) -> Certificate:
    """Read the head's updates, receipts and deltas from the broker and verify them. Heads and
    receipts are read first, so the deltas read always cover them. VerifyError when a topic cannot be read."""
    heads_topics = heads_family(settings.topic_prefix)
    heads = read_head_records(settings, heads_topics, head_id, timeout)
    receipts = decode_receipts(read_receipt_records(settings, head_id, timeout))
    deltas = read_head_records(settings, settings.topic("deltas"), head_id, timeout)
    updates, bad = read_head_updates(heads, head_id)
    deltas, updates, receipts, pairs, (created_at, tombs) = _open_sealed(settings, deltas, updates, receipts, head_id)
    tuning = VerifySettings.of(settings)
    cert = verify(deltas, updates, head_id,
                  orders=tuning.verify_orders if orders is None else orders,
                  partitionings=tuning.verify_partitionings if partitionings is None else partitionings,
                  seed=seed, tolerance=tuning.verify_tolerance if tolerance is None else tolerance,
                  source={"kind": "broker", "bootstrap": settings.bootstrap,
                          "deltas_topic": settings.topic("deltas"), "heads_topics": heads_topics.pattern,
                          "receipts_topic": settings.topic("receipts")},
                  require_live=True, receipts=receipts, created_at=created_at, erased_tombstones=tombs)
    if pairs is not None:
        cert.checks.append(pairs)
    if bad:
        cert.warnings.append(f"{bad} undecodable messages keyed {head_id!r} on {heads_topics}")
    return cert


def verify_head(settings: Settings, head_id: str, *, orders: int | None = None, partitions: int | None = None,
                seed: int | None = None, tolerance: float | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """``verify_broker`` as a JSON-ready certificate (``ok``, ``summary``, ``retrain_deviation``,
    ``checks``, ...) for callers such as the demo; ``{"ok": False, "error": ...}`` when the
    verification cannot run (broker unreachable, topic missing)."""
    try:
        cert = verify_broker(settings, head_id, orders=orders, partitionings=partitions, seed=seed,
                             tolerance=tolerance, timeout=timeout)
    except VerifyError as exc:
        return {"ok": False, "head_id": head_id, "error": str(exc)}
    return cert.to_json()


def verify_file(path: str | Path, head_id: str | None = None, *, orders: int = 3, partitionings: int = 3,
                seed: int | None = None, tolerance: float = 1e-8, gamma: float | None = None,
                keys_from: Settings | None = None) -> Certificate:
    """Verify an export file (``export_deltas`` / ``unlearn export-deltas``) without a broker.
    ``head_id`` may be left out when the file holds one head's deltas. Sealed rows (docs/erasure.md)
    are opened with the key family of ``keys_from`` (a broker); without it they cannot be read."""
    deltas, heads, receipts = read_export(path)
    if head_id is None:
        ids = {h for h in (delta_head(r) for r in deltas) if h is not None}
        if len(ids) != 1:
            raise VerifyError(f"{path} holds deltas of {len(ids)} heads {sorted(ids)[:10]}: pass --head")
        head_id = ids.pop()
    updates, bad = read_head_updates(heads, head_id)
    decoded = decode_receipts(receipts)
    pairs, (created_at, tombs) = None, _NOTHING_ERASED
    if keys_from is not None:
        deltas, updates, decoded, pairs, (created_at, tombs) = _open_sealed(keys_from, deltas, updates, decoded,
                                                                             head_id)
    cert = verify(deltas, updates if heads else None, head_id, orders=orders, partitionings=partitionings,
                  seed=seed, tolerance=tolerance, source={"kind": "file", "path": str(path)}, require_live=False,
                  gamma=gamma, receipts=decoded, created_at=created_at, erased_tombstones=tombs)
    if pairs is not None:
        cert.checks.append(pairs)
    if keys_from is None and any(_sealed(r) for r in deltas):
        cert.warnings.append("the export holds sealed rows (docs/erasure.md): give --bootstrap to open them with "
                             "the subject-keys family; unopened, the replay refuses them as sealed_entry")
    if bad:
        cert.warnings.append(f"{bad} undecodable head messages in {path}")
    return cert
