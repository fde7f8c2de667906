"""How the vectors carry bytes in JSON: base64 for messages, hex of the little-endian float64
bytes for arrays, so the Java tests compare them bit for bit."""

from __future__ import annotations

import base64

import numpy as np


def b64(b: bytes) -> str:
    """``b`` as base64 text (what JSON can carry)."""
    return base64.b64encode(b).decode("ascii")


def f64_hex(a: np.ndarray | None) -> str | None:
    """An array's little-endian float64 bytes as hex: compared bit for bit (NaN payloads, -0.0)."""
    return None if a is None else np.ascontiguousarray(a, "<f8").tobytes().hex()
