"""The checks of the published head against the replay (docs/verifier.md, "Checks"): the live
head's digest and facts, its retained-rows hash, and the latest exact update's weights and
posterior bit for bit against the replayed ledger's solve.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unlearn.ledger import ExactLedger, posterior_inverse
from unlearn.ledger.solve import posterior_inverse_cho_solve
from unlearn.schemas.head import HeadUpdate

from .certificate import Check
from .evidence import Evidence
from .orders import retained_multiset

__all__ = ["check_canonical_head", "check_live_digest", "check_retained_hash"]


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.ascontiguousarray(a, "<f8").tobytes() == np.ascontiguousarray(b, "<f8").tobytes()


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
