"""The ledger processor's rules, without a broker: offsets, duplicates, rejections, snapshots."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from unlearn.ledger import ExactLedger, MultisetHash, Quantizer, l2_normalize, solve_head
from unlearn.schemas.delta_codec import Delta, PackedEntry, RowsEntry
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime, parse_source_id
from unlearn.streams.ledger.snapshot import (
    HeadState,
    SnapshotError,
    decode_state,
    encode_state,
    join_pieces,
    split_pieces,
    state_sha,
)

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
    assert parse_source_id("requests/3@42") == ("requests/3", 42)
    assert parse_source_id("site-a") is None


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
    digest, W = head.ledger.digest(), head.weights.copy()
    out = head.apply(Delta("h", "x", 6, 30, 0, (rows(-1, Q[5:6], y[5:6], "z"),)), 1, 0)
    assert [r.reason for r in out.rejections] == ["non_member_delete"]
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
    assert b.mode == "exact" and np.array_equal(b.weights, solve_head(b.ledger, 1.0))


def test_snapshot_pieces_round_trip_and_detect_mixing() -> None:
    Q, y = data(50, d=40)
    head = HeadRuntime.new("h", Delta("h", "x", 40, 30, 0, ()), CFG)
    head.apply(Delta("h", "requests/1@7", 40, 30, 0, (rows(+1, Q, y, "a"),)), 5, 1)
    state = encode_state(head.state())
    pieces = split_pieces(state, generation=3, offset=5, max_piece_bytes=4096)
    assert len(pieces) > 3 and all(len(p) <= 4096 for p in pieces)
    sha = state_sha(state).hex()
    back = decode_state(join_pieces(3, 5, sha, pieces))
    assert back.meta == head.meta() and back.ledger.digest() == head.ledger.digest()
    assert back.multiset == head.multiset and back.multiset is not None
    restored = HeadRuntime.from_snapshot(back, CFG)
    assert restored.version == 1 and restored.source_offsets == {"requests/1": 7}
    assert restored.retained_hash() == head.retained_hash() == MultisetHash.of_rows(Q, y).fingerprint()
    assert restored.apply(Delta("h", "x", 40, 30, 0, ()), 5, 1).skipped == "redelivered"
    # a piece from another generation (a crash mid-write of the other slot) is never accepted
    other = split_pieces(state + b"", generation=4, offset=5, max_piece_bytes=4096)
    with pytest.raises(SnapshotError, match="another snapshot"):
        join_pieces(3, 5, sha, [other[0], *pieces[1:]])
    with pytest.raises(SnapshotError, match="missing"):
        join_pieces(3, 5, sha, [*pieces[:-1], None])


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


def test_a_version_1_snapshot_loads_with_an_unknown_hash() -> None:
    """Snapshots written before the multiset hash existed (state version 1: meta + ledger) still
    load; the head's hash is then unknown, explicitly (docs/ledger-processor.md)."""
    Q, y = data(10)
    head = HeadRuntime.new("h", Delta("h", "x", 6, 30, 0, ()), CFG)
    head.apply(Delta("h", "requests/0@3", 6, 30, 0, (rows(+1, Q, y, "a"),)), 4, 0)
    meta = head.meta().to_json()
    v1 = b"ULST" + struct.pack("<HI", 1, len(meta)) + meta + head.ledger.to_bytes()
    state = decode_state(v1)
    assert state.meta == head.meta() and state.ledger == head.ledger and state.multiset is None
    assert encode_state(HeadState(state.meta, state.ledger, head.multiset))[4:6] == struct.pack("<H", 2)
    with pytest.raises(SnapshotError, match="unknown head state version 3"):
        decode_state(b"ULST" + struct.pack("<HI", 3, len(meta)) + meta + head.ledger.to_bytes())
