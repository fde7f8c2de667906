"""Shared by the codec tests (test_binary_frame, test_delta_codec, test_head): hypothesis
strategies for deltas and head updates, a sample of each, and :func:`reframe`."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from unlearn.schemas import (
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
from unlearn.schemas.delta_codec import SealedRowsEntry

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
    q_itemsize = draw(st.sampled_from([4, 8]))  # ROWS32 (|q| <= 2^30) or ROWS (any int64)
    q = draw(hnp.arrays(np.int64, (n, d), elements=_I64 if q_itemsize == 8 else st.integers(-(2**30), 2**30)))
    sign = draw(st.sampled_from([1, -1]))
    return RowsEntry(sign, *ids, labels, q, draw(_event_times(n)), sign < 0 and draw(st.booleans()), (), q_itemsize)


@st.composite
def _sealed(draw: st.DrawFn, d: int) -> SealedRowsEntry:
    """A sealed entry of either kind (q as i32, or the i64 rows of old topics): the codec does not
    open rows, so any bytes of the right size stand for them."""
    n = draw(st.integers(1, 4))
    ids = [draw(st.lists(_ids, min_size=n, max_size=n)) for _ in range(3)]
    c = draw(st.integers(0, 3))
    q_itemsize = draw(st.sampled_from([4, 8]))
    size = 28 + q_itemsize * d + 8 * max(c, 1)
    sign = draw(st.sampled_from([1, -1]))
    rows = [draw(st.binary(min_size=size, max_size=size)) for _ in range(n)]
    return SealedRowsEntry(sign, *ids, int(c > 0), c, [draw(st.binary(min_size=16, max_size=16)).hex()
                                                       for _ in range(n)],
                           [draw(st.binary(min_size=32, max_size=32)) for _ in range(n)], rows,
                           draw(_event_times(n)), sign < 0 and draw(st.booleans()), (), q_itemsize)


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
    entries = draw(st.lists(st.one_of(_rows(d), _packed(), _sealed(d)), max_size=3))
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

#: The other encoding a decoder accepts for the same value: a head update written in full
#: (``sparse=False``, and every update written before flag bit 5) where the default leaves
#: all-zero weight columns out.
PLAIN: dict[str, Callable[[Any], bytes]] = {"head": lambda h: encode_head(h, sparse=False)}

SAMPLES: dict[str, Any] = {
    "delta": Delta("h", "f", 2, 30, 8, [
        RowsEntry(1, ["e1", "e2"], ["s1", "s2"], ["u", "v"], np.array([[1], [2]]), np.array([[1, 2], [3, 4]])),
        PackedEntry(-1, ["e3"], ["s3"], ["u"], b"ledger"),
    ]),
    "head": HeadUpdate("h", 7, "fast", "ab" * 32, 2, 3, [(0, 9)], 1e-12, 0.5, 1.0, np.ones((2, 3)), np.eye(2)),
}

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reframe(raw: bytes, body: bytes | None = None, version: int | None = None, flags: int | None = None) -> bytes:
    """A message with the given changes and a *valid* length and CRC: tests the structural
    checks behind the checksum (what a buggy or hostile encoder could send)."""
    magic, v, f, _ = PREFIX.unpack_from(raw, 0)
    body = raw[PREFIX.size : -4] if body is None else body
    head = PREFIX.pack(magic, v if version is None else version, f if flags is None else flags,
                       PREFIX.size + len(body) + 4)
    return head + body + struct.pack("<I", crc32c(head + body))
