"""The frame shared by the binary codecs (deltas, heads): corruption, truncation and structurally
wrong bodies behind a valid CRC never decode into something wrong (they raise CodecError, and
nothing else)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.schemas.codec_support import CODECS, PLAIN, SAMPLES, reframe
from unlearn.schemas import (
    CodecError,
    Delta,
    RowsEntry,
    decode_delta,
    encode_delta,
)
from unlearn.schemas.binary_frame import PREFIX


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
    exactly what the encoder produces for the decoded value (no silently different decode): a
    head update in its sparse form (flag bit 5) or, where it predates it, written in full."""
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
    msg = reframe(raw, bytes(body))
    try:
        value = decode(msg)
    except CodecError:
        return
    assert encode(value) == msg or (kind in PLAIN and PLAIN[kind](value) == msg)


@pytest.mark.parametrize("kind", sorted(CODECS))
def test_unknown_version_flags_and_magic(kind: str) -> None:
    _strategy, encode, decode = CODECS[kind]
    raw = encode(SAMPLES[kind])
    with pytest.raises(CodecError, match="unknown version 9"):
        decode(reframe(raw, version=9))
    with pytest.raises(CodecError, match="unknown flags"):
        decode(reframe(raw, flags=0x8000))
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
        decode_delta(reframe(raw, bad))
    # a huge entry count must not allocate or loop forever
    bad = body[: off + 8] + struct.pack("<I", 2**32 - 1) + body[off + 12 :]
    with pytest.raises(CodecError):
        decode_delta(reframe(raw, bad))
