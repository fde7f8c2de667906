"""Binary ``heads`` messages: round trips, ``head_to_json``, and the optional fields behind flag
bits 1 to 5 (retained hash, no digest, contract version, retained classes, weight columns)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given

from tests.schemas.codec_support import FAST, heads, reframe
from unlearn.schemas import (
    CodecError,
    HeadUpdate,
    decode_head,
    encode_head,
    head_to_json,
)
from unlearn.schemas.binary_frame import PREFIX


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
        decode_head(reframe(raw_bare, bytes(body)))
    exact = encode_head(HeadUpdate(**{**fields, "mode": "exact", "digest": "00" * 32}))
    with pytest.raises(CodecError, match="fast updates only"):  # an exact update claiming no digest
        decode_head(reframe(exact, flags=4))


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
        decode_head(reframe(raw_c, bytes(body)))


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
            decode_head(reframe(raw_m, bytes(bad_body)))
    with pytest.raises(CodecError):  # the bitmap cut short: every later field shifts, the body ends early
        decode_head(reframe(raw_m, bytes(body[:at - PREFIX.size + 1])))
    empty = HeadUpdate(**{**fields, "weights": np.ones((2, 0)), "retained_classes": np.zeros(0, dtype=bool)})
    assert decode_head(encode_head(empty)) == empty  # c = 0: no bitmap bytes at all


def test_all_zero_weight_columns_are_left_out_behind_flag_bit_5() -> None:
    """W's columns that are all +0.0 (an auto-created head's classes without data) are left out:
    a column bitmap (flag bit 5) follows the retained classes and W holds the marked columns only.
    Decoding gives W back bit for bit; a -0.0 or NaN keeps its column; with nothing to leave out,
    or ``sparse=False``, the bytes are the plain layout of every encoder before it."""
    w = np.zeros((3, 11))
    w[:, 1] = [1.0, -2.0, 3.5]
    w[2, 4] = -0.0  # bitwise not +0.0: kept
    w[0, 9] = np.nan
    mask = np.zeros(11, dtype=bool)
    mask[[1, 9]] = True
    base = HeadUpdate("h", 7, "fast", None, 5, 3, [(0, 9)], 1e-12, 0.5, 1.0, w, retained_hash="cd" * 32,
                      contract_version=4, retained_classes=mask)
    raw, plain = encode_head(base), encode_head(base, sparse=False)
    assert struct.unpack_from("<H", raw, 6) == (0x3E,) and struct.unpack_from("<H", plain, 6) == (0x1E,)
    back = decode_head(raw)
    assert back == base == decode_head(plain)
    assert back.weights.tobytes() == w.tobytes()  # -0.0 and the NaN payload included
    at = PREFIX.size + 3 + struct.calcsize("<QB7s32sQQdddIII") + 32 + 8 + 2
    assert raw[at:at + 2] == bytes([0b00010010, 0b00000010])  # columns 1, 4 and 9
    assert len(plain) - len(raw) == 8 * 3 * 8  # eight columns of three rows out; the bitmap took two pad bytes
    assert raw[PREFIX.size + 2:at] == plain[PREFIX.size + 2:at]  # every field before it in place
    full = HeadUpdate(**{**{f: getattr(base, f) for f in HeadUpdate.__slots__}, "weights": np.ones((3, 11))})
    assert encode_head(full) == encode_head(full, sparse=False)  # no column to leave out: the plain layout
    zero = HeadUpdate(**{**{f: getattr(base, f) for f in HeadUpdate.__slots__}, "weights": np.zeros((3, 11)),
                         "retained_classes": None})
    raw_zero = encode_head(zero)
    assert decode_head(raw_zero) == zero and len(raw_zero) < len(encode_head(zero, sparse=False)) - 3 * 11 * 8 + 8
    body = bytearray(raw[PREFIX.size:-4])
    bad = bytearray(body)
    bad[at - PREFIX.size + 1] |= 0b00001000  # column 11 of 11
    with pytest.raises(CodecError, match="past column 10"):
        decode_head(reframe(raw, bytes(bad)))
    more = bytearray(body)
    more[at - PREFIX.size] |= 0b00000001  # a fourth column marked: W is 3 x 4, the message holds 3 x 3
    with pytest.raises(CodecError, match="weights"):
        decode_head(reframe(raw, bytes(more)))
    with pytest.raises(CodecError, match="unknown flags"):
        decode_head(reframe(raw, flags=0x7E))


def test_a_sparse_update_may_not_claim_a_huge_w() -> None:
    """A short message must not make a reader allocate a huge W: with flag bit 5, d x c is at most
    SPARSE_MAX_VALUES (a larger W is written in full, which the message size limit bounds)."""
    from unlearn.schemas.head import SPARSE_MAX_VALUES

    big = HeadUpdate("h", 1, "fast", None, 0, 0, [], 0.0, 1.0, 0.0, np.zeros((1, SPARSE_MAX_VALUES + 1)))
    raw = encode_head(big)
    assert struct.unpack_from("<H", raw, 6) == (4,)  # written in full: no bit 5
    small = encode_head(HeadUpdate("h", 1, "fast", None, 0, 0, [], 0.0, 1.0, 0.0, np.zeros((1, 8))))
    assert struct.unpack_from("<H", small, 6) == (0x24,)
    d_at = PREFIX.size + 3 + struct.calcsize("<QB7s32sQQddd")
    body = bytearray(small[PREFIX.size:-4])
    body[d_at - PREFIX.size:d_at - PREFIX.size + 4] = struct.pack("<I", 2**31)  # d x 8 columns: 2^34 values
    with pytest.raises(CodecError, match="exceed"):
        decode_head(reframe(small, bytes(body)))
