"""The checks: a ghost delete, a fast live head, tampering of every published field."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.services.verifier.support import (
    StreamBuilder,
    anomalous_stream,
    records_of,
    simulate,
    simulate_with_receipts,
    status,
)
from unlearn.ledger import ExactLedger, MultisetHash
from unlearn.ledger.solve import posterior_inverse_cho_solve
from unlearn.schemas.delta_codec import PackedEntry
from unlearn.schemas.head import HeadUpdate
from unlearn.schemas.receipts import Receipt
from unlearn.services.verifier import verify
from unlearn.services.verifier.checks import check_delete_matching, run_checks
from unlearn.services.verifier.evidence import Evidence
from unlearn.services.verifier.live_head_checks import check_live_digest


def test_a_ghost_delete_the_ledger_accepts_is_flagged() -> None:
    """The ledger's non-member test is necessary, not sufficient (counts, class counts, diagonal
    of S): a never-added row of a known class usually passes it. The verifier matches every
    delete to an earlier add by sample id and fails the certificate when one has none."""
    b = StreamBuilder(seed=8)
    for _ in range(15):
        b.random_message()
    b.emit([b.non_member(cls=1)])
    recs = records_of(b.msgs)
    ups, _rt, reasons = simulate(recs, "h", final_reset=True)
    assert reasons == []  # the live ledger applied it
    cert = verify(recs, ups, "h", orders=2, partitionings=2, seed=2)
    assert not cert.ok and status(cert, "delete_matching") == "fail"
    assert status(cert, "live_digest") == "pass" and status(cert, "shuffled_orders") == "pass"
    assert status(cert, "from_scratch") == "skipped" and status(cert, "repartitionings") == "skipped"


def test_fast_latest_head_is_checked_at_the_latest_exact_version() -> None:
    """A fast live head carries no digest: live_digest checks the latest exact update's digest
    against the replay at its version, and the live retained-rows hash at the live version."""
    b = anomalous_stream(seed=2, n_msgs=20, d=24)  # rows per poll < d / 2: the fast head follows
    recs = records_of(b.msgs)
    ups, _rt, _ = simulate(recs, "h", poll=2)
    assert ups[-1].mode == "fast" and ups[-1].digest is None  # reset_every=7: exact updates mid-stream
    exact = [u for u in ups if u.mode == "exact"]
    assert exact and all(u.digest is not None for u in exact)
    cert = verify(recs, ups, "h", orders=1, partitionings=1, seed=1)
    assert cert.ok, cert.summary()
    canon = next(c for c in cert.checks if c.name == "canonical_head")
    assert canon.status == "pass" and canon.data["version"] == exact[-1].version
    assert "fast" in canon.detail
    live = next(c for c in cert.checks if c.name == "live_digest")
    assert live.status == "pass" and live.data["exact_version"] == exact[-1].version
    assert "latest exact update" in live.detail and "retained-rows hash" in live.detail
    # a forged fast head (its hash) or a forged exact digest below it fails the check
    cert = verify(recs, [*ups[:-1], _forge(ups[-1], retained_hash="1" * 64)], "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "live_digest") == "fail"
    forged = [_forge(u, digest="0" * 64) if u is exact[-1] else u for u in ups]
    cert = verify(recs, forged, "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "live_digest") == "fail" and status(cert, "canonical_head") == "fail"
    # without any exact update the canonical check is reported as not checkable
    only_fast = [u for u in ups if u.mode == "fast"]
    cert = verify(recs, only_fast, "h", orders=1, partitionings=0, seed=1)
    assert status(cert, "canonical_head") == "skipped" and status(cert, "live_digest") == "pass" and cert.ok
    # and with neither a digest nor a hash on the live head, live_digest cannot vouch for content
    bare = [_forge(u, retained_hash=None) for u in only_fast]
    cert = verify(recs, bare, "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "live_digest") == "skipped"


def test_tampering_is_detected() -> None:
    b = anomalous_stream(seed=3, n_msgs=15)
    recs = records_of(b.msgs)
    ups, rt, _ = simulate(recs, "h", final_reset=True)
    last = ups[-1]
    assert last.mode == "exact"

    def forged(**changes: object) -> list[HeadUpdate]:
        fields = {f: getattr(last, f) for f in HeadUpdate.__slots__}
        fields.update(changes)
        return [*ups[:-1], HeadUpdate(**fields)]

    W = np.array(last.weights)
    W[0, 0] = np.nextafter(W[0, 0], np.inf)  # one ulp
    cert = verify(recs, forged(weights=W), "h", orders=1, partitionings=1, seed=1)
    assert not cert.ok and status(cert, "canonical_head") == "fail" and status(cert, "live_digest") == "pass"
    T = np.array(last.posterior)
    T[1, 1] = np.nextafter(T[1, 1], 0)
    cert = verify(recs, forged(posterior=T), "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "canonical_head") == "fail" and "posterior" in next(
        c.detail for c in cert.checks if c.name == "canonical_head")
    # T as heads published before the dpotri inverse computed it (cho_solve) verifies; one ulp off it does not
    legacy = posterior_inverse_cho_solve(rt.ledger, last.gamma)  # rt: the live head at the last version
    assert not np.array_equal(legacy, np.asarray(last.posterior))  # the two forms differ in their bits
    cert = verify(recs, forged(posterior=legacy), "h", orders=0, partitionings=0, seed=1)
    canon = next(c for c in cert.checks if c.name == "canonical_head")
    assert canon.status == "pass" and canon.data["posterior_form"] == "cho_solve"
    legacy[2, 2] = np.nextafter(legacy[2, 2], 0)
    cert = verify(recs, forged(posterior=legacy), "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "canonical_head") == "fail"
    cert = verify(recs, forged(digest="0" * 64), "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "live_digest") == "fail" and not cert.ok
    # a live head that names a class without retained samples (or hides one) as predictable
    assert last.retained_classes is not None and last.retained_classes.any()
    for flip in (int(np.argmax(last.retained_classes)), int(np.argmin(last.retained_classes))):
        mask = np.array(last.retained_classes)
        mask[flip] = not mask[flip]
        cert = verify(recs, forged(retained_classes=mask), "h", orders=0, partitionings=0, seed=1)
        live = next(c for c in cert.checks if c.name == "live_digest")
        assert live.status == "fail" and "classes" in live.detail, live.detail
    assert verify(recs, ups, "h", orders=0, partitionings=0, seed=1).ok
    # a delta the live head claims but the log does not have (a lost/hidden message)
    applied = [i for i, r in enumerate(recs) if r.key == b"h" and i > 3]
    cert = verify(recs[: applied[-1]], ups, "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "live_digest") == "fail"
    # a head that was never published
    cert = verify(recs, [], "h", orders=1, partitionings=0, seed=1)
    assert status(cert, "live_digest") == "fail" and not cert.ok


def test_one_function_per_check_on_the_evidence() -> None:
    """The checks run on their own: the live head is the newest update (exact wins a tie), the
    delete-matching check is only reported when it fails, a missing live head is skipped offline."""
    b = anomalous_stream(seed=4, n_msgs=10)
    recs = records_of(b.msgs)
    ups, rt, _ = simulate(recs, "h", final_reset=True)
    ev = Evidence.gather(recs, ups, "h")
    assert ev.latest is ups[-1] and ev.latest.mode == "exact" and ev.latest_exact is ups[-1]
    assert ev.digest == rt.ledger.digest()
    assert check_delete_matching(ev) is None
    assert check_live_digest(ev, require_live=True).status == "pass"
    names = [c.name for c in run_checks(ev, np.random.default_rng(0), orders=1, partitionings=1, tolerance=1e-8,
                                        require_live=True, gamma=None)]
    assert names == ["log_replay", "shuffled_orders", "repartitionings", "from_scratch", "live_digest",
                     "retained_hash", "canonical_head", "retrain_deviation", "remove_wins"]
    offline = Evidence.gather(recs, None, "h")
    assert check_live_digest(offline, require_live=False).status == "skipped"
    assert check_live_digest(offline, require_live=True).status == "fail"
    # the same seed gives the same certificate content
    a = verify(recs, ups, "h", orders=2, partitionings=2, seed=7).to_json()
    c = verify(recs, ups, "h", orders=2, partitionings=2, seed=7).to_json()
    assert a["checks"] == c["checks"]


def _forge(u: HeadUpdate | Receipt, **changes: object) -> Any:
    return type(u)(**{**{f: getattr(u, f) for f in type(u).__slots__}, **changes})  # type: ignore[arg-type]


def test_retained_hash_is_checked_against_every_update_and_receipt() -> None:
    """The replay's multiset hash of the retained rows equals a from-scratch one and what each
    head update and applied receipt says at its version; a forged value fails."""
    b = anomalous_stream(seed=5, n_msgs=20)
    recs = records_of(b.msgs)
    ups, rt, _, receipts = simulate_with_receipts(recs, "h", final_reset=True)
    assert receipts and all(r.retained_hash for r in receipts)
    cert = verify(recs, ups, "h", orders=0, partitionings=0, seed=1, receipts=receipts)
    check = next(c for c in cert.checks if c.name == "retained_hash")
    assert cert.ok and check.status == "pass", cert.summary()
    assert check.data["compared"] == {"from_scratch": 1, "head_updates": len(ups), "receipts": len(receipts)}
    assert cert.replay["retained_hash"] == rt.retained_hash() == check.data["from_scratch_retained_hash"]
    ref = b.reference()
    members = list(b.members.values())
    want = MultisetHash.of_rows(np.stack([q for q, _, _ in members]), np.array([lab for _, lab, _ in members]))
    assert ref.count == len(members) and want.fingerprint() == rt.retained_hash()

    bad_receipt = _forge(receipts[0], retained_hash="0" * 64)
    cert = verify(recs, ups, "h", orders=0, partitionings=0, seed=1, receipts=[*receipts[1:], bad_receipt])
    check = next(c for c in cert.checks if c.name == "retained_hash")
    assert not cert.ok and check.status == "fail" and repr(receipts[0].event_id) in check.detail
    assert status(cert, "live_digest") == "pass"  # the digest alone does not see it
    cert = verify(recs, [*ups[:-1], _forge(ups[-1], retained_hash="1" * 64)], "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "retained_hash") == "fail" and status(cert, "live_digest") == "pass"
    # receipts and updates without a hash (an older worker) are counted, not failed; beyond the
    # replayed version (the head read before the receipt) they are not checkable
    older = [_forge(u, retained_hash=None) for u in ups]
    late = _forge(receipts[-1], head_version=rt.version + 5)
    cert = verify(recs, older, "h", orders=0, partitionings=0, seed=1,
                  receipts=[_forge(r, retained_hash=None) for r in receipts] + [late])
    check = next(c for c in cert.checks if c.name == "retained_hash")
    assert check.status == "pass" and check.data["compared"]["from_scratch"] == 1
    assert check.data["without_hash"] == {"head_updates": len(ups), "receipts": len(receipts)}
    assert check.data["beyond_replay"] == 1


def test_packed_entries_without_a_hash_make_it_unknown_and_claims_fail() -> None:
    b = StreamBuilder(seed=6, d=6)
    for _ in range(5):
        b.random_message()
    for with_hash in (True, False):
        extra = b.add(n=4)
        blob = ExactLedger.from_rows(extra.q, extra.labels).to_bytes()
        mset = MultisetHash.of_rows(extra.q, extra.labels).to_bytes() if with_hash else None
        b.emit([PackedEntry(+1, extra.event_ids, extra.sample_ids, extra.subject_ids, blob, mset)])
        recs = records_of(b.msgs)
        ups, rt, _ = simulate(recs, "h", final_reset=True)
        cert = verify(recs, ups, "h", orders=1, partitionings=1, seed=1)
        check = next(c for c in cert.checks if c.name == "retained_hash")
        assert cert.ok, cert.summary()
        if with_hash:  # no from-scratch (packed entries carry no rows), but the updates are backed
            assert check.status == "pass" and check.data["compared"]["from_scratch"] == 0
            assert ups[-1].retained_hash == cert.replay["retained_hash"] is not None
        else:
            assert rt.retained_hash() is None and ups[-1].retained_hash is None
            assert check.status == "pass" and cert.replay["retained_hash"] is None  # earlier versions still check
            assert check.data["without_hash"]["head_updates"] == 1
    forged = _forge(ups[-1], retained_hash=ups[-3].retained_hash)
    cert = verify(recs, [*ups[:-1], forged], "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "retained_hash") == "fail" and "cannot know" in next(
        c.detail for c in cert.checks if c.name == "retained_hash")


def test_a_tombstoned_receipt_must_not_name_a_delete_that_removed_rows() -> None:
    """Remove wins (docs/featurizer.md): a ``tombstoned`` receipt says its delete removed nothing.
    The check is only reported when the head has such receipts; it fails when the deltas remove
    rows under the receipt's event id."""
    from unlearn.services.verifier.checks import check_tombstoned_receipts

    b = anomalous_stream(seed=4, n_msgs=10)
    recs = records_of(b.msgs)
    ups, _, _ = simulate(recs, "h", final_reset=True)
    assert check_tombstoned_receipts(Evidence.gather(recs, ups, "h")) is None
    units = Evidence.gather(recs, ups, "h").units
    removing = next(evs[0] for i, evs in enumerate(units.events) if units.sign[i] < 0)
    honest = Receipt.tombstoned("never-removed", "s", "h", ["ghost"], 5.0, None, 6.0)
    elsewhere = Receipt.tombstoned(removing, "s", "other-head", [], 5.0, None, 6.0)  # another head's
    ok = check_tombstoned_receipts(Evidence.gather(recs, ups, "h", [honest, elsewhere]))
    assert ok is not None and ok.status == "pass" and ok.data == {"receipts": 1}
    lie = Receipt.tombstoned(removing, "s", "h", [], 5.0, None, 6.0)
    cert = verify(recs, ups, "h", orders=1, partitionings=1, seed=1, receipts=[honest, lie])
    (check,) = [c for c in cert.checks if c.name == "tombstoned_receipts"]
    assert check.status == "fail" and check.data["event_ids"] == [removing] and not cert.ok
