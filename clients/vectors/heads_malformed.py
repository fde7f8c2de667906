"""heads_malformed.json: ULHD messages the Python decoder refuses, each with the check that
refuses it, so the Java decoder refuses the same bytes for the same reason."""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from clients.vectors.heads import with_classes
from clients.vectors.json_bytes import b64
from unlearn.schemas.binary_frame import CodecError, crc32c
from unlearn.schemas.head import HeadUpdate, decode_head, encode_head


def rehash(msg: bytes | bytearray) -> bytes:
    """``msg`` with its trailing CRC32C recomputed (a mutation that must fail a later check)."""
    m = bytearray(msg)
    m[-4:] = struct.pack("<I", crc32c(bytes(m[:-4])))
    return bytes(m)


def _patch(msg: bytes, offset: int, new: bytes, crc: bool = True) -> bytes:
    m = bytearray(msg)
    m[offset:offset + len(new)] = new
    return rehash(m) if crc else bytes(m)


def _set_total(msg: bytes) -> bytes:
    m = bytearray(msg)
    m[8:16] = struct.pack("<Q", len(m))
    return rehash(m)


def gen_malformed() -> dict[str, Any]:
    """Bytes the Python decoder refuses, each with the check that refuses it ('kind', a word the
    Java exception message must contain too) and Python's own message."""
    rng = np.random.default_rng(7)
    base = HeadUpdate("hd", 9, "fast", rng.bytes(32).hex(), 3, 4, [(0, 1), (1, 2)], 0.0, 1.0, 2.0,
                      rng.standard_normal((3, 2)), None, rng.bytes(32).hex(), 3)
    ok = encode_head(base)
    exact = encode_head(HeadUpdate("hd", 9, "exact", rng.bytes(32).hex(), 3, 4, [(0, 1)], 0.0, 1.0, 2.0,
                                   np.ones((2, 2))))
    # body offsets (from message start): head_id str16 at 16 ("hd": 4 bytes) -> fixed block at 20
    fixed = 20
    version_off, mode_off, reserved_off, digest_off = fixed, fixed + 8, fixed + 9, fixed + 16
    nret_off = digest_off + 32
    ts_off = nret_off + 16
    drift_off, gamma_off = ts_off + 8, ts_off + 16
    d_off, c_off, noff_off = gamma_off + 8, gamma_off + 12, gamma_off + 16
    after = noff_off + 4  # retained hash (32), contract version (8), partitions, pad, offsets, pad, W
    cv_off = after + 32
    parts_off = cv_off + 8
    cases: list[tuple[str, str, bytes]] = [
        ("empty", "truncated", b""),
        ("short_prefix", "truncated", ok[:19]),
        ("bad_magic", "magic", b"ULDT" + ok[4:]),
        ("cut_last_byte", "truncated", ok[:-1]),
        ("cut_half", "truncated", ok[: len(ok) // 2]),
        ("trailing_byte", "trailing", ok + b"\x00"),
        ("flipped_body_bit", "checksum", _patch(ok, 40, bytes([ok[40] ^ 0x01]), crc=False)),
        ("flipped_crc", "checksum", ok[:-1] + bytes([ok[-1] ^ 0x80])),
        ("unknown_version_2", "unknown version", _patch(ok, 4, struct.pack("<H", 2))),
        ("unknown_version_0", "unknown version", _patch(ok, 4, struct.pack("<H", 0))),
        ("forged_flag_bit6", "unknown flags", _patch(ok, 6, struct.pack("<H", 0x004A))),
        ("forged_flag_bit15", "unknown flags", _patch(ok, 6, struct.pack("<H", 0x800A))),
        ("no_digest_on_exact", "no digest", _patch(exact, 6, struct.pack("<H", 0x0004))),
        ("no_digest_nonzero_bytes", "no digest", _patch(ok, 6, struct.pack("<H", 0x000E))),
        ("reserved_nonzero", "reserved", _patch(ok, reserved_off + 3, b"\x01")),
        ("unknown_mode", "mode", _patch(ok, mode_off, b"\x02")),
        ("empty_head_id", "head_id", rehash(_set_total(ok[:16] + b"\x00\x00" + ok[20:]))),
        ("head_id_bad_char", "head_id", _patch(ok, 18, b"h/")),
        ("head_id_not_utf8", "head_id", _patch(ok, 18, b"\xff\xfe")),
        ("gamma_zero", "gamma", _patch(ok, gamma_off, struct.pack("<d", 0.0))),
        ("gamma_nan", "gamma", _patch(ok, gamma_off, struct.pack("<d", math.nan))),
        ("drift_negative", "drift", _patch(ok, drift_off, struct.pack("<d", -1.0))),
        ("created_ts_inf", "created_ts", _patch(ok, ts_off, struct.pack("<d", math.inf))),
        ("d_zero", "d must be", _patch(ok, d_off, struct.pack("<I", 0))),
        ("oversize_d_c", "weights", _patch(ok, d_off, struct.pack("<II", 0xFFFFFFFF, 0xFFFFFFFF))),
        ("oversize_d_posterior", "weights", _patch(ok, d_off, struct.pack("<I", 0x7FFFFFFF))),
        ("oversize_n_offsets", "offset", _patch(ok, noff_off, struct.pack("<I", 0xFFFFFFFF))),
        ("partitions_not_increasing", "offsets", _patch(ok, parts_off, struct.pack("<ii", 1, 1))),
        ("partition_negative", "offset", _patch(ok, parts_off, struct.pack("<i", -1))),
        ("offset_negative", "offset", _patch(ok, parts_off + 8, struct.pack("<q", -5))),
        ("contract_version_zero", "contract_version", _patch(ok, cv_off, struct.pack("<Q", 0))),
        ("contract_version_too_big", "contract_version", _patch(ok, cv_off, struct.pack("<Q", 2**63))),
        ("version_field_only_cut", "truncated", ok[:version_off]),
        ("c_grows_past_end", "weights", _patch(ok, c_off, struct.pack("<I", 3))),
        ("c_shrinks_leaves_bytes", "unexpected bytes", _patch(ok, c_off, struct.pack("<I", 1))),
    ]
    # non-zero padding: W starts 8-aligned after the offsets; a 1-offset message has 4 pad bytes
    one = encode_head(HeadUpdate("hd", 9, "fast", None, 3, 4, [(0, 1)], 0.0, 1.0, 2.0, np.ones((1, 1))))
    pad_at = 16 + 4 + 8 + 1 + 7 + 32 + 8 + 8 + 8 + 8 + 8 + 12 + 4  # after the one i32 partition
    assert pad_at % 8 == 4 and one[pad_at:pad_at + 4] == bytes(4)
    cases.append(("nonzero_padding", "padding", _patch(one, pad_at, b"\x00\x00\x01\x00")))
    with_post = encode_head(HeadUpdate("hd", 9, "exact", "ab" * 32, 3, 4, [], 0.0, 1.0, 2.0, np.ones((2, 1)),
                                       np.eye(2)))
    cases.append(("posterior_cut", "posterior", rehash(_set_total(with_post[:-12] + bytes(4)))))
    cases.append(("posterior_flag_without_matrix", "posterior",
                  _patch(encode_head(HeadUpdate("hd", 9, "exact", "ab" * 32, 3, 4, [], 0.0, 1.0, 2.0,
                                                np.ones((2, 1)))), 6, struct.pack("<H", 0x0001))))
    cases.append(("hash_flag_without_hash", "padding",
                  _patch(exact, 6, struct.pack("<H", 0x0002))))
    cls = encode_head(with_classes(HeadUpdate("hd", 9, "fast", None, 1, 4, [], 0.0, 1.0, 2.0, np.ones((1, 3))),
                                   [True, False, False]))
    at = 16 + 4 + 8 + 1 + 7 + 32 + 8 + 8 + 8 + 8 + 8 + 12  # the bitmap (no hash, no contract)
    assert cls[at] == 1
    cases.append(("classes_bit_past_c", "retained_classes", _patch(cls, at, b"\x09")))
    cases.append(("classes_more_than_retained", "retained_classes", _patch(cls, at, b"\x03")))
    cols = encode_head(HeadUpdate("hd", 9, "fast", None, 1, 4, [], 0.0, 1.0, 2.0, np.array([[0.0, 2.0, 0.0]])))
    assert struct.unpack_from("<H", cols, 6)[0] == 0x0024 and cols[at] == 0b010  # the column bitmap at `at`
    cases.append(("columns_bit_past_c", "weight_columns", _patch(cols, at, b"\x0a")))
    cases.append(("columns_more_than_sent", "weights", _patch(cols, at, b"\x03")))
    cases.append(("columns_huge_w", "exceed", _patch(cols, d_off, struct.pack("<I", 0x01000000))))
    two = encode_head(HeadUpdate("hd", 9, "fast", None, 1, 4, [], 0.0, 1.0, 2.0, np.array([[0.0, 2.0, 3.0]])))
    assert two[at] == 0b110 and two[-12:-4] == struct.pack("<d", 3.0)
    cases.append(("columns_mark_every_column", "every column",
                  rehash(_set_total(_patch(two, at, b"\x07")[:-4] + struct.pack("<d", 0.0) + bytes(4)))))
    cases.append(("columns_mark_a_zero_column", "+0.0", _patch(two, len(two) - 12, struct.pack("<d", 0.0))))
    out = []
    for name, kind, msg in cases:
        try:
            decode_head(msg)
        except CodecError as exc:
            out.append({"name": name, "kind": kind, "python_error": str(exc), "message": b64(msg)})
            continue
        raise AssertionError(f"malformed head case {name} decoded")
    return {"about": "ULHD messages the Python decoder refuses with CodecError: the Java decoder must throw "
                     "its CodecException, whose message contains 'kind' (case-insensitive)", "cases": out}
