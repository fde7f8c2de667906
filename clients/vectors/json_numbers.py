"""json_numbers.json: orjson's spelling of float64 values, so the Java client writes the same
request bytes (and so the same signatures) as the Python one."""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import orjson


def gen_numbers() -> dict[str, Any]:
    """orjson's spelling of doubles (what encode_request writes for features, labels and ts)."""
    rng = np.random.default_rng(5)
    vals: list[float] = [0.0, -0.0, 1.0, -1.0, 0.1, 0.5, 3.0, 100.0, 1e-7, 1e-6, 1.234e-6, 1e-5, 1.5e-5, 9.99e-7,
                         0.0001, 0.001, 1e15, 1.2345e15, 9999999999999998.0, 1e16, 1.5e16, 1e21, 1e22, 1e100,
                         5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 1767225600.125, 2.5e-8,
                         12345678.9, 0.30000000000000004, 2.0**53, 2.0**53 + 2, 123456789012345680.0,
                         float(np.float32(0.1)), float(np.float32(1e-7)), 4.35, 0.3, 2.0**-1074 * 3,
                         1e23, 9.007199254740993e15, 5e-5, 4.9999999999999996e-5, 1e-4 * 3]
    vals += [float(v) for v in rng.standard_normal(300)]
    vals += [float(v) for v in rng.standard_normal(200) * 10.0 ** rng.integers(-30, 30, 200)]
    vals += [float(np.float32(v)) for v in rng.standard_normal(200)]
    vals += [float(v) for v in rng.integers(-10**6, 10**6, 50)]
    bits = rng.integers(0, 2**63 - 1, 200, dtype=np.int64)
    vals += [v for v in np.frombuffer(bits.tobytes(), "<f8").tolist() if math.isfinite(v)]
    cases = [{"bits": struct.pack(">d", v).hex(), "json": orjson.dumps(v).decode("ascii")} for v in vals]
    return {"about": "float64 (big-endian bits) -> orjson's JSON spelling (shortest round-trip digits; "
                     "fixed notation for 1e-5 <= |x| < 1e16 with '.0' on integers, else d.ddde[+-]x)",
            "cases": cases}
