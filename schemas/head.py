"""The head version: :class:`HeadUpdate` and its binary ``heads`` messages (its contract is in
``schemas/head_contract.py``, which classes it may predict in ``schemas/head_scores.py``).

Binary ``ULHD`` messages (docs/formats.md, "Heads"). The ``heads`` topic is compacted and
keyed by head id, so the latest message per key is the current head. Besides W (d x c float64) a
message carries the version (receipts point at the first version that excludes a deleted
sample), the delta offsets it covers (where to resume), and optionally: the ledger digest (so
anyone can check the head against a from-scratch ledger; exact updates always carry it, fast ones
need not, since it costs O(d^2): flag bit 2), the posterior matrix T = (S + gamma*I)^-1 (d x d)
for predictive variance, the fingerprint of the multiset hash of the retained rows
(docs/design.md section 6) when the head knows it, the version of the head contract the head was
built under (the one named by its latest delta: flag bit 3), which serving quantizes predict
inputs with, and, for a head of class-index labels, which class columns hold retained samples
(flag bit 4: a bitmap from the ledger's exact per-class counts). W's columns that are all +0.0
(an auto-created head has 100 class columns, of which a few hold data) are left out of the
message and named by a column bitmap (flag bit 5): a 768 x 100 W is 614 KB, its 10 live columns
61 KB. Same frame and robustness rules as the deltas (``schemas/binary_frame.py``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from unlearn.schemas.binary_frame import CodecError, Reader, Writer, check_frame
from unlearn.schemas.envelope import ID_CHARS, is_valid_id

__all__ = [
    "HEAD_MAGIC",
    "HEAD_VERSION",
    "MODES",
    "HeadUpdate",
    "decode_head",
    "encode_head",
    "head_to_json",
    "retained_class_list",
]

HEAD_MAGIC = b"ULHD"
HEAD_VERSION = 1
MODES: tuple[str, ...] = ("exact", "fast")
_FLAG_POSTERIOR = 0x0001
_FLAG_RETAINED_HASH = 0x0002
_FLAG_NO_DIGEST = 0x0004  # the update carries no ledger digest (its 32 bytes are zero)
_FLAG_CONTRACT = 0x0008  # the contract version (u64) follows the retained hash
_FLAG_CLASSES = 0x0010  # the retained-classes bitmap (ceil(c / 8) bytes) follows the contract version
_FLAG_COLUMNS = 0x0020  # the weight-columns bitmap (ceil(c / 8) bytes) follows; W holds those columns only
#: Most values (d x c) of a W written with flag bit 5: a short message must not make a reader
#: allocate more than 128 MiB (a larger W is written in full, under the message size limit).
SPARSE_MAX_VALUES = 1 << 24
_FLAGS = _FLAG_POSTERIOR | _FLAG_RETAINED_HASH | _FLAG_NO_DIGEST | _FLAG_CONTRACT | _FLAG_CLASSES | _FLAG_COLUMNS
_CONTRACT = struct.Struct("<Q")
_NO_DIGEST = bytes(32)

# version, mode, reserved[7], digest[32], n_retained, events_covered, created_ts, drift, gamma,
# d, c, n_offsets
_FIXED = struct.Struct("<QB7s32sQQdddIII")
_RESERVED = bytes(7)
_U64_MAX = 2**64 - 1


@dataclass(frozen=True, eq=False, slots=True)
class HeadUpdate:
    """One head version. ``weights`` is (d, c) float64; ``posterior`` (d, d) float64 or None.

    ``offsets``: (partition, offset) of the last ``deltas`` message applied, per partition,
    sorted by partition. ``digest``: hex SHA-256 of the canonical ledger (docs/design.md section 2),
    always on an exact update, None on a fast one that does not carry it. ``retained_hash``: hex
    fingerprint of the multiset hash of the retained rows (section 6), None when the head does not
    know it. ``contract_version``: the head contract version its latest delta was judged under
    (docs/registry.md), None for a head whose deltas name none. ``retained_classes``: bool (c,),
    True where the class column holds at least one retained sample (the ledger's exact per-class
    counts), for a head whose retained rows all have class-index labels; None for a head of target
    vectors, where every column is an output. A prediction names only classes marked True
    (:func:`score_rows`). Decoded arrays are read-only views into the message bytes.
    """

    head_id: str
    version: int
    mode: Literal["exact", "fast"]
    digest: str | None
    n_retained: int
    events_covered: int
    offsets: tuple[tuple[int, int], ...]
    drift: float
    gamma: float
    created_ts: float
    weights: np.ndarray
    posterior: np.ndarray | None = None
    retained_hash: str | None = None
    contract_version: int | None = None
    retained_classes: np.ndarray | None = None

    def __post_init__(self) -> None:
        offsets = tuple(sorted((int(p), int(o)) for p, o in self.offsets))
        object.__setattr__(self, "offsets", offsets)

    def supersedes(self, other: HeadUpdate | None) -> bool:
        """Is this update newer than ``other``? A higher version wins; at equal versions an exact
        update supersedes a fast one (a reset republishes the same ledger as exact). The one
        ordering of head updates every reader uses."""
        if other is None:
            return True
        return (self.version, self.mode == "exact") > (other.version, other.mode == "exact")

    @property
    def d(self) -> int:
        return int(self.weights.shape[0])

    @property
    def c(self) -> int:
        return int(self.weights.shape[1])

    def __eq__(self, other: object) -> bool:
        """Bitwise equality of the arrays (NaN == NaN, -0.0 != 0.0): a codec must preserve bits."""
        if not isinstance(other, HeadUpdate):
            return NotImplemented

        def same_bits(a: np.ndarray | None, b: np.ndarray | None) -> bool:
            if a is None or b is None:
                return a is b
            return a.shape == b.shape and np.ascontiguousarray(a, "<f8").tobytes() == np.ascontiguousarray(
                b, "<f8"
            ).tobytes()

        scalars = ("head_id", "version", "mode", "digest", "n_retained", "events_covered", "offsets",
                   "retained_hash", "contract_version")
        return (
            all(getattr(self, f) == getattr(other, f) for f in scalars)
            and struct.pack("<ddd", self.drift, self.gamma, self.created_ts)
            == struct.pack("<ddd", other.drift, other.gamma, other.created_ts)
            and same_bits(self.weights, other.weights)
            and same_bits(self.posterior, other.posterior)
            and _same_mask(self.retained_classes, other.retained_classes)
        )

    __hash__ = None  # type: ignore[assignment]


def _same_mask(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _classes_bitmap(mask: Any, c: int, n_retained: int) -> bytes:
    """The retained-classes bitmap of ``mask`` (bool (c,)): bit j % 8 of byte j // 8 is class j."""
    arr = np.asarray(mask)
    if arr.dtype != np.bool_ or arr.shape != (c,):
        raise CodecError(f"retained_classes must be a bool array of shape ({c},), got {arr.dtype} {arr.shape}")
    if int(arr.sum()) > n_retained:
        raise CodecError(f"retained_classes marks {int(arr.sum())} classes, more than n_retained={n_retained} samples")
    return _bitmap(arr)


