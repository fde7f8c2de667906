"""One head in the ledger processor (streams/ledger/head_runtime.py), without a broker: offsets,
duplicates, rejections, receipts, coalescing, resets computed from copies, the retained-rows
hash."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from unlearn.ledger import ExactLedger, MultisetHash, Quantizer, l2_normalize, relative_deviation, solve_head
from unlearn.schemas.delta_codec import Delta, PackedEntry, RowsEntry
from unlearn.schemas.source_id import dedup_key
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime, canonical_copy
from unlearn.streams.ledger.outputs import head_update
from unlearn.streams.ledger.snapshots import decode_state, encode_state

CFG = HeadConfig(gamma=1.0, reset_every=1000, drift_threshold=1e-9)


def rows(sign: int, Q: np.ndarray, y: np.ndarray, tag: str, subject: str = "u") -> RowsEntry:
    n = len(Q)
    return RowsEntry(sign, [f"{tag}{i}" for i in range(n)], [f"s{tag}{i}" for i in range(n)], [subject] * n, y, Q)


def data(n: int = 20, d: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return Quantizer().quantize(l2_normalize(rng.normal(size=(n, d)))), rng.integers(0, 3, n)


def test_apply_skips_redelivered_offsets_and_duplicate_sources() -> None:
    Q, y = data()
    d1 = Delta("h", "requests/0@10", 6, 30, 0, (rows(+1, Q[:10], y[:10], "a"),))
    head = HeadRuntime.new("h", d1, CFG)
    assert not head.apply(d1, offset=0, partition=0).skipped
    digest = head.ledger.digest()
    assert head.apply(d1, offset=0, partition=0).skipped == "redelivered"
    # the featurizer re-produced the same batch after a crash: new offset, same source offset
    assert head.apply(d1, offset=1, partition=0).skipped == "duplicate_source"
    assert head.ledger.digest() == digest and head.version == 1
    d2 = Delta("h", "requests/0@11", 6, 30, 0, (rows(+1, Q[10:], y[10:], "b"),))
    assert not head.apply(d2, offset=2, partition=0).skipped
    assert head.ledger.digest() == ExactLedger.from_rows(Q, y).digest()
    assert dedup_key("requests/3@42") == ("requests/3", 42)
    assert dedup_key("site-a") is None


def test_bad_entries_are_rejected_and_the_rest_applies() -> None:
    Q, y = data()
    small = Q // 1000  # tiny rows: a delete of a full-size row makes a diagonal negative
    head = HeadRuntime.new("h", Delta("h", "x", 6, 30, 0, ()), CFG)
    head.apply(Delta("h", "x", 6, 30, 0, (rows(+1, small[:10], y[:10], "a"),)), 0, 0)
    delta = Delta("h", "x", 6, 30, 0, (
        rows(-1, Q[10:11], y[10:11], "bad"),  # never added
        rows(-1, small[:2], y[:2], "a", subject="alice"),  # members
    ))
    out = head.apply(delta, 1, 0)
    assert [r.reason for r in out.rejections] == ["non_member_delete"]
    assert out.rejections[0].event_ids == ("bad0",)
    assert [d.subject_id for d in out.deletes] == ["alice", "alice"]
    assert head.ledger.digest() == ExactLedger.from_rows(small[2:10], y[2:10], n_outputs=3).digest()
    wrong_dim = Delta("h", "x", 7, 30, 0, (rows(+1, np.zeros((1, 7), np.int64), np.array([0]), "w"),))
    out = head.apply(wrong_dim, 2, 0)
    assert [r.reason for r in out.rejections] == ["dimension_mismatch"]
    assert head.version == 3 and head.ledger.count == 8


def test_non_member_delete_leaves_state_unchanged() -> None:
    Q, y = data()
    head = HeadRuntime.new("h", Delta("h", "x", 6, 30, 0, ()), CFG)
    small = (Q[:3] // 1000).astype(np.int64)
    head.apply(Delta("h", "x", 6, 30, 0, (rows(+1, small, y[:3], "a"),)), 0, 0)
    head.sync()
    digest, W = head.ledger.digest(), head.weights.copy()
    out = head.apply(Delta("h", "x", 6, 30, 0, (rows(-1, Q[5:6], y[5:6], "z"),)), 1, 0)
    assert [r.reason for r in out.rejections] == ["non_member_delete"]
    assert head.sync() == ""
    assert head.ledger.digest() == digest and np.array_equal(head.weights, W)


def test_delete_subject_rows_group_into_one_receipt() -> None:
    Q, y = data()
    head = HeadRuntime.new("h", Delta("h", "x", 6, 30, 0, ()), CFG)
    head.apply(Delta("h", "x", 6, 30, 0, (rows(+1, Q[:5], y[:5], "a"),)), 0, 0)
    e = RowsEntry(-1, ["ev"] * 3, ["sa0", "sa1", "sa2"], ["bob"] * 3, y[:3], Q[:3])
    out = head.apply(Delta("h", "x", 6, 30, 0, (e,)), 1, 0)
    assert len(out.deletes) == 1 and out.deletes[0].sample_ids == ("sa0", "sa1", "sa2")


def test_packed_and_rows_give_the_same_digest() -> None:
    Q, y = data(30)
    a = HeadRuntime.new("h", Delta("h", "x", 6, 30, 0, ()), CFG)
    b = HeadRuntime.new("h", Delta("h", "x", 6, 30, 0, ()), CFG)
    a.apply(Delta("h", "x", 6, 30, 0, (rows(+1, Q, y, "a"), rows(-1, Q[:7], y[:7], "d"))), 0, 0)
    packed_add = PackedEntry(+1, ["p"] * 30, [f"s{i}" for i in range(30)], ["u"] * 30,
                             ExactLedger.from_rows(Q, y).to_bytes())
    packed_del = PackedEntry(-1, ["q"] * 7, [f"s{i}" for i in range(7)], ["u"] * 7,
                             ExactLedger.from_rows(Q[:7], y[:7]).to_bytes())
    b.apply(Delta("h", "site", 6, 30, 0, (packed_add, packed_del)), 0, 0)
    assert a.ledger.digest() == b.ledger.digest()
    assert b.sync() == "packed statistics"  # statistics, no rows: the fast head resets
    assert b.mode == "exact" and np.array_equal(b.weights, solve_head(b.ledger, 1.0))


# --------------------------------------------------------------------------- coalescing
def stream(n_msgs: int, d: int, seed: int) -> list[Delta]:
    """Messages of 1-3 adds, most with a delete of 1-2 retained rows (a delete_subject-like group)."""
    rng = np.random.default_rng(seed)
    Q, y = data(4 * n_msgs, d, seed)
    live: list[int] = []
    out: list[Delta] = []
    nxt = 0
    for m in range(n_msgs):
        k = int(rng.integers(1, 4))
        entries = [rows(+1, Q[nxt:nxt + k], y[nxt:nxt + k], f"a{m}-")]
        live += range(nxt, nxt + k)
        nxt += k
        if len(live) > 4 and rng.random() < 0.7:
            gone = [live.pop(int(rng.integers(len(live)))) for _ in range(int(rng.integers(1, 3)))]
            entries.append(RowsEntry(-1, [f"d{m}"] * len(gone), [f"s{i}" for i in gone], ["u"] * len(gone),
                                     y[gone], Q[gone]))
        out.append(Delta("h", f"requests/0@{m}", d, 30, 0, tuple(entries)))
    return out


def run_polls(msgs: list[Delta], sizes: list[int]) -> tuple[HeadRuntime, list[tuple[int, str | None]], list[str]]:
    """The worker's loop on one head: each poll applies its messages, then syncs once. Returns the
    head, the (version, retained_hash) its applied deletes' receipts name, and the sync reasons."""
    head = HeadRuntime.new("h", msgs[0], CFG)
    named: list[tuple[int, str | None]] = []
    reasons: list[str] = []
    i = 0
    for size in sizes:
        for off, m in enumerate(msgs[i:i + size], start=i):
            out = head.apply(m, off, 0)
            named += [(out.version, out.retained_hash) for _ in out.deletes]
        reasons.append(head.sync())
        i += size
    assert i >= len(msgs)
    return head, named, reasons


