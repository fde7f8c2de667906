"""The checks, one function each, on the ``Evidence`` of one head (docs/verifier.md, "Checks").

Each function returns its ``Check`` (``pass``, ``fail`` or ``skipped`` with why); ``run_checks``
runs them in the certificate's order. The shuffled orders and the partitionings draw from one
random generator in that order, so a seed reproduces a certificate.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unlearn.infra.topic_reader import LogRecord
from unlearn.ledger import (
    ExactLedger,
    LedgerError,
    centralized_retrain,
    one_hot,
    posterior_inverse,
    retrain_deviation,
    solve_head,
)
from unlearn.ledger.solve import posterior_inverse_cho_solve
from unlearn.ledger.tracked import relative_deviation
from unlearn.schemas.head import HeadUpdate
from unlearn.schemas.receipts import Receipt
from unlearn.streams.featurizer.tombstones import Tombstone

from .certificate import Check
from .event_ids import check_event_ids
from .orders import (
    Dependencies,
    apply_units,
    components,
    dependencies,
    partitioned_digest,
    retained_multiset,
    retained_rows,
    shuffled_digest,
)
from .reading import live_updates
from .remove_wins import receipt_tombstones, violations
from .replay import UNIT_CLASS_ROW, UNIT_VECTOR_ROW, LogReplay, Units, replay_log


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


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.ascontiguousarray(a, "<f8").tobytes() == np.ascontiguousarray(b, "<f8").tobytes()


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


def check_live_digest(ev: Evidence, require_live: bool) -> Check:
    """The live head's version, n_retained and covered offset equal the replay's, and so does its
    ledger content: its digest when it carries one (exact updates always do); for a fast live
    head without one, the latest exact update's digest against the replay at that version and
    the live retained-rows hash against the replay's at the live version.
    ``require_live``: a missing live head fails (broker) instead of being skipped (export without heads)."""
    latest, led = ev.latest, ev.ledger
    if latest is None:
        return Check("live_digest", "fail" if require_live else "skipped",
                     f"no head update for {ev.head_id!r}" + (" on the heads topic" if require_live else
                                                             " in the input"))
    if led is None:
        return Check("live_digest", "fail", f"the live head is at version {latest.version} but no deltas of "
                                            f"{ev.head_id!r} could be replayed")
    replay_cv = ev.replay.contract_version_at.get(latest.version)
    data: dict[str, Any] = {"live_digest": latest.digest, "replay_digest": ev.digest,
                            "live_contract_version": latest.contract_version, "replay_contract_version": replay_cv}
    problems = _live_facts(ev, latest, led) + _live_classes(ev, latest, led, data)
    compared = _live_content(ev, latest, data, problems)
    if problems:
        return Check("live_digest", "fail", "; ".join(problems), data)
    if not compared:
        return Check("live_digest", "skipped",
                     f"not checkable: live head version {latest.version} ({latest.mode}) matches the replay's version "
                     "and n_retained, but carries no digest or retained-rows hash, and no exact update was published",
                     data)
    return Check("live_digest", "pass",
                 f"live head version {latest.version} ({latest.mode}) matches the replay: " + " and ".join(compared),
                 data)


def _live_facts(ev: Evidence, latest: HeadUpdate, led: ExactLedger) -> list[str]:
    """Where the live head's version, n_retained, covered offset and contract differ from the replay's."""
    rep = ev.replay
    problems = []
    if rep.version != latest.version:
        problems.append(f"live version {latest.version} but the deltas log yields {rep.final_version} applied "
                        "messages")
    if latest.n_retained != led.count:
        problems.append(f"live n_retained {latest.n_retained} != replay {led.count}")
    where = rep.offset_of_version.get(latest.version)
    if where is not None and latest.offsets and tuple(latest.offsets[-1]) != where:
        problems.append(f"live head covers deltas offset {list(latest.offsets[-1])} but version "
                        f"{latest.version} is the delta at {list(where)}")
    replay_cv = rep.contract_version_at.get(latest.version)
    if latest.contract_version != replay_cv:
        problems.append(f"live head names contract version {latest.contract_version} but its deltas name "
                        f"{replay_cv} at version {latest.version}")
    return problems


def _live_classes(ev: Evidence, latest: HeadUpdate, led: ExactLedger, data: dict[str, Any]) -> list[str]:
    """The classes a prediction may name: the live head's against the replay's exact per-class counts > 0."""
    if latest.retained_classes is None or ev.replay.version != latest.version:
        return []
    live_classes = np.flatnonzero(latest.retained_classes).tolist()
    counts = led.class_counts
    replay_classes = np.flatnonzero(counts > 0).tolist() if int(counts.sum()) == led.count else None
    data.update(live_retained_classes=live_classes, replay_retained_classes=replay_classes)
    if live_classes == replay_classes:
        return []
    return [f"live head says classes {live_classes[:20]} hold retained samples, the replay "
            f"{replay_classes if replay_classes is None else replay_classes[:20]}"]


def _live_content(ev: Evidence, latest: HeadUpdate, data: dict[str, Any], problems: list[str]) -> list[str]:
    """What the live head's content was compared by (its digest; else the latest exact update's
    digest and its retained-rows hash); a mismatch is appended to ``problems``."""
    if latest.digest is not None:
        if latest.digest != ev.digest:
            problems.append(f"live digest {latest.digest} != replay digest {ev.digest}")
        return ["its digest"]
    compared: list[str] = []
    exact = ev.latest_exact
    if exact is not None:
        at_exact = ev.replay.at_version.get(exact.version)
        replay_exact = at_exact.digest() if at_exact is not None else None
        data.update(exact_version=exact.version, exact_digest=exact.digest, replay_digest_at_exact=replay_exact)
        compared.append(f"the digest of the latest exact update (version {exact.version})")
        if replay_exact != exact.digest:
            problems.append(f"exact update version {exact.version} digest {exact.digest} != replay digest "
                            f"{replay_exact} at that version")
    replay_hash = ev.replay.retained_hash_at.get(latest.version)
    if latest.retained_hash is not None:
        data.update(live_retained_hash=latest.retained_hash, replay_retained_hash=replay_hash)
        compared.append("its retained-rows hash")
        if replay_hash != latest.retained_hash:
            problems.append(f"live retained-rows hash {latest.retained_hash} != replay {replay_hash} at version "
                            f"{latest.version}")
    return compared


def check_retained_hash(ev: Evidence) -> Check:
    """The multiset hash of the retained rows (docs/design.md section 6), recomputed by the replay,
    equals a from-scratch hash of the retained rows and what every head update and applied receipt
    at a replayed version says. A claim where the replay's hash is unknown (a packed entry without
    one) fails: it cannot be backed. Updates and receipts that carry none are counted, not failed."""
    rep = ev.replay
    if ev.ledger is None:
        return Check("retained_hash", "skipped", "nothing to replay")
    base = rep.retained_hash
    problems: list[str] = []
    compared: dict[str, int] = {"from_scratch": 0, "head_updates": 0, "receipts": 0}
    without: dict[str, int] = {"head_updates": 0, "receipts": 0}
    beyond = 0
    retained = ev.retained()
    scratch = None
    if retained is not None:
        scratch = retained_multiset(ev.units, retained).fingerprint()
        compared["from_scratch"] = 1
        if scratch != base:
            problems.append(f"a from-scratch hash of the {len(retained)} retained rows is {scratch}, "
                            f"the log-order replay's {base}")
    claims: list[tuple[str, str, int, str | None]] = [
        ("head_updates", f"head update version {u.version} ({u.mode})", u.version, u.retained_hash) for u in ev.updates]
    claims += [("receipts", f"receipt {r.event_id!r} at version {r.head_version}", int(r.head_version or 0),
                r.retained_hash) for r in ev.receipts]
    for kind, who, version, claimed in claims:
        if version > rep.version:
            beyond += 1
        elif claimed is None:
            without[kind] += 1
        elif version not in rep.retained_hash_at:
            problems.append(f"{who}: the log has no such version")
        elif rep.retained_hash_at[version] is None:
            problems.append(f"{who} says {claimed}, but the replay cannot know the hash there (a packed entry "
                            "without the multiset hash of its rows)")
        elif rep.retained_hash_at[version] != claimed:
            problems.append(f"{who} says {claimed}, the replay {rep.retained_hash_at[version]}")
        else:
            compared[kind] += 1
    data: dict[str, Any] = {"replay_retained_hash": base, "from_scratch_retained_hash": scratch,
                            "compared": compared, "without_hash": without, "beyond_replay": beyond}
    if problems:
        return Check("retained_hash", "fail", f"{len(problems)} mismatches: " + "; ".join(problems[:5]),
                     {**data, "problems": problems[:50]})
    if not any(compared.values()):
        why = ("the replay's hash is unknown (a packed entry without the multiset hash of its rows)"
               if base is None else "no head update or receipt carries one, and the retained rows are not derivable")
        return Check("retained_hash", "skipped", f"nothing to compare: {why}", data)
    backed = [f"{compared[k]} {what}" for k, what in (("head_updates", "head updates"),
                                                      ("receipts", "applied receipts")) if compared[k]]
    matched = ([f"a from-scratch hash of the {len(retained)} retained rows"] if retained is not None else []) + (
        [" and ".join(backed) + " at their versions"] if backed else [])
    notes = [f"{n} {k.replace('_', ' ')} carry none" for k, n in without.items() if n]
    notes += [f"{beyond} beyond the replayed version"] if beyond else []
    return Check("retained_hash", "pass", f"the replay's retained-rows hash {base} equals " + ", ".join(matched)
                 + (f" ({'; '.join(notes)})" if notes else ""), data)


def check_canonical_head(ev: Evidence) -> Check:
    """``solve_head`` on the replayed ledger equals the latest exact head's W (and posterior T)
    bit for bit; a fast live head is checked through the latest exact update at its own version."""
    latest, exact = ev.latest, ev.latest_exact
    if exact is None:
        return Check("canonical_head", "skipped",
                     "not checkable: no exact head update published" + ("" if ev.updates else " (no updates)"))
    le = ev.replay.at_version.get(exact.version)
    if le is None:
        return Check("canonical_head", "fail",
                     f"exact head version {exact.version} but the replay has no such version")
    W = ev.head_weights(exact.version, exact.gamma)
    W_live = np.asarray(exact.weights)
    same_w = _bits_equal(W, W_live)
    note = "" if latest is None or exact is latest else (
        f" (the live head is {latest.mode} at version {latest.version}; checked the latest exact "
        f"update, version {exact.version})")
    data: dict[str, Any] = {"version": exact.version, "gamma": exact.gamma}
    if not same_w:
        data["max_abs_diff"] = (float(np.max(np.abs(W - W_live))) if W.shape == W_live.shape and W.size
                                else None)
        data["shapes"] = [list(W.shape), list(W_live.shape)]
    post_ok = True
    if exact.posterior is not None:
        T = posterior_inverse(le, exact.gamma)
        post_ok = _bits_equal(T, np.asarray(exact.posterior))
        if not post_ok and _bits_equal(posterior_inverse_cho_solve(le, exact.gamma), np.asarray(exact.posterior)):
            post_ok = True  # published before the dpotri inverse (issue 12) and not reset since
            data["posterior_form"] = "cho_solve"
        data["posterior_checked"] = True
    same_digest = le.digest() == exact.digest
    ok = same_w and post_ok and same_digest
    detail = (f"solve_head(replay ledger, gamma={exact.gamma}) equals the published W"
              + (" and posterior T" if exact.posterior is not None else "") + " bit for bit" + note
              if ok else
              "published exact head differs from the canonical solve: "
              + ", ".join(x for x, bad in (("W", not same_w), ("posterior T", not post_ok),
                                           ("digest", not same_digest)) if bad) + note)
    return Check("canonical_head", "pass" if ok else "fail", detail, data)


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
