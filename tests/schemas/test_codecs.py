"""Binary codecs (deltas, heads): round trips, canonical form, and corruption never decoding
into something wrong (it raises CodecError, and nothing else)."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

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
    head_to_json,
)
from unlearn.schemas.delta_codec import MULTISET_HASH_BYTES, PREFIX, crc32c

_ids = st.from_regex(r"[A-Za-z0-9._:@+-]{1,12}", fullmatch=True)  # the id grammar (schemas.envelope.ID_CHARS)
_I64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def _rows(draw: st.DrawFn, d: int) -> RowsEntry:
    n = draw(st.integers(1, 6))
    ids = [draw(st.lists(_ids, min_size=n, max_size=n)) for _ in range(3)]
    if draw(st.booleans()):
        labels = draw(hnp.arrays(np.int64, n, elements=st.integers(0, 2**63 - 1)))
    else:
        labels = draw(hnp.arrays(np.int64, (n, draw(st.integers(1, 4))), elements=_I64))
    q = draw(hnp.arrays(np.int64, (n, d), elements=_I64))
    sign = draw(st.sampled_from([1, -1]))
    return RowsEntry(sign, *ids, labels, q, draw(_event_times(n)), sign < 0 and draw(st.booleans()))


def _event_times(n: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n)


_multiset_hash = st.none() | st.integers(0, 2**32 - 1).map(lambda s: np.random.default_rng(s).bytes(4096))


@st.composite
def _packed(draw: st.DrawFn) -> PackedEntry:
    n = draw(st.integers(1, 5))
    ids = [draw(st.lists(_ids, min_size=n, max_size=n)) for _ in range(3)]
    sign = draw(st.sampled_from([1, -1]))
    return PackedEntry(sign, *ids, draw(st.binary(max_size=64)), draw(_multiset_hash), draw(_event_times(n)),
                       sign < 0 and draw(st.booleans()))


@st.composite
def deltas(draw: st.DrawFn) -> Delta:
    d = draw(st.integers(1, 9))
    entries = draw(st.lists(st.one_of(_rows(d), _packed()), max_size=3))
    contract = draw(st.none() | st.tuples(st.integers(1, 2**32 - 1), st.integers(1, 2**63 - 1)))
    return Delta(draw(_ids), draw(_ids), d, draw(st.integers(0, 62)), draw(st.integers(0, 62)), entries,
                 *(contract or (None, None)))


_f64 = st.floats(allow_nan=True, allow_infinity=True, width=64)
_nonneg = st.floats(min_value=0, max_value=1e300, allow_nan=False)


@st.composite
def heads(draw: st.DrawFn) -> HeadUpdate:
    d = draw(st.integers(1, 6))
    c = draw(st.integers(0, 4))
    parts = draw(st.lists(st.integers(0, 2**31 - 1), unique=True, max_size=4))
    mode = draw(st.sampled_from(["exact", "fast"]))
    digest = st.binary(min_size=32, max_size=32).map(bytes.hex)
    classes = draw(st.none() | hnp.arrays(np.bool_, (c,)))
    return HeadUpdate(
        head_id=draw(_ids),
        version=draw(st.integers(0, 2**64 - 1)),
        mode=mode,
        digest=draw(digest if mode == "exact" else st.none() | digest),  # fast updates may carry none
        # a class with retained samples needs a retained sample
        n_retained=draw(st.integers(0 if classes is None else int(classes.sum()), 2**64 - 1)),
        events_covered=draw(st.integers(0, 2**64 - 1)),
        offsets=[(p, draw(st.integers(0, 2**63 - 1))) for p in parts],
        drift=draw(_nonneg),
        gamma=draw(st.floats(min_value=1e-300, max_value=1e300)),
        created_ts=draw(_nonneg),
        weights=draw(hnp.arrays(np.float64, (d, c), elements=_f64)),
        posterior=draw(st.none() | hnp.arrays(np.float64, (d, d), elements=_f64)),
        retained_hash=draw(st.none() | st.binary(min_size=32, max_size=32).map(bytes.hex)),
        contract_version=draw(st.none() | st.integers(1, 2**63 - 1)),
        retained_classes=classes,
    )


CODECS: dict[str, tuple[Any, Callable[[Any], bytes], Callable[[bytes], Any]]] = {
    "delta": (deltas(), encode_delta, decode_delta),
    "head": (heads(), encode_head, decode_head),
}

SAMPLES: dict[str, Any] = {
    "delta": Delta("h", "f", 2, 30, 8, [
        RowsEntry(1, ["e1", "e2"], ["s1", "s2"], ["u", "v"], np.array([[1], [2]]), np.array([[1, 2], [3, 4]])),
        PackedEntry(-1, ["e3"], ["s3"], ["u"], b"ledger"),
    ]),
    "head": HeadUpdate("h", 7, "fast", "ab" * 32, 2, 3, [(0, 9)], 1e-12, 0.5, 1.0, np.ones((2, 3)), np.eye(2)),
}

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- round trips
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


@FAST
@given(heads())
def test_head_round_trip(head: HeadUpdate) -> None:
    raw = encode_head(head)
    back = decode_head(raw)
    assert back == head  # bitwise on floats (NaN payloads and -0.0 included)
    assert encode_head(back) == raw
    j = head_to_json(back)
    assert (j["head_id"], j["version"], j["mode"], j["digest"], j["n_retained"]) == (
        head.head_id, head.version, head.mode, head.digest, head.n_retained,
    )
    assert len(j["weights"]) == head.d and all(len(row) == head.c for row in j["weights"])


def test_head_to_json_values() -> None:
    w = np.arange(6, dtype=np.float64).reshape(3, 2)
    h = HeadUpdate("h", 3, "exact", "0" * 64, 10, 12, [(1, 5), (0, 7)], 0.0, 1.0, 1.5, w, np.eye(3))
    j = head_to_json(h)
    assert j["weights"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert j["offsets"] == [[0, 7], [1, 5]] and j["has_posterior"] and "posterior" not in j
    assert head_to_json(h, include_posterior=True)["posterior"] == np.eye(3).tolist()


# --------------------------------------------------------------------------- corruption
def _reframe(raw: bytes, body: bytes | None = None, version: int | None = None, flags: int | None = None) -> bytes:
    """A message with the given changes and a *valid* length and CRC: tests the structural
    checks behind the checksum (what a buggy or hostile encoder could send)."""
    magic, v, f, _ = PREFIX.unpack_from(raw, 0)
    body = raw[PREFIX.size : -4] if body is None else body
    head = PREFIX.pack(magic, v if version is None else version, f if flags is None else flags,
                       PREFIX.size + len(body) + 4)
    return head + body + struct.pack("<I", crc32c(head + body))


@pytest.mark.parametrize("kind", sorted(CODECS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_truncation_and_bit_flips_raise_codec_error(kind: str, data: st.DataObject) -> None:
    strategy, encode, decode = CODECS[kind]
    raw = encode(data.draw(strategy))
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(CodecError):
        decode(raw[:cut])
    with pytest.raises(CodecError):
        decode(raw + data.draw(st.binary(min_size=1, max_size=9)))
    flipped = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) * 8 - 1))
        flipped[i // 8] ^= 1 << (i % 8)
    if bytes(flipped) != raw:
        with pytest.raises(CodecError):
            decode(bytes(flipped))


@pytest.mark.parametrize("kind", sorted(CODECS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_structurally_wrong_bodies_with_valid_crc_never_decode_wrongly(kind: str, data: st.DataObject) -> None:
    """Behind a valid checksum, garbage must raise CodecError, and anything accepted must be
    exactly what the encoder produces for the decoded value (no silently different decode)."""
    strategy, encode, decode = CODECS[kind]
    raw = encode(data.draw(strategy))
    body = bytearray(raw[PREFIX.size : -4])
    op = data.draw(st.sampled_from(["flip", "cut", "insert", "overwrite"]))
    if op == "flip" and body:
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] ^= data.draw(st.integers(1, 255))
    elif op == "cut" and body:
        i = data.draw(st.integers(0, len(body) - 1))
        del body[i : i + data.draw(st.integers(1, 16))]
    elif op == "insert":
        i = data.draw(st.integers(0, len(body)))
        body[i:i] = data.draw(st.binary(min_size=1, max_size=16))
    elif body:
        i = data.draw(st.integers(0, len(body) - 1))
        chunk = data.draw(st.binary(min_size=1, max_size=8))
        body[i : i + len(chunk)] = chunk
    msg = _reframe(raw, bytes(body))
    try:
        value = decode(msg)
    except CodecError:
        return
    assert encode(value) == msg


@pytest.mark.parametrize("kind", sorted(CODECS))
def test_unknown_version_flags_and_magic(kind: str) -> None:
    _strategy, encode, decode = CODECS[kind]
    raw = encode(SAMPLES[kind])
    with pytest.raises(CodecError, match="unknown version 9"):
        decode(_reframe(raw, version=9))
    with pytest.raises(CodecError, match="unknown flags"):
        decode(_reframe(raw, flags=0x8000))
    with pytest.raises(CodecError, match="bad magic"):
        decode(b"XXXX" + raw[4:])
    with pytest.raises(CodecError, match="truncated"):
        decode(raw[:10])
    with pytest.raises(CodecError, match="expected bytes"):
        decode("not bytes")  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        decode(b"")


def test_inconsistent_lengths_behind_valid_crc() -> None:
    q = np.arange(6, dtype=np.int64).reshape(2, 3)
    delta = Delta("h", "f", 3, 30, 0, [RowsEntry(1, ["e1", "e2"], ["s1", "s2"], ["u", "u"], np.array([0, 1]), q)])
    raw = encode_delta(delta)
    body = raw[PREFIX.size : -4]
    # the header's d (u32 right after the two ids): claim d = 4 -> q runs past the end
    off = 2 + 1 + 2 + 1
    bad = body[:off] + struct.pack("<I", 4) + body[off + 4 :]
    with pytest.raises(CodecError, match="needs"):
        decode_delta(_reframe(raw, bad))
    # a huge entry count must not allocate or loop forever
    bad = body[: off + 8] + struct.pack("<I", 2**32 - 1) + body[off + 12 :]
    with pytest.raises(CodecError):
        decode_delta(_reframe(raw, bad))


# --------------------------------------------------------------------------- encoder checks
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
        decode_delta(_reframe(raw, bytes(body)))


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
        decode_delta(_reframe(raw, bytes(body)))
    with pytest.raises(CodecError, match="by_subject"):  # only deletes leave tombstones
        encode_delta(Delta("h", "f", 2, 30, 0, [RowsEntry(1, ["e"], ["s"], ["u"], labels, q, [7], True)]))
    by_subject = encode_delta(Delta("h", "f", 2, 30, 0, [RowsEntry(-1, ["e"], ["s"], ["u"], labels, q, [7], True)]))
    assert decode_delta(by_subject).entries[0].by_subject
    body = bytearray(by_subject[PREFIX.size:-4])
    body[body.index(struct.pack("<BbHI", 1, -1, 2, 1)) + 1] = 1  # the same entry as an add: flag refused
    with pytest.raises(CodecError, match="unknown entry flags"):
        decode_delta(_reframe(by_subject, bytes(body)))
    for version in (2, 3):  # one version: nothing else was ever released
        with pytest.raises(CodecError, match=f"unknown version {version}"):
            decode_delta(_reframe(raw, version=version))


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


# --------------------------------------------------------------------------- the retained-rows hash fields
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
        decode_delta(_reframe(raw_new, bytes(body)))
    rows = Delta("h", "f", 2, 30, 0, [RowsEntry(1, ["e"], ["s"], ["u"], np.array([5]), np.array([[1, -2]]))])
    rbody = bytearray(encode_delta(rows)[PREFIX.size:-4])
    rbody[rbody.index(struct.pack("<BbHI", 1, 1, 0, 1)) + 2] = 1
    with pytest.raises(CodecError, match="unknown entry flags"):
        decode_delta(_reframe(encode_delta(new), bytes(rbody)))


def test_head_retained_hash_is_flag_bit_1_after_the_fixed_fields() -> None:
    """The fingerprint is optional (flag bit 1): 32 raw bytes right after the fixed fields; a head
    update without it is byte-identical to what older encoders wrote."""
    base = HeadUpdate("h", 7, "fast", "ab" * 32, 2, 3, [(0, 9)], 1e-12, 0.5, 1.0, np.ones((2, 3)))
    with_hash = HeadUpdate(**{**{f: getattr(base, f) for f in HeadUpdate.__slots__}, "retained_hash": "cd" * 32})
    raw, raw_h = encode_head(base), encode_head(with_hash)
    assert struct.unpack_from("<H", raw, 6) == (0,) and struct.unpack_from("<H", raw_h, 6) == (2,)
    assert decode_head(raw).retained_hash is None and decode_head(raw_h) == with_hash
    fixed_end = PREFIX.size + 3 + struct.calcsize("<QB7s32sQQdddIII")
    assert raw_h[fixed_end:fixed_end + 32] == bytes.fromhex("cd" * 32)
    assert raw_h[:fixed_end] == raw[:6] + b"\x02\x00" + struct.pack("<Q", len(raw_h)) + raw[16:fixed_end]
    assert raw_h[fixed_end + 32:-4] == raw[fixed_end:-4]
    assert head_to_json(with_hash)["retained_hash"] == "cd" * 32 and head_to_json(base)["retained_hash"] is None


def test_a_fast_head_update_without_a_digest_is_flag_bit_2() -> None:
    """The digest is optional on fast updates (flag bit 2, "no digest": a negative flag, so every
    update written before it still decodes with its digest); the 32 bytes stay, zero, so every
    later field keeps its offset. Exact updates always carry one."""
    base = HeadUpdate("h", 7, "fast", "ab" * 32, 2, 3, [(0, 9)], 1e-12, 0.5, 1.0, np.ones((2, 3)))
    fields = {f: getattr(base, f) for f in HeadUpdate.__slots__}
    bare = HeadUpdate(**{**fields, "digest": None, "retained_hash": "cd" * 32})
    raw, raw_bare = encode_head(base), encode_head(bare)
    assert struct.unpack_from("<H", raw, 6) == (0,) and struct.unpack_from("<H", raw_bare, 6) == (6,)
    assert decode_head(raw).digest == "ab" * 32 and decode_head(raw_bare) == bare
    digest_at = PREFIX.size + 3 + struct.calcsize("<QB7s")
    assert raw_bare[digest_at:digest_at + 32] == bytes(32) and len(raw_bare) == len(raw) + 32
    assert head_to_json(bare)["digest"] is None and head_to_json(bare)["retained_hash"] == "cd" * 32
    body = bytearray(raw_bare[PREFIX.size:-4])
    body[digest_at - PREFIX.size] = 1  # flag bit 2 with digest bytes that are not zero
    with pytest.raises(CodecError, match="must be 0"):
        decode_head(_reframe(raw_bare, bytes(body)))
    exact = encode_head(HeadUpdate(**{**fields, "mode": "exact", "digest": "00" * 32}))
    with pytest.raises(CodecError, match="fast updates only"):  # an exact update claiming no digest
        decode_head(_reframe(exact, flags=4))


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
            decode_delta(_reframe(raw, bytes(bad)))
    with pytest.raises(CodecError, match="unknown flags"):
        decode_delta(_reframe(raw, flags=0x0002))


def test_head_contract_version_is_flag_bit_3_after_the_retained_hash() -> None:
    """The contract version is optional (flag bit 3): a u64 right after the retained hash; a head
    update without it is byte-identical to what older encoders wrote."""
    base = HeadUpdate("h", 7, "fast", "ab" * 32, 2, 3, [(0, 9)], 1e-12, 0.5, 1.0, np.ones((2, 3)),
                      retained_hash="cd" * 32)
    fields = {f: getattr(base, f) for f in HeadUpdate.__slots__}
    named = HeadUpdate(**{**fields, "contract_version": 4})
    raw, raw_c = encode_head(base), encode_head(named)
    assert struct.unpack_from("<H", raw, 6) == (2,) and struct.unpack_from("<H", raw_c, 6) == (10,)
    assert decode_head(raw).contract_version is None and decode_head(raw_c) == named
    at = PREFIX.size + 3 + struct.calcsize("<QB7s32sQQdddIII") + 32
    assert raw_c[at:at + 8] == struct.pack("<Q", 4) and len(raw_c) == len(raw) + 8
    assert head_to_json(named)["contract_version"] == 4 and head_to_json(base)["contract_version"] is None
    with pytest.raises(CodecError, match="contract_version"):
        encode_head(HeadUpdate(**{**fields, "contract_version": 0}))
    body = bytearray(raw_c[PREFIX.size:-4])
    body[at - PREFIX.size:at - PREFIX.size + 8] = bytes(8)
    with pytest.raises(CodecError, match="contract_version"):
        decode_head(_reframe(raw_c, bytes(body)))


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


def test_head_retained_classes_are_flag_bit_4_after_the_contract_version() -> None:
    """The retained-classes bitmap is optional (flag bit 4): ceil(c / 8) bytes right after the
    contract version, bit j % 8 (least significant first) of byte j // 8 for class j; a head
    update without it is byte-identical to what encoders before it wrote."""
    base = HeadUpdate("h", 7, "fast", None, 5, 3, [(0, 9)], 1e-12, 0.5, 1.0, np.ones((2, 11)),
                      retained_hash="cd" * 32, contract_version=4)
    fields = {f: getattr(base, f) for f in HeadUpdate.__slots__}
    mask = np.zeros(11, dtype=bool)
    mask[[0, 2, 9]] = True
    marked = HeadUpdate(**{**fields, "retained_classes": mask})
    raw, raw_m = encode_head(base), encode_head(marked)
    assert struct.unpack_from("<H", raw, 6) == (14,) and struct.unpack_from("<H", raw_m, 6) == (30,)
    back = decode_head(raw_m)
    assert back == marked and back.retained_classes is not None and not back.retained_classes.flags.writeable
    assert decode_head(raw).retained_classes is None and back != decode_head(raw)
    at = PREFIX.size + 3 + struct.calcsize("<QB7s32sQQdddIII") + 32 + 8
    assert raw_m[at:at + 2] == bytes([0b00000101, 0b00000010])
    assert raw_m[PREFIX.size:at] == raw[PREFIX.size:at]  # every field before it in place
    assert raw_m[at + 2:at + 6] == raw[at:at + 4] == struct.pack("<i", 0)  # then the partitions (pad8 follows)
    assert head_to_json(marked)["retained_classes"] == [0, 2, 9] and head_to_json(base)["retained_classes"] is None
    # malformed: the encoder refuses, and so does the decoder for the same bytes written by hand
    for bad, match in ((np.ones(10, dtype=bool), "shape"), (mask.astype(np.int64), "bool"),
                       (np.ones(11, dtype=bool), "more than n_retained")):
        with pytest.raises(CodecError, match=match):
            encode_head(HeadUpdate(**{**fields, "retained_classes": bad}))
    body = bytearray(raw_m[PREFIX.size:-4])
    for patch, match in ((bytes([5, 0b00001010]), "past class 10"), (bytes([0xFF, 0]), "more than n_retained")):
        bad_body = bytearray(body)
        bad_body[at - PREFIX.size:at - PREFIX.size + 2] = patch
        with pytest.raises(CodecError, match=match):
            decode_head(_reframe(raw_m, bytes(bad_body)))
    with pytest.raises(CodecError):  # the bitmap cut short: every later field shifts, the body ends early
        decode_head(_reframe(raw_m, bytes(body[:at - PREFIX.size + 1])))
    empty = HeadUpdate(**{**fields, "weights": np.ones((2, 0)), "retained_classes": np.zeros(0, dtype=bool)})
    assert decode_head(encode_head(empty)) == empty  # c = 0: no bitmap bytes at all