def test_receipts_and_versions_do_not_depend_on_poll_boundaries() -> None:
    """Each message is one version of the exact ledger and the multiset hash, whatever the polls:
    receipts name the version that applied the delete and its retained hash, identical across
    runs with different poll boundaries; only the fast W may round differently."""
    d = 40
    msgs = stream(60, d, seed=1)
    one, named_one, _ = run_polls(msgs, [1] * 60)
    rng = np.random.default_rng(2)
    sizes = [int(x) for x in rng.integers(1, 5, 40)]
    many, named_many, reasons = run_polls(msgs, sizes)
    assert named_one == named_many and named_one and all(h is not None for _, h in named_one)
    assert one.version == many.version == 60 and one.ledger.digest() == many.ledger.digest()
    assert one.retained_hash() == many.retained_hash()
    # the receipt's hash is that of the version it names, not of the last one in its poll
    published = set(np.cumsum(sizes).tolist())  # one head update per poll: its last version
    assert any(v not in published for v, _ in named_many)
    assert "" in reasons and many.mode == "fast"  # the fast head followed once per poll...
    W = solve_head(many.ledger, CFG.gamma)
    assert relative_deviation(many.weights, W) < 1e-9  # ... and stays close to the canonical head
    many.reset("timer")
    one.reset("timer")
    assert np.array_equal(many.weights, W) and np.array_equal(one.weights, W)  # exact: bit for bit


