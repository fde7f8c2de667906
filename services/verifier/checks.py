"""The checks, one function each, on the ``Evidence`` of one head (docs/verifier.md, "Checks").

Each function returns its ``Check`` (``pass``, ``fail`` or ``skipped`` with why); ``run_checks``
runs them in the certificate's order. The shuffled orders and the partitionings draw from one
random generator in that order, so a seed reproduces a certificate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unlearn.ledger import (
    ExactLedger,
    LedgerError,
    centralized_retrain,
    retrain_deviation,
)
from unlearn.ledger.tracker_checks import relative_deviation

from .certificate import Check
from .event_ids import check_event_ids
from .evidence import Evidence, retained_dataset
from .live_head_checks import check_canonical_head, check_live_digest, check_retained_hash
from .orders import apply_units, partitioned_digest, shuffled_digest
from .remove_wins import receipt_tombstones, violations


def check_log_replay(ev: Evidence) -> Check:
    """At least one delta applied in log order: its digest is the baseline."""
    rep = ev.replay
    if ev.ledger is None or rep.version == 0:
        return Check("log_replay", "fail", f"no applicable deltas for head {ev.head_id!r} "
                     f"({rep.messages} messages read)")
    return Check("log_replay", "pass", f"{rep.version} messages applied in log order, digest {ev.digest}",
                 {"digest": ev.digest})


def check_delete_matching(ev: Evidence) -> Check | None:
    """Every accepted delete matches an earlier add of its sample ids: the ledger's non-member test
    (counts, class counts, diagonal of S) lets a ghost delete of a known class through. Only
    reported when it fails."""
    if not ev.unmatched:
        return None
    return Check("delete_matching", "fail",
                 f"{len(ev.unmatched)} accepted delete units name samples with no earlier retained add "
                 "(the ledger's counts allowed them, but they remove rows that were never added)",
                 {"units": ev.unmatched[:20]})


def check_tombstoned_receipts(ev: Evidence) -> Check | None:
    """A ``tombstoned`` receipt (remove wins, docs/featurizer.md) says its delete removed nothing:
    no delete row of the replay may carry its event id. Only reported when the head has such
    receipts. (Its other claim, that no older add of it enters: :func:`check_remove_wins`.)"""
    if not ev.tombstoned:
        return None
    removing = {e for i, evs in enumerate(ev.units.events) if ev.units.sign[i] < 0 for e in evs}
    lying = sorted(r.event_id for r in ev.tombstoned if r.event_id in removing)
    if lying:
        return Check("tombstoned_receipts", "fail",
                     f"{len(lying)} tombstoned receipts say their delete removed nothing, but the deltas remove "
                     "rows under their event ids", {"event_ids": lying[:20], "receipts": len(ev.tombstoned)})
    return Check("tombstoned_receipts", "pass",
                 f"{len(ev.tombstoned)} tombstoned receipts: none of their deletes removed a row",
                 {"receipts": len(ev.tombstoned)})


def check_remove_wins(ev: Evidence) -> Check:
    """Remove wins, in event time (``remove_wins.py``): no add the whole log retains is dated at
    or before a tombstone that matches it, rebuilt from the delete rows (applied, or erased since)
    and the ``tombstoned`` receipts and judged with the featurizer's own rule."""
    rep = ev.replay
    if rep.ledger is None:
        return Check("remove_wins", "skipped", "nothing to replay")
    tombs = rep.times.tombstones + ev.erased_tombstones + receipt_tombstones(ev.tombstoned)
    retained = rep.times.retained()
    bad = violations(retained, tombs)
    data: dict[str, Any] = {"violations": len(bad), "retained_adds": len(retained), "tombstones": len(tombs)}
    if bad:
        data["examples"] = [{"event_id": a.event_id, "sample_id": a.sample_id, "subject_id": a.subject_id,
                             "client_id": a.client_id, "event_us": a.event_us, "tombstone_event_id": t.event_id,
                             "tombstone_kind": t.kind, "tombstone_us": t.event_us,
                             "tombstone_client_id": t.client_id} for a, t in bad[:20]]
        return Check("remove_wins", "fail",
                     f"{len(bad)} retained adds are dated at or before a delete of their sample or subject "
                     f"(of {len(retained)} retained, {len(tombs)} tombstones): remove-wins was not applied", data)
    return Check("remove_wins", "pass", f"none of the {len(retained)} retained adds is dated at or before any of "
                 f"the {len(tombs)} tombstones of its sample or subject", data)


def check_shuffled_orders(ev: Evidence, orders: int, rng: np.random.Generator) -> Check:
    """``orders`` random valid orders of the units, in random batches, give the baseline digest."""
    base = ev.digest
    if base is None or orders <= 0:
        return Check("shuffled_orders", "skipped", "no orders requested" if base else "nothing to replay")
    digests: list[str] = []
    info: list[dict[str, Any]] = []
    err = None
    for _ in range(orders):
        try:
            dg, _, meta = shuffled_digest(ev.units, rng, ev.deps)
        except LedgerError as exc:
            err = f"a shuffled order was refused by the ledger: {exc}"
            break
        digests.append(dg)
        info.append(meta)
    bad = [i for i, dg in enumerate(digests) if dg != base]
    ok = err is None and not bad
    return Check("shuffled_orders", "pass" if ok else "fail",
                 (f"{orders} random orders ({len(ev.units)} units) give the log-order digest" if ok
                  else err or f"orders {bad} give different digests"),
                 {"digests": digests, "orders": info})


