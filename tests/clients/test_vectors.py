"""The shared client test vectors (clients/vectors/) are what the Python reference produces.

The Java client's tests read clients/vectors/*.json; this test regenerates every file with
clients/vectors/generate.py (the reference code on fixed inputs, keys and nonces) and requires
the committed bytes to be identical, so the vectors cannot drift from the reference: a change to
a format shows up here, and the committed files must be regenerated (and the Java client checked).

Identical, that is, on a CPU like the one that made them. numpy and OpenBLAS pick their kernels by
CPU, and a machine without AVX-512 renders some float64 values of the reference one ulp apart (a
posterior's inverse, predictions, the JSON-number floats: bench/results/pipeline_bench.md
section 34; a prediction that cancels to ~1e-3 moved by ~1e-15, thousands of its ulps). Where the
bytes differ, the files must still be the same in everything but floats, and every float (also
inside an encoded head update, a hex f64 array or a float's bits) within ``FLOAT_TOL`` of the
committed one, relative to max(1, |x|): a format change (float32 rounds at ~1e-8) still fails.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients.vectors.generate import FILES, render
from unlearn.schemas.head import decode_head

VECTORS = Path(__file__).resolve().parents[2] / "clients" / "vectors"


#: How far two renderings of one float may be apart, relative to max(1, |x|) (kernels of other CPUs).
FLOAT_TOL = 1e-12
#: The same for json_numbers.json's floats (their bits and their text), in units in the last place.
JSON_ULPS = 4


def _close(a: float, b: float) -> bool:
    """The same float64 value but for another CPU's rounding (module docstring); NaN equals NaN."""
    if a == b or (a != a and b != b):
        return True
    return abs(a - b) <= FLOAT_TOL * max(1.0, abs(a), abs(b))


def _ulps(a: float, b: float) -> int:
    """Distance of two float64 values in representable steps (0: the same bits)."""
    ia, ib = (struct.unpack("<q", struct.pack("<d", x))[0] for x in (a, b))
    ia, ib = (i if i >= 0 else -(1 << 63) - i for i in (ia, ib))  # the floats' order as integers
    return abs(ia - ib)


def _floats_close(a: Any, b: Any) -> bool:
    x, y = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return x.shape == y.shape and all(_close(float(p), float(q)) for p, q in zip(x, y))


def _head_fields(message: str) -> dict[str, Any]:
    h = decode_head(base64.b64decode(message))
    values = {f.name: getattr(h, f.name) for f in dataclasses.fields(h)}
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in values.items()}


def _same_string(key: str, a: str, b: str) -> bool:
    """Two renderings of one string field: equal, or the same floats in the forms the vectors
    carry them (an encoded head update, a hex f64 array, a float's bits, its JSON text)."""
    try:
        if key.endswith("_f64le"):
            return _floats_close(np.frombuffer(bytes.fromhex(a), "<f8"), np.frombuffer(bytes.fromhex(b), "<f8"))
        # json_numbers.json's floats span 1e-300..1e300 to test their text: a few ulps, not FLOAT_TOL
        if key == "bits":
            return _ulps(*(struct.unpack(">d", bytes.fromhex(x))[0] for x in (a, b))) <= JSON_ULPS
        if key == "json":
            return _ulps(float(a), float(b)) <= JSON_ULPS
        if key == "message":
            return _same(_head_fields(a), _head_fields(b))
    except (ValueError, TypeError, struct.error):
        return False
    return False


def _same(a: Any, b: Any, key: str = "") -> bool:
    """``a`` and ``b`` (parsed vectors) are equal but for floats within ``FLOAT_TOL``."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], k) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, key) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return _close(a, b)
    if isinstance(a, str) and isinstance(b, str) and a != b:
        return _same_string(key, a, b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name", FILES)
def test_committed_vectors_are_what_the_reference_generates(name: str) -> None:
    committed = (VECTORS / name).read_bytes()
    fresh = render(name)
    if fresh == committed:
        return
    # another CPU's kernels (module docstring): everything but floats identical, floats within FLOAT_TOL
    assert _same(json.loads(committed), json.loads(fresh)), (
        f"clients/vectors/{name} differs from what the Python reference generates now (beyond {FLOAT_TOL:g} in a "
        "float): run `.venv/bin/python clients/vectors/generate.py` and run the Java tests (`make java-test`)")


def test_the_float_tolerance_lets_no_other_change_through() -> None:
    """The comparison above, on the committed heads vector: a few ulps pass; a float rounded to
    float32, a changed head id, version, flag or list length do not."""
    heads = json.loads((VECTORS / "heads.json").read_text())
    case = next(c for c in heads["cases"] if "posterior_f64le" in c["expect"])
    hexed = case["expect"]["posterior_f64le"]
    post = np.frombuffer(bytes.fromhex(hexed), "<f8").copy()
    assert _same(heads, heads)
    bumped = post.view(np.int64).copy()
    bumped[0] += 3
    assert _same_string("posterior_f64le", hexed, bumped.view("<f8").tobytes().hex())
    as_f32 = post.astype(np.float32).astype(np.float64)
    assert not np.array_equal(as_f32, post)
    assert not _same_string("posterior_f64le", hexed, as_f32.tobytes().hex())
    raw = bytearray(base64.b64decode(case["message"]))
    fields = _head_fields(case["message"])
    at = raw.find(fields["head_id"].encode())
    raw[at] ^= 0x01  # the head id's first byte (its checksum no longer matches either: refused)
    assert not _same_string("message", case["message"], base64.b64encode(bytes(raw)).decode())
    assert not _same({"version": 12}, {"version": 13})
    assert not _same({"flags": "1"}, {"flags": "3"})
    assert _same_string("json", "-1.0650835950433682e-30", "-1.0650835950433684e-30")
    assert not _same_string("json", "-1.0650835950433682e-30", "0.0")
    assert not _same_string("bits", "b9b59a3aeeb0a521", "b9b59a3aeeb0a5ff")
    assert not _same([0.5], [0.5, 0.5])
    assert _same({"x": 0.1}, {"x": 0.1 + 2**-56})


def test_generation_is_deterministic() -> None:
    assert render("transit.json") == render("transit.json")
    assert render("predict.json") == render("predict.json")


def test_vectors_cover_every_head_flag() -> None:
    """Every flag bit the decoder knows appears in a valid vector, and every malformed kind is
    refused by the reference (the generator asserts that; here: the files say so)."""
    heads = json.loads((VECTORS / "heads.json").read_text())
    seen = 0
    for case in heads["cases"]:
        seen |= case["flags"]
    assert seen == 0x3F
    bad = json.loads((VECTORS / "heads_malformed.json").read_text())
    assert {c["kind"] for c in bad["cases"]} >= {"truncated", "checksum", "unknown version", "unknown flags",
                                                 "magic", "weights", "padding"}
