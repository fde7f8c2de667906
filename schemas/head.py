"""The head: its binary ``heads`` messages, its contract, and which classes it may predict.

**Messages** (binary ``ULHD``; docs/formats.md, "Heads"). The ``heads`` topic is compacted and
keyed by head id, so the latest message per key is the current head. Besides W (d x c float64) a
message carries the version (receipts point at the first version that excludes a deleted
sample), the delta offsets it covers (where to resume), and optionally: the ledger digest (so
anyone can check the head against a from-scratch ledger; exact updates always carry it, fast ones
need not, since it costs O(d^2): flag bit 2), the posterior matrix T = (S + gamma*I)^-1 (d x d)
for predictive variance, the fingerprint of the multiset hash of the retained rows
(docs/design.md section 6) when the head knows it, the version of the head contract the head was
built under (the one named by its latest delta: flag bit 3), which serving quantizes predict
inputs with, and, for a head of class-index labels, which class columns hold retained samples
(flag bit 4: a bitmap from the ledger's exact per-class counts). Same frame and robustness rules
as the deltas (``schemas/delta_codec.py``).

**Contracts** (``head-registry`` records, ``unlearn.head-contract/v1``, JSON because operators
and other languages read it). A head's contract declares everything that must stay fixed for its
ledger to stay meaningful: the feature dimension, the backbone and input kind, the preprocessing
(L2 normalization, feature bound, quantization grids), gamma and the label space (a class count,
optionally with class names, or a target-vector width). The featurizer refuses what falls outside
it, and serving quantizes with it, so neither depends on its own settings nor on the data seen so
far (docs/registry.md). The class columns of a head never depend on data: only an explicit
:meth:`HeadContract.extend` grows the label space, and each change bumps ``version``.
:func:`parse_contract` is strict: unknown fields, wrong types and out-of-range values raise
:class:`ContractError` naming the field.

**Predictions**: scores of the classes that hold retained samples, and only those. A column
without one (``HeadUpdate.retained_classes``) has no data behind it: its weights are zero (or, on
a fast head, a float residue of zero), so its score is not a competing 0.0 but *no score*. Every
Python reader that predicts (serving, the SDK's ``predict_rows``, the demo) takes the predicted
class and the top k here, over the marked classes only, and reports the other classes' scores as
absent (NaN here, ``null`` in JSON); a head with no retained sample predicts nothing (``-1`` /
``null``). A head of target vectors (``retained_classes`` None) has every column as an output.
The rule is part of the head format (docs/formats.md, "Heads"), so clients in other languages
implement the same.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import orjson
from numpy.typing import NDArray

from unlearn.ledger.quantization import MAX_CLASS_INDEX
from unlearn.schemas.delta_codec import CodecError, Reader, Writer, check_frame
from unlearn.schemas.envelope import ID_CHARS, is_valid_id
from unlearn.schemas.registry_record import check_id_and_version, load_document, open_document, require_fields, typed

__all__ = [
    "HEAD_MAGIC",
    "HEAD_VERSION",
    "MODES",
    "CodecError",
    "HeadUpdate",
    "decode_head",
    "encode_head",
    "head_to_json",
    "retained_class_list",
    "HEAD_CONTRACT_SCHEMA_V1",
    "INPUT_KINDS",
    "MAX_CONTRACT_CLASSES",
    "MAX_CONTRACT_DIM",
    "ContractError",
    "HeadContract",
    "decode_contract",
    "encode_contract",
    "parse_contract",
    "HeadScores",
    "output_mask",
    "score_rows",
]

HEAD_MAGIC = b"ULHD"
HEAD_VERSION = 1
MODES: tuple[str, ...] = ("exact", "fast")
_FLAG_POSTERIOR = 0x0001
_FLAG_RETAINED_HASH = 0x0002
_FLAG_NO_DIGEST = 0x0004  # the update carries no ledger digest (its 32 bytes are zero)
_FLAG_CONTRACT = 0x0008  # the contract version (u64) follows the retained hash
_FLAG_CLASSES = 0x0010  # the retained-classes bitmap (ceil(c / 8) bytes) follows the contract version
_FLAGS = _FLAG_POSTERIOR | _FLAG_RETAINED_HASH | _FLAG_NO_DIGEST | _FLAG_CONTRACT | _FLAG_CLASSES
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
    return np.packbits(arr, bitorder="little").tobytes()


def _read_classes(r: Reader, c: int, n_retained: int) -> np.ndarray:
    raw = np.frombuffer(r.raw((c + 7) // 8, "retained_classes"), dtype=np.uint8)
    bits = np.unpackbits(raw, bitorder="little")
    if bits[c:].any():
        raise r.fail(f"retained_classes sets bits past class {c - 1} (the last byte's unused bits must be 0)")
    mask = bits[:c].astype(bool)
    if int(mask.sum()) > n_retained:
        raise r.fail(f"retained_classes marks {int(mask.sum())} classes, more than n_retained={n_retained} samples")
    mask.flags.writeable = False
    return mask


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


def encode_head(h: HeadUpdate) -> bytes:
    """Serialize; raises CodecError if the update is inconsistent."""
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
    w.array(np.array([p for p, _ in h.offsets], dtype="<i4"), align=False)
    w.array(np.array([o for _, o in h.offsets], dtype="<i8"))
    w.array(np.asarray(w_arr, dtype="<f8"))
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
    parts = r.array("<i4", n_off, "offset partitions", align=False)
    offs = r.array("<i8", n_off, "offsets")
    offsets = tuple(zip(parts.tolist(), offs.tolist()))
    _check_offsets(offsets, r.fail)
    weights = r.array("<f8", d * c, "weights").reshape(d, c)
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


HEAD_CONTRACT_SCHEMA_V1 = "unlearn.head-contract/v1"
INPUT_KINDS: tuple[str, ...] = ("features", "text", "image")
MAX_CONTRACT_DIM = 65_536
"""Format limit on ``dimension``; deployments cap it lower (``UNLEARN_MAX_FEATURE_DIM``)."""
MAX_CONTRACT_CLASSES = MAX_CLASS_INDEX + 1
"""Format limit on the label space (the ledger's class-index limit); deployments cap it lower
(``UNLEARN_MAX_CLASSES``)."""
_MAX_LABEL_NAME = 256

_FIELDS = ("schema", "head_id", "version", "dimension", "backbone", "input_kind", "normalization",
           "feature_bound", "frac_bits", "label_frac_bits", "label_kind", "n_classes", "label_names",
           "label_width", "gamma", "origin")


class ContractError(ValueError):
    """A head contract that is malformed, out of range, or not a valid change of its predecessor."""


@dataclass(frozen=True)
class HeadContract:
    """One version of a head's contract (see the module docstring; fields as in the JSON).

    ``label_kind`` "class": labels are class indices ``0 <= y < n_classes`` (``label_names``,
    when given, names each class); "vector": labels are target vectors of ``label_width`` values.
    ``origin`` says who wrote it: "declared" (``unlearn heads``) or "auto" (the featurizer, on
    the first add of an undeclared head)."""

    head_id: str
    version: int
    dimension: int
    backbone: str
    input_kind: str
    normalization: Literal["l2", "none"]
    feature_bound: float
    frac_bits: int
    label_frac_bits: int
    label_kind: Literal["class", "vector"]
    gamma: float
    n_classes: int = 0
    label_names: tuple[str, ...] | None = None
    label_width: int = 0
    origin: Literal["declared", "auto"] = "declared"

    def __post_init__(self) -> None:
        _check(self)

    @property
    def normalize(self) -> bool:
        """Whether feature rows are L2-normalized before quantizing."""
        return self.normalization == "l2"

    @property
    def n_outputs(self) -> int:
        """The head's label columns: ``n_classes`` or ``label_width``."""
        return self.n_classes if self.label_kind == "class" else self.label_width

    def extend(self, n_classes: int | None = None, names: tuple[str, ...] = ()) -> HeadContract:
        """The next version with a larger class space: ``n_classes`` in total, or ``names``
        appended (a named label space grows by names only). Raises :class:`ContractError` for
        anything but growth: class-incremental learning adds columns, never removes or renames."""
        if self.label_kind != "class":
            raise ContractError(f"head {self.head_id!r} takes label vectors; only a class label space can grow")
        if self.label_names is not None:
            if n_classes is not None or not names:
                raise ContractError(f"head {self.head_id!r} names its classes: extend it with new names")
            return replace(self, version=self.version + 1, n_classes=self.n_classes + len(names),
                           label_names=(*self.label_names, *names))
        if names:
            raise ContractError(f"head {self.head_id!r} has unnamed classes: extend it with a class count")
        if n_classes is None or n_classes <= self.n_classes:
            raise ContractError(f"head {self.head_id!r} has {self.n_classes} classes: extend needs more, "
                                f"got {n_classes}")
        return replace(self, version=self.version + 1, n_classes=n_classes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (fields that do not apply to the label kind are left out)."""
        d: dict[str, Any] = {
            "schema": HEAD_CONTRACT_SCHEMA_V1, "head_id": self.head_id, "version": self.version,
            "dimension": self.dimension, "backbone": self.backbone, "input_kind": self.input_kind,
            "normalization": self.normalization, "feature_bound": self.feature_bound,
            "frac_bits": self.frac_bits, "label_frac_bits": self.label_frac_bits,
            "label_kind": self.label_kind, "gamma": self.gamma, "origin": self.origin,
        }
        if self.label_kind == "class":
            d["n_classes"] = self.n_classes
            if self.label_names is not None:
                d["label_names"] = list(self.label_names)
        else:
            d["label_width"] = self.label_width
        return d


def _check(c: HeadContract) -> None:
    """Every range rule of the format (the JSON Schema says the same)."""
    check_id_and_version("head_id", c.head_id, c.version, ContractError)
    if not 1 <= c.dimension <= MAX_CONTRACT_DIM:
        raise ContractError(f"dimension must be in 1..{MAX_CONTRACT_DIM}, got {c.dimension}")
    if not c.backbone or len(c.backbone) > 128:
        raise ContractError("backbone must be a backbone name of 1..128 characters")
    if c.input_kind not in INPUT_KINDS:
        raise ContractError(f"input_kind must be one of {INPUT_KINDS}, got {c.input_kind!r}")
    if c.normalization not in ("l2", "none"):
        raise ContractError(f"normalization must be 'l2' or 'none', got {c.normalization!r}")
    if not 1 <= c.frac_bits <= 30:
        raise ContractError(f"frac_bits must be in 1..30, got {c.frac_bits}")
    if not 0 <= c.label_frac_bits <= 30:
        raise ContractError(f"label_frac_bits must be in 0..30, got {c.label_frac_bits}")
    if not (math.isfinite(c.feature_bound) and c.feature_bound > 0):
        raise ContractError(f"feature_bound must be a finite number > 0, got {c.feature_bound}")
    if c.feature_bound * 2.0 ** c.frac_bits > 2.0 ** 30:
        raise ContractError(f"feature_bound * 2^frac_bits must be <= 2^30 (|q| <= 2^30), got "
                            f"{c.feature_bound} * 2^{c.frac_bits}")
    if not (math.isfinite(c.gamma) and c.gamma > 0):
        raise ContractError(f"gamma must be a finite number > 0, got {c.gamma}")
    if c.origin not in ("declared", "auto"):
        raise ContractError(f"origin must be 'declared' or 'auto', got {c.origin!r}")
    if c.label_kind == "class":
        if not 1 <= c.n_classes <= MAX_CONTRACT_CLASSES or c.label_width:
            raise ContractError(f"a class head needs n_classes in 1..{MAX_CONTRACT_CLASSES} and no label_width, "
                                f"got n_classes={c.n_classes}, label_width={c.label_width}")
        if c.label_names is not None:
            if len(c.label_names) != c.n_classes:
                raise ContractError(f"label_names has {len(c.label_names)} names for {c.n_classes} classes")
            if len(set(c.label_names)) != len(c.label_names) or not all(
                    isinstance(n, str) and 1 <= len(n) <= _MAX_LABEL_NAME for n in c.label_names):
                raise ContractError(f"label_names must be distinct strings of 1..{_MAX_LABEL_NAME} characters")
    elif c.label_kind == "vector":
        if not 1 <= c.label_width <= MAX_CONTRACT_CLASSES or c.n_classes or c.label_names is not None:
            raise ContractError(f"a vector head needs label_width in 1..{MAX_CONTRACT_CLASSES} and no n_classes "
                                f"or label_names, got label_width={c.label_width}")
    else:
        raise ContractError(f"label_kind must be 'class' or 'vector', got {c.label_kind!r}")


def _typed(d: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    return typed(d, name, kind, ContractError)


def parse_contract(d: Any) -> HeadContract:
    """A contract from its JSON object; raises :class:`ContractError` naming the first problem."""
    d = open_document(d, schema=HEAD_CONTRACT_SCHEMA_V1, fields=_FIELDS, what="a head contract", error=ContractError)
    require_fields(d, ["head_id", "version", "dimension", "backbone", "input_kind", "normalization", "feature_bound",
                       "frac_bits", "label_frac_bits", "label_kind", "gamma", "origin",
                       "n_classes" if d.get("label_kind") == "class" else "label_width"], ContractError)
    names = d.get("label_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise ContractError("label_names must be a list of strings")
    return HeadContract(
        head_id=_typed(d, "head_id", str), version=_typed(d, "version", int),
        dimension=_typed(d, "dimension", int), backbone=_typed(d, "backbone", str),
        input_kind=_typed(d, "input_kind", str), normalization=_typed(d, "normalization", str),
        feature_bound=float(_typed(d, "feature_bound", (int, float))),
        frac_bits=_typed(d, "frac_bits", int), label_frac_bits=_typed(d, "label_frac_bits", int),
        label_kind=_typed(d, "label_kind", str), gamma=float(_typed(d, "gamma", (int, float))),
        n_classes=_typed(d, "n_classes", int) if "n_classes" in d else 0,
        label_names=tuple(names) if names is not None else None,
        label_width=_typed(d, "label_width", int) if "label_width" in d else 0,
        origin=_typed(d, "origin", str),
    )


def encode_contract(c: HeadContract) -> bytes:
    """The record value on ``head-registry`` (key: the head id, UTF-8)."""
    return orjson.dumps(c.to_dict())


def decode_contract(raw: bytes) -> HeadContract:
    """A record value of ``head-registry``; raises :class:`ContractError` (also for bad JSON)."""
    return parse_contract(load_document(raw, ContractError))


def output_mask(head: HeadUpdate) -> NDArray[np.bool_]:
    """bool (c,): the columns a prediction may name (every column for a head of target vectors)."""
    if head.retained_classes is None:
        return np.ones(head.c, dtype=bool)
    return np.asarray(head.retained_classes, dtype=bool)


@dataclass(frozen=True)
class HeadScores:
    """Scores of n inputs under one head version.

    ``scores`` (n, c) float64: f @ W on the output columns, NaN on the others. ``predicted`` (n,)
    int64: the argmax over the output columns (the lowest index among equal scores), -1 when
    the head has none. ``top`` (n, k) int64: the k best output columns, best first (k <= the
    number of output columns). ``mask``: which columns are outputs."""

    scores: NDArray[np.float64]
    predicted: NDArray[np.int64]
    top: NDArray[np.int64]
    mask: NDArray[np.bool_]

    def as_json(self, i: int) -> dict[str, Any]:
        """Input ``i``'s ``scores`` (null where absent), ``predicted_class`` and ``top_classes``."""
        row = self.scores[i]
        return {
            "scores": [float(v) if m else None for v, m in zip(row.tolist(), self.mask.tolist())],
            "predicted_class": int(self.predicted[i]) if self.predicted[i] >= 0 else None,
            "top_classes": self.top[i].tolist(),
        }


def score_rows(head: HeadUpdate, X: NDArray[np.float64], top_k: int = 1) -> HeadScores:
    """Scores of the feature rows X (n, d) under ``head``, ranked over its output columns only.
    ``top_k`` (>= 1) is clipped to the number of output columns."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != head.d:
        raise ValueError(f"X must have shape (n, {head.d}), got {X.shape}")
    mask = output_mask(head)
    raw = X @ np.asarray(head.weights, dtype=np.float64)
    scores = np.where(mask, raw, np.nan)
    cols = np.flatnonzero(mask)
    n = X.shape[0]
    k = min(top_k, cols.size)
    if k == 0:
        return HeadScores(scores, np.full(n, -1, np.int64), np.zeros((n, 0), np.int64), mask)
    # a stable sort of -score: the best first, the lowest class index first among equal scores
    order = np.argsort(-raw[:, cols], axis=1, kind="stable")[:, :k]
    top = cols[order].astype(np.int64)
    return HeadScores(scores, top[:, 0].copy(), top, mask)
