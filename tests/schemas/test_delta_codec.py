"""Binary ``deltas`` messages: round trips, canonical form, the documented byte layout, the
encoder's checks, and the optional blocks (multiset hash, contract)."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given

from tests.schemas.codec_support import FAST, deltas, reframe
from unlearn.schemas import (
    CodecError,
    Delta,
    HeadUpdate,
    PackedEntry,
    RowsEntry,
    decode_delta,
    decode_head,
    encode_delta,
    encode_head,
)
from unlearn.schemas.binary_frame import PREFIX, crc32c
from unlearn.schemas.delta_codec import MULTISET_HASH_BYTES


@FAST
@given(deltas())
def test_delta_round_trip(delta: Delta) -> None:
    raw = encode_delta(delta)
    back = decode_delta(raw)
    assert back == delta
    assert encode_delta(back) == raw
    for e in back.entries:
        if isinstance(e, RowsEntry):
            assert e.q.dtype == np.dtype("<i8") and e.q.shape == (e.n, delta.d)
            assert not e.q.flags.writeable, "decoded arrays are read-only views"


def test_encoder_rejects_inconsistent_values() -> None:
    q = np.zeros((2, 3), dtype=np.int64)
    ids = (["e1", "e2"], ["s1", "s2"], ["u", "u"])
    bad_deltas = [
        Delta("h", "f", 4, 30, 0, [RowsEntry(1, *ids, np.array([0, 1]), q)]),  # q shape vs d
        Delta("h", "f", 3, 30, 0, [RowsEntry(2, *ids, np.array([0, 1]), q)]),  # sign
        Delta("h", "f", 3, 30, 0, [RowsEntry(1, *ids, np.array([0, -1]), q)]),  # negative class
        Delta("h", "f", 3, 30, 0, [RowsEntry(1, *ids, np.array([0.5, 1.0]), q)]),  # float labels
        Delta("h", "f", 3, 30, 0, [RowsEntry(1, *ids, np.array([0, 1]), q.astype(float))]),  # float q
        Delta("h", "f", 3, 30, 0, [RowsEntry(1, ["e1"], ["s1", "s2"], ["u", "u"], np.array([0, 1]), q)]),
        Delta("h", "f", 3, 30, 0, [RowsEntry(1, ["", "e2"], ["s1", "s2"], ["u", "u"], np.array([0, 1]), q)]),
        Delta("", "f", 3, 30, 0, []),  # empty head id
        Delta("h", "f", 3, 63, 0, []),  # frac bits
        Delta("h", "f", 0, 30, 0, []),  # d
        Delta("h", "f", 3, 30, 0, [PackedEntry(1, [], [], [], b"x")]),  # no events
        Delta("h", "f", 3, 30, 0, [PackedEntry(1, ["e"], ["s"], ["u"], b"x", bytes(4095))]),  # hash size
    ]
    for delta in bad_deltas:
        with pytest.raises(CodecError):
            encode_delta(delta)
    w = np.zeros((2, 2))
    base = dict(head_id="h", version=1, mode="exact", digest="a" * 64, n_retained=1, events_covered=1,
                offsets=[], drift=0.0, gamma=1.0, created_ts=1.0, weights=w)
    bad_heads = [
        {"mode": "approx"}, {"digest": "A" * 64}, {"digest": "a" * 63}, {"version": -1},
        {"gamma": 0.0}, {"drift": float("nan")}, {"offsets": [(0, 1), (0, 2)]}, {"offsets": [(-1, 0)]},
        {"weights": np.zeros(3)}, {"posterior": np.eye(3)}, {"retained_hash": "A" * 64},
        {"retained_hash": "ab"}, {"digest": None},  # an exact update carries its digest
    ]
    for change in bad_heads:
        with pytest.raises(CodecError):
            encode_head(HeadUpdate(**{**base, **change}))  # type: ignore[arg-type]


def test_delta_layout_is_documented_exactly() -> None:
    """Pin the byte layout of a tiny delta (docs/formats.md walks through the same bytes)."""
    t = 1_700_000_000_000_999  # the delete's event time, microseconds
    delta = Delta("h", "f", 2, 30, 0, [RowsEntry(-1, ["e"], ["s"], ["u"], np.array([5]), np.array([[1, -2]]), [t],
                                                 False, ["c"])])  # a delete whose tombstone is client c's
    raw = encode_delta(delta)
    expect = (
        b"ULDT" + struct.pack("<HHQ", 1, 0, len(raw))
        + b"\x01\x00h" + b"\x01\x00f"
        + struct.pack("<IBBHI", 2, 30, 0, 0, 1)
        + struct.pack("<BbHI", 1, -1, 0, 1)
        + b"\x01\x00e" + b"\x01\x00s" + b"\x01\x00u" + b"\x01\x00c"
    )
    expect += bytes((-len(expect)) % 8) + struct.pack("<q", t)
    expect += struct.pack("<BBHI", 0, 0, 0, 0)
    expect += bytes((-len(expect)) % 8) + struct.pack("<q", 5)
    expect += struct.pack("<qq", 1, -2)
    expect += struct.pack("<I", crc32c(expect))
    assert raw == expect and len(raw) == 100
    # ROWS32 (kind 5, what the featurizer writes): the same bytes but the kind and Q as i32
    raw32 = encode_delta(Delta("h", "f", 2, 30, 0, [replace(delta.entries[0], q_itemsize=4)]))
    expect32 = expect[:34] + b"\x05" + expect[35:80] + struct.pack("<ii", 1, -2)
    expect32 = expect32[:8] + struct.pack("<Q", 92) + expect32[16:]
    assert raw32 == expect32 + struct.pack("<I", crc32c(expect32)) and len(raw32) == 92
    back = decode_delta(raw32).entries[0]
    assert isinstance(back, RowsEntry) and back.q_itemsize == 4 and back == delta.entries[0]
    assert back.q.dtype == np.int64 and not back.q.flags.writeable


@pytest.mark.parametrize("value", [2**30 + 1, -(2**30) - 1, 2**31 - 1, -(2**31)])
def test_rows32_q_beyond_2_30_is_refused_never_wrapped(value: int) -> None:
    entry = RowsEntry(1, ["e"], ["s"], ["u"], np.array([5]), np.array([[1, value]]), q_itemsize=4)
    with pytest.raises(CodecError, match=r"2\^30"):
        encode_delta(Delta("h", "f", 2, 30, 0, [entry]))
    ok = encode_delta(Delta("h", "f", 2, 30, 0, [replace(entry, q=np.array([[1, 2]]))]))
    body = ok[16:-4].replace(struct.pack("<ii", 1, 2), struct.pack("<ii", 1, value))  # a hostile encoder
    with pytest.raises(CodecError, match=r"2\^30"):
        decode_delta(reframe(ok, body))


def test_delta_client_column_is_checked() -> None:
    """One client per row: an id, or "" (a delete's tombstone that matches every client; left
    out, every row is ""); the column survives a round trip in every entry kind."""
    q, labels = np.array([[1, -2], [3, 4]]), np.array([5, 6])
    assert RowsEntry(1, ["e", "f"], ["s", "t"], ["u", "u"], labels, q).client_ids == ("", "")
    for bad in (["c"], ["c", "bad id"], ["c", 7]):
        with pytest.raises(CodecError, match="client_ids"):
            encode_delta(Delta("h", "f", 2, 30, 0, [RowsEntry(1, ["e", "f"], ["s", "t"], ["u", "u"], labels, q,
                                                              client_ids=bad)]))
    entries = [RowsEntry(1, ["e", "f"], ["s", "t"], ["u", "u"], labels, q, client_ids=["a", "b"]),
               PackedEntry(-1, ["g"], ["s"], ["u"], b"blob", None, [9], True, ["a"]),
               PackedEntry(-1, ["h"], ["t"], ["u"], b"blob", None, [9], False, [""])]
    back = decode_delta(encode_delta(Delta("h", "f", 2, 30, 0, entries)))
    assert [e.client_ids for e in back.entries] == [("a", "b"), ("a",), ("",)] and back.entries[0] == entries[0]
    raw = encode_delta(Delta("h", "f", 2, 30, 0, [entries[1]]))
    body = bytearray(raw[PREFIX.size:-4])
    at = body.index(b"\x01\x00u\x01\x00a") + 5
    body[at] = ord(" ")
    with pytest.raises(CodecError, match="client_ids"):
        decode_delta(reframe(raw, bytes(body)))


def test_delta_event_times_are_checked() -> None:
    """One event time per row, 0..2^63-1; left out, every row is dated 0 (before any delete)."""
    q, labels = np.array([[1, -2]]), np.array([5])
    assert RowsEntry(1, ["e"], ["s"], ["u"], labels, q).event_us == (0,)
    for bad in ([1, 2], [-1], [2**63]):
        with pytest.raises(CodecError, match="event_us"):
            encode_delta(Delta("h", "f", 2, 30, 0, [RowsEntry(1, ["e"], ["s"], ["u"], labels, q, bad)]))
    raw = encode_delta(Delta("h", "f", 2, 30, 0, [RowsEntry(1, ["e"], ["s"], ["u"], labels, q, [7])]))
    body = bytearray(raw[PREFIX.size:-4])
    at = body.index(struct.pack("<q", 7))
    body[at:at + 8] = struct.pack("<q", -7)
    with pytest.raises(CodecError, match="negative event time"):
        decode_delta(reframe(raw, bytes(body)))
    with pytest.raises(CodecError, match="by_subject"):  # only deletes leave tombstones
        encode_delta(Delta("h", "f", 2, 30, 0, [RowsEntry(1, ["e"], ["s"], ["u"], labels, q, [7], True)]))
    by_subject = encode_delta(Delta("h", "f", 2, 30, 0, [RowsEntry(-1, ["e"], ["s"], ["u"], labels, q, [7], True)]))
    assert decode_delta(by_subject).entries[0].by_subject
    body = bytearray(by_subject[PREFIX.size:-4])
    body[body.index(struct.pack("<BbHI", 1, -1, 2, 1)) + 1] = 1  # the same entry as an add: flag refused
    with pytest.raises(CodecError, match="unknown entry flags"):
        decode_delta(reframe(by_subject, bytes(body)))
    for version in (2, 3):  # one version: nothing else was ever released
        with pytest.raises(CodecError, match=f"unknown version {version}"):
            decode_delta(reframe(raw, version=version))


def test_delta_codec_is_fast_for_a_256x768_batch() -> None:
    rng = np.random.default_rng(0)
    n, d = 256, 768
    entry = RowsEntry(
        1, [f"ev-{i}" for i in range(n)], [f"s-{i}" for i in range(n)], [f"u-{i % 9}" for i in range(n)],
        rng.integers(0, 10, n), rng.integers(-(2**30), 2**30, (n, d)),
    )
    delta = Delta("head", "featurizer-0", d, 30, 0, [entry])
    raw = encode_delta(delta)
    assert decode_delta(raw) == delta

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(15):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    enc, dec = best(lambda: encode_delta(delta)), best(lambda: decode_delta(raw))
    print(f"256x768 delta ({len(raw) / 1e6:.2f} MB): encode {enc * 1e3:.2f} ms, decode {dec * 1e3:.2f} ms")
    # Target ~1 ms each on a quiet core; the bound leaves room for a loaded 2-core CI box.
    assert enc < 0.02 and dec < 0.02


def test_packed_multiset_hash_is_entry_flag_bit_0() -> None:
    """A packed entry may carry the multiset hash of its rows (entry flag bit 0, the 4096-byte
    state right after the blob); no other entry flag exists."""
    from unlearn.ledger.multiset_hash import STATE_BYTES

    assert MULTISET_HASH_BYTES == STATE_BYTES
    mset = bytes(range(256)) * 16
    old = Delta("h", "f", 2, 30, 0, [PackedEntry(-1, ["e"], ["s"], ["u"], b"blob", None, [3])])
    new = Delta("h", "f", 2, 30, 0, [*old.entries, PackedEntry(1, ["e2"], ["s2"], ["u"], b"blob2", mset, [4])])
    raw_old, raw_new = encode_delta(old), encode_delta(new)
    assert struct.unpack_from("<H", raw_old, 4) == (1,) and struct.unpack_from("<H", raw_new, 4) == (1,)
    assert decode_delta(raw_old).entries[0].multiset_hash is None  # type: ignore[union-attr]
    back = decode_delta(raw_new)
    assert back == new and back.entries[1].multiset_hash == mset  # type: ignore[union-attr]
    expect = (
        b"ULDT" + struct.pack("<HHQ", 1, 0, len(raw_new))
        + b"\x01\x00h" + b"\x01\x00f" + struct.pack("<IBBHI", 2, 30, 0, 0, 2)
        + struct.pack("<BbHI", 2, -1, 0, 1) + b"\x01\x00e" + b"\x01\x00s" + b"\x01\x00u" + b"\x00\x00"
    )
    expect += bytes((-len(expect)) % 8) + struct.pack("<qQ", 3, 4) + b"blob"
    expect += struct.pack("<BbHI", 2, 1, 1, 1) + b"\x02\x00e2" + b"\x02\x00s2" + b"\x01\x00u" + b"\x00\x00"
    expect += bytes((-len(expect)) % 8) + struct.pack("<qQ", 4, 5) + b"blob2" + mset
    assert raw_new == expect + struct.pack("<I", crc32c(expect))
    # entry flags: only the hash bit, only on packed entries
    body = bytearray(raw_new[PREFIX.size:-4])
    flag_at = body.index(struct.pack("<BbHI", 2, 1, 1, 1)) + 2
    body[flag_at] = 3
    with pytest.raises(CodecError, match="unknown entry flags"):
        decode_delta(reframe(raw_new, bytes(body)))
    rows = Delta("h", "f", 2, 30, 0, [RowsEntry(1, ["e"], ["s"], ["u"], np.array([5]), np.array([[1, -2]]))])
    rbody = bytearray(encode_delta(rows)[PREFIX.size:-4])
    rbody[rbody.index(struct.pack("<BbHI", 1, 1, 0, 1)) + 2] = 1
    with pytest.raises(CodecError, match="unknown entry flags"):
        decode_delta(reframe(encode_delta(new), bytes(rbody)))


@FAST
@given(deltas())
def test_the_contract_block_is_frame_flag_bit_0_after_the_header(delta: Delta) -> None:
    """The contract block is frame flag bit 0 with 16 bytes after the fixed header; a delta of a
    head without a contract leaves both out and decodes with None."""
    bare = Delta(delta.head_id, delta.source_id, delta.d, delta.frac_bits, delta.label_frac_bits, delta.entries)
    raw_bare = encode_delta(bare)
    assert struct.unpack_from("<H", raw_bare, 6) == (0,)
    back = decode_delta(raw_bare)
    assert (back.n_classes, back.contract_version) == (None, None) and back == bare
    with_c = Delta(*(getattr(bare, f) for f in ("head_id", "source_id", "d", "frac_bits", "label_frac_bits",
                                                   "entries")), 10, 3)
    raw_c = encode_delta(with_c)
    assert struct.unpack_from("<H", raw_c, 6) == (1,) and len(raw_c) == len(raw_bare) + 16
    header_end = PREFIX.size + 4 + len(bare.head_id) + len(bare.source_id) + struct.calcsize("<IBBHI")
    assert raw_c[header_end:header_end + 16] == struct.pack("<IIQ", 10, 0, 3)
    assert raw_c[PREFIX.size:header_end] == raw_bare[PREFIX.size:header_end]
    assert raw_c[header_end + 16:-4] == raw_bare[header_end:-4]
    assert decode_delta(raw_c) == with_c


def test_delta_contract_block_is_checked() -> None:
    rows = [RowsEntry(1, ["e"], ["s"], ["u"], np.array([3]), np.array([[1, -2]]))]
    for n_classes, version in ((10, None), (None, 1), (0, 1), (10, 0), (2**32, 1)):
        with pytest.raises(CodecError, match=r"n_classes|contract_version"):
            encode_delta(Delta("h", "f", 2, 30, 0, rows, n_classes, version))
    raw = encode_delta(Delta("h", "f", 2, 30, 0, rows, 10, 3))
    at = PREFIX.size + 6 + struct.calcsize("<IBBHI")
    body = bytearray(raw[PREFIX.size:-4])
    for offset, value in ((0, b"\x00\x00\x00\x00"), (4, b"\x01\x00\x00\x00"), (8, bytes(8))):
        bad = bytearray(body)
        bad[at - PREFIX.size + offset:at - PREFIX.size + offset + len(value)] = value
        with pytest.raises(CodecError, match="contract"):
            decode_delta(reframe(raw, bytes(bad)))
    with pytest.raises(CodecError, match="unknown flags"):
        decode_delta(reframe(raw, flags=0x0002))


@pytest.mark.parametrize("bad", ["evil\n[2026-01-01 00:00:00] [ERROR] forged line", "../../x", "\U0001f600", "a b", ""])
def test_forged_ids_do_not_decode(bad: str) -> None:
    """A forged deltas or heads message cannot smuggle an id outside the id grammar (newlines that
    forge log lines, path separators, look-alikes) past the codec into logs and keys."""
    q = np.zeros((1, 3), dtype=np.int64)
    for d in (Delta(bad, "f", 3, 30, 0, [RowsEntry(1, ["e"], ["s"], ["u"], np.array([0]), q)]),
              Delta("h", "f", 3, 30, 0, [RowsEntry(1, ["e"], [bad], ["u"], np.array([0]), q)]),
              Delta("h", "f", 3, 30, 0, [RowsEntry(1, ["e"], ["s"], [bad], np.array([0]), q)])):
        try:
            raw = encode_delta(d)
        except CodecError:
            continue  # refused already when written
        with pytest.raises(CodecError, match="not an id"):
            decode_delta(raw)
    head = HeadUpdate(bad, 1, "exact", "a" * 64, 1, 1, [], 0.0, 1.0, 1.0, np.zeros((2, 2)))
    try:
        raw = encode_head(head)
    except CodecError:
        return
    with pytest.raises(CodecError, match="not an id"):
        decode_head(raw)