def _read_classes(r: Reader, c: int, n_retained: int) -> np.ndarray:
    mask = _read_bitmap(r, c, "retained_classes", "class")
    if int(mask.sum()) > n_retained:
        raise r.fail(f"retained_classes marks {int(mask.sum())} classes, more than n_retained={n_retained} samples")
    mask.flags.writeable = False
    return mask


def _bitmap(mask: np.ndarray) -> bytes:
    """Bit j % 8 of byte j // 8 is ``mask[j]`` (least significant bit first)."""
    return np.packbits(mask.astype(np.uint8), bitorder="little").tobytes()


def _read_bitmap(r: Reader, c: int, what: str, unit: str) -> np.ndarray:
    """A bitmap of ``c`` bits (:func:`_bitmap`); refused when it sets a bit past the last one."""
    raw = np.frombuffer(r.raw((c + 7) // 8, what), dtype=np.uint8)
    bits = np.unpackbits(raw, bitorder="little").astype(bool)
    if bits[c:].any():
        raise r.fail(f"{what} sets bits past {unit} {c - 1} (the last byte's unused bits must be 0)")
    return bits[:c]


def _stored_columns(w: np.ndarray) -> np.ndarray:
    """The columns a sparse message must carry: all but those whose every value is +0.0 (a -0.0
    or NaN keeps its column, so decoding gives W back bit for bit)."""
    return (w != 0).any(axis=0) | np.signbit(w).any(axis=0)


def _sparse_columns(w: np.ndarray) -> np.ndarray | None:
    """The columns a message of ``w`` carries with flag bit 5, or None for the plain layout: no
    column to leave out (then byte for byte as before bit 5), or a W too large for bit 5."""
    d, c = w.shape
    if not c or d * c > SPARSE_MAX_VALUES:
        return None
    columns = _stored_columns(w)
    return None if columns.all() else columns


def _digest_bytes(digest: str, what: str = "digest") -> bytes:
    if not isinstance(digest, str) or len(digest) != 64:
        raise CodecError(f"{what} must be 64 hex characters (SHA-256), got {digest!r:.80}")
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        raise CodecError(f"{what} is not hex: {digest!r:.80}") from None
    if digest != raw.hex():
        raise CodecError(f"{what} must be lowercase hex (canonical form)")
    return raw


def _check_scalars(h_version: int, n_retained: int, events: int, drift: float, gamma: float,
                   ts: float, err: Any) -> None:
    for name, v in (("version", h_version), ("n_retained", n_retained), ("events_covered", events)):
        if not isinstance(v, int) or not 0 <= v <= _U64_MAX:
            raise err(f"{name} must be an int in 0..2^64-1, got {v!r}")
    if not (math.isfinite(gamma) and gamma > 0):
        raise err(f"gamma must be finite and > 0, got {gamma!r}")
    if not (math.isfinite(drift) and drift >= 0):
        raise err(f"drift must be finite and >= 0, got {drift!r}")
    if not (math.isfinite(ts) and ts >= 0):
        raise err(f"created_ts must be finite and >= 0, got {ts!r}")


def _check_offsets(offsets: Sequence[tuple[int, int]], err: Any) -> None:
    last = -1
    for p, o in offsets:
        if not 0 <= p <= 2**31 - 1 or not 0 <= o <= 2**63 - 1:
            raise err(f"offset ({p}, {o}) out of range (partition int32 >= 0, offset int64 >= 0)")
        if p <= last:
            raise err(f"offsets must have one entry per partition, sorted; partition {p} repeats")
        last = p


def encode_head(h: HeadUpdate, sparse: bool = True) -> bytes:
    """Serialize; raises CodecError if the update is inconsistent. ``sparse``: leave W's all-+0.0
    columns out (flag bit 5, set only when a column is left out); False writes every column, for
    readers that predate bit 5 (``UNLEARN_HEAD_SPARSE_WEIGHTS``)."""
    if h.mode not in MODES:
        raise CodecError(f"mode must be one of {MODES}, got {h.mode!r}")
    if h.digest is None and h.mode == "exact":
        raise CodecError("an exact head update carries its digest")
    _check_scalars(h.version, h.n_retained, h.events_covered, h.drift, h.gamma, h.created_ts, CodecError)
    _check_offsets(h.offsets, CodecError)
    w_arr = np.asarray(h.weights)
    if w_arr.ndim != 2 or w_arr.shape[0] < 1 or w_arr.dtype.kind not in "fiu":
        raise CodecError(f"weights must be a (d>=1, c) real array, got shape {w_arr.shape} {w_arr.dtype}")
    d, c = w_arr.shape
    if d > 0xFFFFFFFF or c > 0xFFFFFFFF:
        raise CodecError("weights dimensions exceed u32")
    flags = 0
    post = None
    if h.posterior is not None:
        post = np.asarray(h.posterior)
        if post.shape != (d, d) or post.dtype.kind not in "fiu":
            raise CodecError(f"posterior must be a ({d}, {d}) real array, got {post.shape}")
        flags |= _FLAG_POSTERIOR
    retained = None if h.retained_hash is None else _digest_bytes(h.retained_hash, "retained_hash")
    if retained is not None:
        flags |= _FLAG_RETAINED_HASH
    if h.digest is None:
        flags |= _FLAG_NO_DIGEST
    cv = h.contract_version
    if cv is not None:
        if not isinstance(cv, int) or not 1 <= cv <= 2**63 - 1:
            raise CodecError(f"contract_version must be an int in 1..2^63-1, got {cv!r}")
        flags |= _FLAG_CONTRACT
    classes = None
    if h.retained_classes is not None:
        classes = _classes_bitmap(h.retained_classes, c, h.n_retained)
        flags |= _FLAG_CLASSES
    columns = _sparse_columns(w_arr) if sparse else None
    flags |= 0 if columns is None else _FLAG_COLUMNS
    w = Writer()
    w.str16(h.head_id, "head_id")
    w.pack(
        _FIXED, h.version, MODES.index(h.mode), _RESERVED,
        _NO_DIGEST if h.digest is None else _digest_bytes(h.digest), h.n_retained,
        h.events_covered, h.created_ts, h.drift, h.gamma, d, c, len(h.offsets),
    )
    if retained is not None:
        w.put(retained)
    if cv is not None:
        w.pack(_CONTRACT, cv)
    if classes is not None:
        w.put(classes)
    if columns is not None:
        w.put(_bitmap(columns))
    w.array(np.array([p for p, _ in h.offsets], dtype="<i4"), align=False)
    w.array(np.array([o for _, o in h.offsets], dtype="<i8"))
    w.array(np.asarray(w_arr if columns is None else w_arr[:, columns], dtype="<f8"))
    if post is not None:
        w.array(np.asarray(post, dtype="<f8"))
    return w.finish(HEAD_MAGIC, HEAD_VERSION, flags)


def decode_head(buf: bytes | bytearray | memoryview) -> HeadUpdate:
    """Parse and validate one ``heads`` message; CodecError on anything wrong."""
    body, version, flags = check_frame(buf, HEAD_MAGIC, "head")
    if version != HEAD_VERSION:
        raise CodecError(f"head: unknown version {version} (this decoder knows {HEAD_VERSION})")
    if flags & ~_FLAGS:
        raise CodecError(f"head: unknown flags {flags:#06x} for version {version}")
    r = Reader(body, "head")
    head_id = r.str16("head_id")
    if not is_valid_id(head_id):
        raise r.fail(f"head_id {head_id[:80]!r} is not an id (1..128 characters of [{ID_CHARS}])")
    (h_version, mode_i, reserved, digest, n_retained, events, ts, drift, gamma, d, c, n_off) = r.unpack(
        _FIXED, "fixed fields"
    )
    if reserved != _RESERVED:
        raise r.fail("reserved bytes after mode are not 0")
    if mode_i >= len(MODES):
        raise r.fail(f"unknown mode {mode_i}")
    if flags & _FLAG_NO_DIGEST and (MODES[mode_i] == "exact" or digest != _NO_DIGEST):
        raise r.fail("no digest (flag bit 2) is for fast updates only, and its 32 bytes must be 0")
    _check_scalars(h_version, n_retained, events, drift, gamma, ts, r.fail)
    if d < 1:
        raise r.fail("d must be >= 1")
    retained = bytes(r.raw(32, "retained_hash")).hex() if flags & _FLAG_RETAINED_HASH else None
    contract_version = None
    if flags & _FLAG_CONTRACT:
        (contract_version,) = r.unpack(_CONTRACT, "contract_version")
        if not 1 <= contract_version <= 2**63 - 1:
            raise r.fail(f"contract_version {contract_version} out of range 1..2^63-1")
    classes = _read_classes(r, c, n_retained) if flags & _FLAG_CLASSES else None
    columns = None
    if flags & _FLAG_COLUMNS:
        if d * c > SPARSE_MAX_VALUES:
            raise r.fail(f"weights of {d} x {c} values exceed {SPARSE_MAX_VALUES} with weight_columns (flag bit 5)")
        columns = _read_bitmap(r, c, "weight_columns", "column")
        if columns.all():
            raise r.fail("weight_columns marks every column (such an update is written without flag bit 5)")
    parts = r.array("<i4", n_off, "offset partitions", align=False)
    offs = r.array("<i8", n_off, "offsets")
    offsets = tuple(zip(parts.tolist(), offs.tolist()))
    _check_offsets(offsets, r.fail)
    if columns is None:
        weights = r.array("<f8", d * c, "weights").reshape(d, c)
    else:
        k = int(columns.sum())
        stored = r.array("<f8", d * k, "weights").reshape(d, k)  # read (length-checked) before allocating W
        if not _stored_columns(stored).all():
            j = int(np.flatnonzero(columns)[np.argmin(_stored_columns(stored))])
            raise r.fail(f"weights: weight_columns marks column {j}, whose values are all +0.0 (left out, not sent)")
        weights = np.zeros((d, c), dtype="<f8")
        weights[:, columns] = stored
    posterior = r.array("<f8", d * d, "posterior").reshape(d, d) if flags & _FLAG_POSTERIOR else None
    r.done()
    return HeadUpdate(
        head_id, h_version, MODES[mode_i], None if flags & _FLAG_NO_DIGEST else digest.hex(), n_retained, events,
        offsets,
        drift, gamma, ts, weights, posterior, retained, contract_version, classes,
    )


def retained_class_list(h: HeadUpdate) -> list[int] | None:
    """The classes with retained samples, ascending (None: a head of target vectors)."""
    return None if h.retained_classes is None else np.flatnonzero(h.retained_classes).tolist()


def head_to_json(h: HeadUpdate, include_posterior: bool = False) -> dict[str, Any]:
    """A JSON-ready dict for HTTP serving, logs and non-Python clients (weights as d x c lists;
    ``digest`` null on a fast update that carries none; ``retained_classes`` the ascending class
    indices with retained samples, null on a head of target vectors)."""
    out: dict[str, Any] = {
        "schema": "unlearn.head/v1",
        "head_id": h.head_id,
        "version": h.version,
        "mode": h.mode,
        "digest": h.digest,
        "n_retained": h.n_retained,
        "events_covered": h.events_covered,
        "offsets": [[p, o] for p, o in h.offsets],
        "drift": h.drift,
        "gamma": h.gamma,
        "created_ts": h.created_ts,
        "d": h.d,
        "c": h.c,
        "weights": np.asarray(h.weights, dtype=np.float64).tolist(),
        "has_posterior": h.posterior is not None,
        "retained_hash": h.retained_hash,
        "contract_version": h.contract_version,
        "retained_classes": retained_class_list(h),
    }
    if include_posterior and h.posterior is not None:
        out["posterior"] = np.asarray(h.posterior, dtype=np.float64).tolist()
    return out