def test_sync_resets_when_rows_reach_half_the_dimension() -> None:
    """A poll with at least d / 2 rows resets (cheaper than an SMW update of that rank); fewer
    rows take one tracker update. Either way the ledger took every message on its own."""
    d = 12
    Q, y = data(40, d)
    head = HeadRuntime.new("h", Delta("h", "x", d, 30, 0, ()), CFG)
    head.apply(Delta("h", "x", d, 30, 0, (rows(+1, Q[:3], y[:3], "a"),)), 0, 0)
    head.apply(Delta("h", "x", d, 30, 0, (rows(+1, Q[3:5], y[3:5], "b"),)), 1, 0)
    assert head.sync() == "" and head.mode == "fast" and head.version == 2
    for i in range(3):
        head.apply(Delta("h", "x", d, 30, 0, (rows(+1, Q[5 + 2 * i:7 + 2 * i], y[5 + 2 * i:7 + 2 * i], f"c{i}"),)),
                   2 + i, 0)
    assert head.sync() == "coalesced 6 rows" and head.mode == "exact" and head.version == 5
    assert np.array_equal(head.weights, solve_head(ExactLedger.from_rows(Q[:11], y[:11]), CFG.gamma))
    assert head.sync() == "" and head.mode == "exact"  # nothing new: the head stays canonical


def test_drift_checks_run_when_coalesced_updates_pass_a_multiple() -> None:
    """A sync can add two tracker updates (its adds, then its deletes): the drift check runs when
    the count passes a multiple of 64, not only when it lands on one."""
    d = 12
    Q, y = data(200, d)
    cfg = HeadConfig(gamma=1.0, reset_every=1000, drift_threshold=-1.0)  # any estimate resets
    head = HeadRuntime.new("h", Delta("h", "x", d, 30, 0, ()), cfg)
    head.apply(Delta("h", "x", d, 30, 0, (rows(+1, Q[:1], y[:1], "a"),)), 0, 0)
    reasons = [head.sync()]  # 1 update
    for k in range(1, 40):  # then 2 per sync: 3, 5, ..., 63, 65
        head.apply(Delta("h", "x", d, 30, 0, (rows(+1, Q[k:k + 1], y[k:k + 1], f"b{k}-"),
                                              rows(-1, Q[k - 1:k], y[k - 1:k], f"d{k}-"))), k, 0)
        reasons.append(head.sync())
    assert reasons[:32] == [""] * 32 and reasons[32].startswith("drift estimate")


