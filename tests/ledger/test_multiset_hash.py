"""The multiset hash of the retained rows: order, add-then-delete and partition invariance, distinct
multisets give distinct states, and the byte layout is the documented one (docs/design.md section 6)."""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ledger.test_exact_ledger import label_kinds, random_labels, random_rows
from unlearn.ledger import LedgerError, MultisetHash
from unlearn.ledger.multiset_hash import LANES, STATE_BYTES, encode_row, row_hashes

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _rows(seed: int, n: int, d: int, kind: str, c: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return random_rows(rng, n, d), random_labels(rng, n, kind, c)


def _in_batches(h: MultisetHash, Q: np.ndarray, y: np.ndarray, order: np.ndarray, cuts: list[int], sign: int) -> None:
    for idx in np.split(order, sorted(set(cuts))):
        if idx.size:
            (h.add if sign > 0 else h.delete)(Q[idx], y[idx])


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 9), n=st.integers(0, 30), kind=label_kinds,
       cuts=st.lists(st.integers(0, 30), max_size=5))
def test_any_order_and_batching_gives_the_same_state(seed: int, d: int, n: int, kind: str, cuts: list[int]) -> None:
    Q, y = _rows(seed, n, d, kind)
    whole = MultisetHash(d)
    whole.add(Q, y)
    shuffled = MultisetHash(d)
    order = np.random.default_rng(seed + 1).permutation(n)
    _in_batches(shuffled, Q, y, order, [c for c in cuts if c < n], +1)
    assert shuffled == whole and shuffled.to_bytes() == whole.to_bytes()
    assert shuffled.fingerprint() == whole.fingerprint()


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 9), n=st.integers(1, 30), kind=label_kinds,
       cuts=st.lists(st.integers(0, 30), max_size=5))
def test_add_then_delete_returns_to_the_previous_state_bit_for_bit(seed: int, d: int, n: int, kind: str,
                                                                    cuts: list[int]) -> None:
    Q, y = _rows(seed, 2 * n, d, kind)
    h = MultisetHash.of_rows(Q[:n], y[:n])
    before = h.to_bytes()
    h.add(Q[n:], y[n:])
    assert h.to_bytes() != before
    order = n + np.random.default_rng(seed).permutation(n)  # deleted in another order and batching
    _in_batches(h, Q, y, order, [c for c in cuts if c < n], -1)
    assert h.to_bytes() == before
    empty = MultisetHash.of_rows(Q, y)
    empty.delete(Q, y)
    assert empty == MultisetHash(d) and not empty.lanes.any()


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 9), n=st.integers(0, 30), parts=st.integers(1, 5),
       kind=label_kinds)
def test_partition_hashes_sum_to_the_whole(seed: int, d: int, n: int, parts: int, kind: str) -> None:
    Q, y = _rows(seed, n, d, kind)
    where = np.random.default_rng(seed).integers(0, parts, n)
    pieces = []
    for p in range(parts):
        h = MultisetHash(d)
        h.add(Q[where == p], y[where == p])
        pieces.append(h)
    total = MultisetHash(d)
    for h in reversed(pieces):
        total = total + h
    assert total == MultisetHash.of_rows(Q, y)
    if parts > 1 and n:  # and a partition removed again leaves the rest
        total.absorb(pieces[0], -1)
        rest = MultisetHash(d)
        rest.add(Q[where != 0], y[where != 0])
        assert total == rest


_POOL_Q = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [-1, 0], [2**30, -(2**30)]], np.int64)
_POOL_Y = np.array([0, 0, 1, 2, 0, 1])
_multiset = st.lists(st.integers(0, len(_POOL_Q) - 1), max_size=6).map(sorted)


@settings(max_examples=200, deadline=None)
@given(a=_multiset, b=_multiset)
def test_distinct_small_multisets_give_distinct_states(a: list[int], b: list[int]) -> None:
    """Multiplicities count ({x} != {x, x}); a row's label and its kind are part of it."""
    ha = MultisetHash.of_rows(_POOL_Q[a].reshape(-1, 2), _POOL_Y[a])
    hb = MultisetHash.of_rows(_POOL_Q[b].reshape(-1, 2), _POOL_Y[b])
    assert (ha == hb) == (a == b)
    assert (ha.fingerprint() == hb.fingerprint()) == (a == b)


def test_labels_and_grid_are_part_of_a_row() -> None:
    q = np.array([[3, -4]])
    base = MultisetHash.of_rows(q, [1])
    assert base != MultisetHash.of_rows(q, [2])
    assert base != MultisetHash.of_rows(q, np.array([[0, 1]]))  # a target vector is another row
    assert base.to_bytes() != MultisetHash.of_rows(q, [1], frac_bits=29).to_bytes()
    assert base.to_bytes() != MultisetHash.of_rows(q, [1], label_frac_bits=2).to_bytes()
    with pytest.raises(LedgerError, match="grid"):
        base.absorb(MultisetHash.of_rows(q, [1], frac_bits=29))


