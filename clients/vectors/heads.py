"""heads.json: head updates of every kind the ULHD decoder accepts, with their decoded fields, so
the Java decoder is held to every flag combination and float bit pattern."""

from __future__ import annotations

import math
import struct
from dataclasses import replace
from typing import Any

import numpy as np

from clients.vectors.json_bytes import b64, f64_hex
from unlearn.schemas.head import HeadUpdate, decode_head, encode_head, head_to_json


def _hexd(rng: np.random.Generator) -> str:
    return rng.bytes(32).hex()


def with_classes(h: HeadUpdate, mask: list[bool]) -> HeadUpdate:
    """``h`` with a retained-classes bitmap (flag bit 4)."""
    return replace(h, retained_classes=np.asarray(mask, dtype=bool))


def head_cases() -> list[tuple[str, HeadUpdate]]:
    """Head updates of every kind the decoder accepts: each flag alone and together, both modes,
    no outputs, no offsets, extreme integers, non-finite and signed-zero weights."""
    rng = np.random.default_rng(22)

    def w(d: int, c: int) -> np.ndarray:
        return rng.standard_normal((d, c))

    def spd(d: int) -> np.ndarray:
        a = rng.standard_normal((d, d))
        return np.linalg.inv(a @ a.T + d * np.eye(d))

    odd = np.array([[math.nan, -0.0], [math.inf, -math.inf], [5e-324, 1.7976931348623157e308]])
    nan_payload = np.frombuffer(struct.pack("<Q", 0x7FF0000000000ABC), "<f8")[0]
    odd[0, 0] = nan_payload
    u64, i63 = 2**64 - 1, 2**63 - 1
    cases = [
        ("exact_posterior", HeadUpdate("fmnist", 12, "exact", _hexd(rng), 2999, 3012, [(0, 411), (1, 398)],
                                       0.0, 1.0, 1767225600.5, w(3, 2), spd(3))),
        ("exact_retained_hash", HeadUpdate("faces", 3, "exact", _hexd(rng), 10, 12, [(2, 5)], 0.25, 0.5,
                                           1767225601.0, w(2, 3), None, _hexd(rng))),
        ("fast_no_digest_hash_contract", HeadUpdate("faces", 4, "fast", None, 9, 13, [(2, 6)], 0.25, 0.5,
                                                    1767225601.25, w(2, 3), None, _hexd(rng), 2)),
        ("fast_with_digest", HeadUpdate("h", 7, "fast", _hexd(rng), 2, 3, [(0, 9)], 1e-12, 0.5, 1.0, w(4, 1))),
        ("exact_all_flags", HeadUpdate("emb.v2:a@b+c-d_e", 40, "exact", _hexd(rng), 100, 120,
                                       [(0, 1), (3, 7), (9, 100)], 0.125, 2.0, 1767225700.0, w(4, 3), spd(4),
                                       _hexd(rng), 7)),
        ("fast_no_digest_posterior", HeadUpdate("h2", 41, "fast", None, 5, 6, [(1, 2)], 0.0, 1.0, 0.0, w(2, 2),
                                                spd(2))),
        ("no_outputs", HeadUpdate("empty", 0, "exact", _hexd(rng), 0, 0, [], 0.0, 1.0, 0.0, np.zeros((5, 0)))),
        ("odd_floats", HeadUpdate("odd", 1, "fast", None, 1, 1, [(0, 0)], 0.0, 1.0, 0.0, odd)),
        ("extremes", HeadUpdate("x" * 128, u64, "exact", "ff" * 32, u64, u64, [(0, i63), (2**31 - 1, 0)],
                                1e300, 1e-300, 1e300, w(1, 1), np.ones((1, 1)), "00" * 32, i63)),
        ("contract_only", HeadUpdate("c1", 5, "exact", _hexd(rng), 3, 3, [(0, 2)], 0.0, 1.0, 5.0, w(3, 3),
                                     None, None, 1)),
    ]
    cases += [
        ("classes_partial", with_classes(HeadUpdate("cls", 6, "exact", _hexd(rng), 4, 4, [(0, 3)], 0.0, 1.0,
                                                    6.0, w(3, 4), spd(3), _hexd(rng), 1),
                                         [True, False, True, False])),
        ("classes_none_retained", with_classes(HeadUpdate("cls0", 7, "fast", None, 0, 5, [(0, 4)], 0.0, 1.0,
                                                          7.0, np.zeros((2, 3))), [False, False, False])),
        ("classes_nine", with_classes(HeadUpdate("cls9", 8, "fast", None, 20, 25, [(1, 8)], 0.0, 1.0, 8.0,
                                                 w(2, 9), None, None, 3),
                                      [True, True, False, True, False, False, True, False, True])),
        ("classes_zero_outputs", with_classes(HeadUpdate("cls-c0", 9, "exact", _hexd(rng), 0, 0, [], 0.0, 1.0,
                                                         0.0, np.zeros((2, 0))), [])),
    ]
    sparse = np.zeros((3, 10))  # an auto-created head's W: most columns all +0.0, left out (flag bit 5)
    sparse[:, [1, 8]] = w(3, 2)
    sparse[2, 4] = -0.0  # not +0.0: its column stays in the message
    cases += [
        ("columns_sparse", with_classes(HeadUpdate("auto", 10, "fast", None, 6, 8, [(0, 5)], 0.0, 1.0, 10.0,
                                                   sparse, None, _hexd(rng), 2),
                                        [False, True, False, False, False, False, False, False, True, False])),
        ("columns_sparse_posterior", HeadUpdate("auto2", 11, "exact", _hexd(rng), 6, 8, [(1, 5)], 0.0, 1.0, 11.0,
                                                sparse[:, :9], spd(3))),
        ("columns_all_zero", HeadUpdate("zero", 12, "fast", None, 0, 0, [(0, 0)], 0.0, 1.0, 12.0, np.zeros((2, 9)))),
    ]
    return cases


def head_expect(h: HeadUpdate) -> dict[str, Any]:
    """The decoded fields the Java decoder must reproduce: floats as bit patterns, so bits are compared."""
    j = head_to_json(h)
    for k in ("weights", "schema"):
        j.pop(k)
    j["drift_bits"] = struct.pack("<d", h.drift).hex()
    j["gamma_bits"] = struct.pack("<d", h.gamma).hex()
    j["created_ts_bits"] = struct.pack("<d", h.created_ts).hex()
    j["weights_f64le"] = f64_hex(h.weights)
    j["posterior_f64le"] = f64_hex(h.posterior)
    return j


def gen_heads() -> dict[str, Any]:
    """Every case encoded, decoded back (the round trip asserted) and written with its flags."""
    out = []
    for name, h in head_cases():
        msg = encode_head(h)
        got = decode_head(msg)
        assert got == h, name
        flags = struct.unpack_from("<H", msg, 6)[0]
        out.append({"name": name, "flags": flags, "message": b64(msg), "expect": head_expect(got)})
    return {"about": "ULHD head updates the Python decoder accepts (schemas/head.py): 'message' is the "
                     "base64 of the bytes; 'expect' the decoded fields (head_to_json without weights; floats "
                     "as little-endian bit patterns in hex)", "cases": out}