# --------------------------------------------------------------------------- resets off the poll thread
def test_a_reset_computed_from_copies_publishes_what_a_reset_at_its_version_would() -> None:
    """The timer's reset off the poll thread (streams/ledger/timed_resets.py): the exact update
    made from ``begin_reset``'s copies is, field for field and bit for bit, the update a reset at
    that version publishes, however many messages the live head applied meanwhile; adopting it
    leaves the live head fast at its own version, close to canonical, with the drift measured at
    the copies' version."""
    d = 24
    msgs = stream(50, d, seed=5)
    live, _, _ = run_polls(msgs[:30], [3] * 10)
    twin, _, _ = run_polls(msgs[:30], [3] * 10)
    assert live.mode == "fast"
    start = live.begin_reset()
    assert start is not None and live.begin_reset() is not None  # a newer mark replaces it
    start = live.begin_reset()
    assert start is not None
    for off in range(30, 40):  # the live head goes on while the thread computes
        live.apply(msgs[off], off, 0)
        live.sync()
    canonical, drift = canonical_copy(start, CFG)
    reset = twin.tracked.reset("timer")
    assert canonical.mode == "exact" and canonical.version == twin.version == 30 and live.version == 40
    exact = replace(head_update(canonical, posterior=True), created_ts=0.0)
    assert exact == replace(head_update(twin, posterior=True), created_ts=0.0)
    assert drift == reset.drift > 0
    rows = sum(e.n for m in msgs[30:40] for e in m.entries)  # adds and deletes, as tracked
    assert live.tracked.rows_since(start.mark) == rows
    assert live.end_reset(start, canonical, drift, max_rows=rows) == "adopted"
    assert live.mode == "fast" and live.version == 40 and live.fast_drift == drift
    assert live.tracked.tracker is canonical.tracked.tracker
    assert relative_deviation(live.weights, solve_head(live.ledger, CFG.gamma)) < 1e-9


def test_with_more_rows_since_the_copies_than_it_may_take_the_head_keeps_its_factor_measured() -> None:
    """Moving the copies' factor by many rows would cost the poll thread what the reset saved:
    the fast head goes on as it was, with the deviation measured at the copies' version."""
    d = 24
    msgs = stream(50, d, seed=7)
    live, _, _ = run_polls(msgs[:30], [3] * 10)
    start = live.begin_reset()
    assert start is not None
    for off in range(30, 40):
        live.apply(msgs[off], off, 0)
        live.sync()
    served, tracker = live.weights.copy(), live.tracked.tracker
    canonical, drift = canonical_copy(start, CFG)
    assert live.end_reset(start, canonical, drift, max_rows=5) == "measured"
    assert live.tracked.tracker is tracker and np.array_equal(live.weights, served) and live.mode == "fast"
    assert live.fast_drift == drift > 0
    assert live.tracked.rows_since(start.mark) is None  # released: its rows are no longer kept


def test_a_reset_since_the_copies_voids_them() -> None:
    """A heads rotation (or any reset) after ``begin_reset`` left the live head newer than the
    copies: ``end_reset`` refuses them and changes nothing."""
    d = 24
    msgs = stream(40, d, seed=6)
    live, _, _ = run_polls(msgs[:30], [3] * 10)
    start = live.begin_reset()
    assert start is not None
    live.apply(msgs[30], 30, 0)
    live.sync()
    live.reset("heads rotation")
    served = live.weights.copy()
    canonical, drift = canonical_copy(start, CFG)
    assert live.end_reset(start, canonical, drift, max_rows=1000) == ""
    assert live.mode == "exact" and np.array_equal(live.weights, served)
    live.apply(msgs[31], 31, 0)  # rows waiting for sync: no copies yet
    assert live.begin_reset() is None