def test_65536_copies_of_a_row_do_not_vanish() -> None:
    """Why 32-bit lanes: the ledger may hold 2^32 - 1 copies of one row; with LtHash's 16-bit lanes
    2^16 copies would sum to nothing. Doubling 16 times is the hash of 2^16 copies."""
    one = MultisetHash.of_rows(np.array([[0, 0]]), [0])
    h = one.copy()
    for _ in range(16):
        h = h + h
    assert h != MultisetHash(2) and h != one


def test_bytes_round_trip_and_bad_input() -> None:
    Q, y = _rows(3, 7, 4, "matrix")
    h = MultisetHash.of_rows(Q, y, label_frac_bits=5)
    raw = h.to_bytes()
    assert len(raw) == STATE_BYTES
    back = MultisetHash.from_bytes(raw, 4, 30, 5)
    assert back == h and back.fingerprint() == h.fingerprint()
    back.add(Q[:1], y[:1])  # the copy is writable and independent
    assert back != h and MultisetHash.from_bytes(raw, 4, 30, 5) == h
    with pytest.raises(LedgerError, match="4096 bytes"):
        MultisetHash.from_bytes(raw[:-1], 4)
    with pytest.raises(LedgerError, match="shape"):
        h.add(Q[:, :3], y)
    with pytest.raises(LedgerError, match="labels"):
        h.add(Q, y[:2])
    with pytest.raises(LedgerError, match="integers"):
        h.add(Q.astype(float), y)
    with pytest.raises(LedgerError, match="int64"):
        h.add(Q.astype(np.uint64) + np.uint64(2**63), y)


# --------------------------------------------------------------------------- the documented bytes
def _independent_element(q: list[int], label: int | list[int], k: int, k_y: int) -> list[int]:
    """h(row) from the spec alone: struct-packed encoding, hashlib SHAKE-128, u32 lanes."""
    kind, values = (0, [label]) if isinstance(label, int) else (1, list(label))
    enc = b"unlearn.mset.row/v1\x00" + struct.pack("<5q", len(q), k, k_y, kind, len(values))
    enc += struct.pack(f"<{len(q)}q", *q) + struct.pack(f"<{len(values)}q", *values)
    out = hashlib.shake_128(enc).digest(4096)
    return [int.from_bytes(out[4 * i:4 * i + 4], "little") for i in range(1024)]


def _independent_fingerprint(rows: list[tuple[list[int], int | list[int], int]], k: int, k_y: int) -> str:
    lanes = [0] * 1024
    for q, label, sign in rows:
        lanes = [(a + sign * b) % 2**32 for a, b in zip(lanes, _independent_element(q, label, k, k_y))]
    state = b"".join(x.to_bytes(4, "little") for x in lanes)
    return hashlib.sha256(b"unlearn.mset/v1\x00" + state).hexdigest()


def test_encoding_is_the_documented_one() -> None:
    assert encode_row(np.array([1, -2]), 5) == (b"unlearn.mset.row/v1\x00" + struct.pack("<5q", 2, 30, 0, 0, 1)
                                                 + struct.pack("<3q", 1, -2, 5))
    assert encode_row(np.array([7]), np.array([3, -1]), 20, 4) == (
        b"unlearn.mset.row/v1\x00" + struct.pack("<5q", 1, 20, 4, 1, 2) + struct.pack("<3q", 7, 3, -1))
    assert LANES == 1024 and STATE_BYTES == 4096
    rng = np.random.default_rng(11)
    Q = random_rows(rng, 5, 3)
    y = rng.integers(0, 4, 5)
    H = row_hashes(Q, y)
    assert H.shape == (5, 1024) and H.dtype == np.uint32
    assert [int(x) for x in H[2]] == _independent_element([int(v) for v in Q[2]], int(y[2]), 30, 0)
    T = rng.integers(-(2**30), 2**30, (3, 2))
    h = MultisetHash.of_rows(Q[:3], T, label_frac_bits=6)
    h.add(Q[3:], y[3:] * 0 + 1)
    h.delete(Q[:1], T[:1])
    rows = [([int(v) for v in Q[i]], [int(v) for v in T[i]], +1) for i in range(3)]
    rows += [([int(v) for v in Q[i]], 1, +1) for i in (3, 4)]
    rows.append(([int(v) for v in Q[0]], [int(v) for v in T[0]], -1))
    assert h.fingerprint() == _independent_fingerprint(rows, 30, 6)


def test_the_worked_example_in_the_docs() -> None:
    """docs/design.md section 6 quotes the fingerprints of a tiny multiset; recompute them."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    section = doc[doc.index("## 6. "):]
    quoted = re.findall(r"fingerprint\s+([0-9a-f]{64})", section)
    empty = _independent_fingerprint([], 30, 0)
    one = _independent_fingerprint([([1, -2], 5, +1)], 30, 0)
    assert quoted[:2] == [empty, one]
    assert MultisetHash(2).fingerprint() == empty
    assert MultisetHash.of_rows(np.array([[1, -2]]), [5]).fingerprint() == one
    first = _independent_element([1, -2], 5, 30, 0)[:4]
    assert f"lanes[0..3] = {first}" in " ".join(section.split())
    assert f"({len(encode_row(np.array([1, -2]), 5))} bytes)" in section
