"""The ledger's canonical encodings (ledger/ledger_encoding.py): blob round trips and refusals, and the
digest against an independent encoding with Python integers."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ledger.test_exact_ledger import label_kinds, random_labels, random_rows, reference_ints
from unlearn.ledger import ExactLedger, LedgerError, wide
from unlearn.ledger.ledger_encoding import DIGEST_DOMAIN, ledger_buffers, shifted, upper_limbs

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 10), n=st.integers(0, 30), kind=label_kinds,
       k_y=st.integers(0, 30))
def test_bytes_round_trip(seed: int, d: int, n: int, kind: str, k_y: int) -> None:
    rng = np.random.default_rng(seed)
    led = ExactLedger(d, 4, frac_bits=int(rng.integers(0, 31)), label_frac_bits=k_y)
    if n:
        led.add(random_rows(rng, n, d), random_labels(rng, n, kind, 4))
    back = ExactLedger.from_bytes(led.to_bytes())
    assert back.digest() == led.digest()
    assert np.array_equal(back.class_counts, led.class_counts)
    assert (back.gram_int() == led.gram_int()).all()
    assert back.to_bytes() == led.to_bytes()


def test_from_bytes_rejects_corruption_and_truncation() -> None:
    rng = np.random.default_rng(1)
    led = ExactLedger.from_rows(random_rows(rng, 10, 4), rng.integers(0, 3, 10))
    blob = led.to_bytes()
    with pytest.raises(LedgerError, match=r"truncated|bytes"):
        ExactLedger.from_bytes(blob[:-1])
    flipped = bytearray(blob)
    flipped[60] ^= 0x01
    with pytest.raises(LedgerError, match="checksum"):
        ExactLedger.from_bytes(bytes(flipped))
    wrong_version = bytearray(blob)
    wrong_version[4] = 9
    with pytest.raises(LedgerError, match="version"):
        ExactLedger.from_bytes(bytes(wrong_version))
    with pytest.raises(LedgerError, match="magic"):
        ExactLedger.from_bytes(b"XXXX" + blob[4:])


def test_digest_encoding_is_the_documented_one() -> None:
    """Recompute the digest from Python ints with struct/int.to_bytes, as an outside auditor would."""
    import hashlib
    import struct

    rng = np.random.default_rng(7)
    d, c, n = 5, 3, 12
    Q = random_rows(rng, n, d)
    y = rng.integers(0, c, n)
    led = ExactLedger.from_rows(Q, y, n_outputs=c, label_frac_bits=2)
    S, G = reference_ints(Q, y, c, "class", 2)
    h = hashlib.sha256(b"unlearn.ledger/v1\x00" + struct.pack("<qqqqq", d, c, 30, 2, n))
    for i in range(d):
        for j in range(i, d):
            h.update(int(S[i, j]).to_bytes(16, "little", signed=True))
    for i in range(d):
        for m in range(c):
            h.update(int(G[i, m]).to_bytes(16, "little", signed=True))
    assert led.digest() == h.hexdigest()


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.sampled_from([1, 2, 31, 32, 33, 65, 97]), n=st.integers(1, 40))
def test_digest_in_row_blocks_hashes_the_same_bytes(seed: int, d: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    led = ExactLedger.from_rows(rng.integers(-(1 << 30), (1 << 30) + 1, size=(n, d)), rng.integers(0, 3, n),
                                n_outputs=3)
    h = hashlib.sha256(DIGEST_DOMAIN)
    h.update(struct.pack("<qqqqq", d, 3, led.frac_bits, led.label_frac_bits, n))
    up = upper_limbs(led.parts().gram)  # the whole triangle in one encoding, as before
    h.update(wide.to_le_bytes(wide.combine([(up[0], 30), (up[1], 15), (up[2], 0)])))
    h.update(wide.to_le_bytes(wide.combine(shifted(led.parts().moments))))
    assert led.digest() == h.hexdigest()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 9), c=st.integers(0, 4), n=st.integers(0, 20))
def test_blob_layout_is_the_documented_one(seed: int, d: int, c: int, n: int) -> None:
    """The blob from Python ints with struct, entry by entry as the docstring lays it out, against
    ``to_bytes`` (which joins the ledger's own arrays without copying them first) and the buffers
    it joins."""
    rng = np.random.default_rng(seed)
    led = ExactLedger(d, c, label_frac_bits=int(rng.integers(0, 31)))
    if n and c:
        led.add(random_rows(rng, n, d), rng.integers(0, c, n))
    p = led.parts()
    out = [struct.pack("<4sHqqqqq", b"ULDG", 1, d, c, p.frac_bits, p.label_frac_bits, p.retained)]
    out += [struct.pack("<q", int(v)) for v in p.class_counts]
    out += [struct.pack("<q", int(M[i, j])) for M in p.gram for i in range(d) for j in range(i, d)]
    out += [struct.pack("<q", int(M[i, m])) for M in p.moments for i in range(d) for m in range(c)]
    body = b"".join(out)
    assert led.to_bytes() == body + hashlib.sha256(body).digest() == b"".join(ledger_buffers(p))