# --------------------------------------------------------------------------- the retained-rows multiset hash
def test_the_multiset_hash_follows_the_retained_rows() -> None:
    """Adds join, deletes leave, rejected entries leave no trace: the head's hash is always the
    from-scratch hash of the retained rows (docs/design.md section 6)."""
    Q, y = data(20)
    small = Q // 1000
    head = HeadRuntime.new("h", Delta("h", "x", 6, 30, 0, ()), CFG)
    assert head.retained_hash() == MultisetHash(6).fingerprint()
    head.apply(Delta("h", "x", 6, 30, 0, (rows(+1, small[:10], y[:10], "a"),)), 0, 0)
    out = head.apply(Delta("h", "x", 6, 30, 0, (
        rows(-1, Q[10:11], y[10:11], "bad"),  # refused by the ledger: not hashed
        rows(-1, small[2:5], y[2:5], "a"),
        rows(+1, small[10:], y[10:], "b"),
    )), 1, 0)
    assert [r.reason for r in out.rejections] == ["non_member_delete"]
    keep = np.r_[0:2, 5:20]
    assert head.multiset == MultisetHash.of_rows(small[keep], y[keep])
    assert head.retained_hash() == MultisetHash.of_rows(small[keep], y[keep]).fingerprint()


def test_packed_entries_carry_their_rows_hash_or_make_it_unknown() -> None:
    Q, y = data(30)
    a = HeadRuntime.new("h", Delta("h", "x", 6, 30, 0, ()), CFG)
    a.apply(Delta("h", "x", 6, 30, 0, (rows(+1, Q, y, "a"), rows(-1, Q[:7], y[:7], "d"))), 0, 0)
    b = HeadRuntime.new("h", Delta("h", "x", 6, 30, 0, ()), CFG)

    def packed(sign: int, n0: int, n1: int, with_hash: bool) -> PackedEntry:
        mset = MultisetHash.of_rows(Q[n0:n1], y[n0:n1]).to_bytes() if with_hash else None
        return PackedEntry(sign, ["p"] * (n1 - n0), [f"s{i}" for i in range(n0, n1)], ["u"] * (n1 - n0),
                           ExactLedger.from_rows(Q[n0:n1], y[n0:n1]).to_bytes(), mset)

    b.apply(Delta("h", "site", 6, 30, 0, (packed(+1, 0, 30, True), packed(-1, 0, 7, True))), 0, 0)
    assert b.retained_hash() == a.retained_hash() and b.multiset == a.multiset
    # a packed entry without the hash: unknown from then on, never a wrong value
    b.apply(Delta("h", "site", 6, 30, 0, (packed(-1, 7, 9, False),)), 1, 0)
    assert b.multiset is None and b.retained_hash() is None
    b.apply(Delta("h", "x", 6, 30, 0, (rows(-1, Q[9:10], y[9:10], "e"),)), 2, 0)
    assert b.retained_hash() is None and b.ledger.count == 20
    # and it stays unknown through a snapshot
    state = decode_state(encode_state(b.state()))
    assert state.multiset is None and HeadRuntime.from_snapshot(state, CFG).retained_hash() is None


def test_a_zero_add_row_is_refused_a_zero_delete_row_applies() -> None:
    """The featurizer refuses a vector of no information (zero_norm_feature); the ledger (and the
    verifier's replay, which runs ``apply_entries``) refuses a zero add row as well, whole entry;
    the delete of a zero row an older head holds still applies."""
    Q, y = data()
    head = HeadRuntime.new("h", Delta("h", "x", 6, 30, 0, ()), CFG)
    zero = np.zeros((1, 6), np.int64)
    out = head.apply(Delta("h", "x", 6, 30, 0, (rows(+1, np.vstack([Q[:1], zero]), y[:2], "z"),
                                                 rows(+1, Q[2:4], y[2:4], "ok"))), 0, 0)
    assert [r.reason for r in out.rejections] == ["zero_norm_feature"]
    assert head.ledger.count == 2
    assert head.ledger.digest() == ExactLedger.from_rows(Q[2:4], y[2:4], n_outputs=head.ledger.n_outputs).digest()
    old = ExactLedger.from_rows(zero, y[:1], n_outputs=3)  # a zero row taken before this rule
    legacy = HeadRuntime("h", old, CFG)
    assert not legacy.apply(Delta("h", "y", 6, 30, 0, (rows(-1, zero, y[:1], "d"),)), 0, 0).rejections
    assert legacy.ledger.count == 0
