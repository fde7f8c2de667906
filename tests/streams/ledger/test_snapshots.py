"""A head's state as snapshot pieces (streams/ledger/snapshots.py): round trips, a mixed or partial
set of pieces refused, and one state version."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.streams.ledger.test_head_runtime import CFG, data, rows
from unlearn.ledger import MultisetHash
from unlearn.schemas.delta_codec import Delta
from unlearn.streams.ledger.head_runtime import HeadRuntime
from unlearn.streams.ledger.snapshots import (
    HeadState,
    SnapshotError,
    decode_state,
    encode_state,
    join_pieces,
    split_pieces,
    state_buffers,
    state_sha,
)


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


def test_a_head_state_of_another_version_is_refused() -> None:
    """The state blob has one version (2); any other is a SnapshotError naming it."""
    Q, y = data(10)
    head = HeadRuntime.new("h", Delta("h", "x", 6, 30, 0, ()), CFG)
    head.apply(Delta("h", "requests/0@3", 6, 30, 0, (rows(+1, Q, y, "a"),)), 4, 0)
    blob = encode_state(HeadState(head.meta(), head.ledger, head.multiset))
    assert blob[4:6] == struct.pack("<H", 2) and decode_state(blob).ledger == head.ledger
    for other in (1, 3):
        with pytest.raises(SnapshotError, match=f"unknown head state version {other}"):
            decode_state(blob[:4] + struct.pack("<H", other) + blob[6:])


@settings(max_examples=40, deadline=None)
@given(size=st.integers(0, 9000), cuts=st.lists(st.integers(0, 9000), max_size=6), piece=st.integers(1100, 5000))
def test_pieces_cut_from_buffers_are_those_of_the_joined_blob(size: int, cuts: list[int], piece: int) -> None:
    """What a checkpoint writes (pieces cut from the state's buffers, never joined whole) is byte
    for byte what cutting the blob gives, wherever the buffers' boundaries fall (empty ones too)."""
    blob = bytes(range(256)) * (size // 256) + bytes(size % 256)
    bounds = sorted({0, size, *(min(c, size) for c in cuts)})
    buffers = [b"", *(memoryview(blob)[a:b] for a, b in itertools.pairwise(bounds)), b""]
    sha = state_sha(buffers)
    assert sha == state_sha(blob)
    pieces = split_pieces(buffers, 2, 9, piece, sha)
    assert pieces == split_pieces(blob, 2, 9, piece) and all(len(p) <= piece for p in pieces)
    assert join_pieces(2, 9, sha.hex(), list(pieces)) == blob


def test_a_state_blob_is_its_buffers_joined() -> None:
    Q, y = data(30, d=24)
    head = HeadRuntime.new("h", Delta("h", "x", 24, 30, 0, ()), CFG)
    head.apply(Delta("h", "requests/1@7", 24, 30, 0, (rows(+1, Q, y, "a"),)), 5, 1)
    state = head.state()
    assert b"".join(state_buffers(state)) == encode_state(state)
    assert decode_state(encode_state(state)).ledger.digest() == head.ledger.digest()