def check_repartitionings(ev: Evidence, partitionings: int, rng: np.random.Generator) -> Check:
    """``partitionings`` random partitionings, each merged, give the baseline digest (skipped when
    ghost deletes pin the order)."""
    base = ev.digest
    if base is None or partitionings <= 0 or ev.unmatched:
        why = ("no partitionings requested" if partitionings <= 0 else
               "unmatched deletes pin the order" if ev.unmatched else "nothing to replay")
        return Check("repartitionings", "skipped", why)
    digests: list[str] = []
    info: list[dict[str, Any]] = []
    err = None
    for _ in range(partitionings):
        try:
            dg, meta = partitioned_digest(ev.units, rng, ev.deps, ev.comps)
        except LedgerError as exc:
            err = f"a partition replay was refused by the ledger: {exc}"
            break
        digests.append(dg)
        info.append(meta)
    bad = [i for i, dg in enumerate(digests) if dg != base]
    ok = err is None and not bad
    return Check("repartitionings", "pass" if ok else "fail",
                 (f"{partitionings} random partitionings ({len(ev.comps)} sample groups), merged, give the "
                  "log-order digest" if ok else err or f"partitionings {bad} give different digests"),
                 {"digests": digests, "partitionings": info})


def check_from_scratch(ev: Evidence) -> Check:
    """A fresh ledger of the retained rows has the baseline digest (the history left no trace)."""
    retained = ev.retained()
    led = ev.ledger
    units = ev.units
    if retained is None or led is None:
        why = ("packed entries carry statistics, not rows" if units.has_packed else
               "unmatched deletes" if ev.unmatched else "nothing to replay")
        return Check("from_scratch", "skipped", f"retained rows not available: {why}")
    scratch = ExactLedger(units.d, led.n_outputs, units.k, units.k_y)
    apply_units(scratch, units, retained, +1)
    sd = scratch.digest()
    base = ev.digest
    return Check("from_scratch", "pass" if sd == base else "fail",
                 f"a fresh ledger of the {len(retained)} retained rows has digest {sd}"
                 + ("" if sd == base else f" != replay {base}"), {"digest": sd, "rows": len(retained)})


def check_retrain_deviation(ev: Evidence, tolerance: float, gamma: float | None) -> Check:
    """||W - W_sklearn||_F / ||W_sklearn||_F <= tolerance against an independent scikit-learn ridge
    on the retained rows. ``gamma`` is used only when no head update says the head's gamma."""
    dataset = retained_dataset(ev)
    led = ev.ledger
    if dataset is None or led is None:
        return Check("retrain_deviation", "skipped", "retained feature set not available")
    F, Y = dataset
    ref = ev.latest_exact or ev.latest
    gamma = ref.gamma if ref is not None else gamma
    if gamma is None:
        return Check("retrain_deviation", "skipped", "no head update: gamma unknown")
    if led.n_outputs == 0:
        return Check("retrain_deviation", "skipped", "the head has no outputs")
    W = ev.head_weights(ev.replay.version, gamma)
    dev = retrain_deviation(W, F, Y, gamma)
    data: dict[str, Any] = {"deviation": dev, "tolerance": tolerance, "rows": int(F.shape[0]), "gamma": gamma}
    latest = ev.latest
    if latest is not None and latest.weights.shape == W.shape:
        data["live_head_deviation"] = relative_deviation(np.asarray(latest.weights), centralized_retrain(F, Y, gamma))
    return Check("retrain_deviation", "pass" if dev <= tolerance else "fail",
                 f"||W - W_sklearn|| / ||W_sklearn|| = {dev:.3g} (tolerance {tolerance:g}) on "
                 f"{F.shape[0]} retained rows", data)


def run_checks(ev: Evidence, rng: np.random.Generator, *, orders: int, partitionings: int, tolerance: float,
               require_live: bool, gamma: float | None) -> list[Check]:
    """Every check, in the certificate's order (the random draws happen in this order too)."""
    checks = [check_log_replay(ev)]
    matching = check_delete_matching(ev)
    if matching is not None:
        checks.append(matching)
    checks += [
        check_shuffled_orders(ev, orders, rng),
        check_repartitionings(ev, partitionings, rng),
        check_from_scratch(ev),
        check_live_digest(ev, require_live),
        check_retained_hash(ev),
        check_canonical_head(ev),
        check_retrain_deviation(ev, tolerance, gamma),
    ]
    tombstoned = check_tombstoned_receipts(ev)
    if tombstoned is not None:
        checks.append(tombstoned)
    checks.append(check_remove_wins(ev))
    reused = check_event_ids(ev.replay.ids)
    if reused is not None:
        checks.append(reused)
    return checks
