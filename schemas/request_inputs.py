"""The ``input`` of an add request: its kinds (features as JSON numbers or binary floats, text,
image, sealed for transit), their strict parsing and their JSON form.

Checked in the envelope's fixed order and with its reason codes (``schemas/envelope.py``); the
parse makes no per-float Python objects, so a feature vector costs one C-level pass.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from unlearn.schemas.json_keys import duplicate_key
from unlearn.schemas.request_errors import InvalidRequest, fail, short_repr

__all__ = [
    "FEATURE_DTYPES",
    "SEALED_KEY_ID_CHARS",
    "FeatureDtype",
    "FeaturesInput",
    "ImageInput",
    "Input",
    "SealedInput",
    "TextInput",
    "check_input",
    "input_to_dict",
    "parse_inner_input",
]


_INPUT_KEYS = {
    "features": ("values",), "features_bin": ("dtype", "data"), "text": ("text",), "image": ("format", "data"),
    "sealed": ("key_id", "epk", "nonce", "ciphertext"),
}
SEALED_KEY_ID_CHARS = 32  # a transit key id: 32 lowercase hex characters (schema: sealed key_id)
_KEY_ID_RE = re.compile(f"[0-9a-f]{{{SEALED_KEY_ID_CHARS}}}")
FeatureDtype = Literal["<f4", "<f8"]
#: ``features_bin`` dtypes (numpy notation): little-endian IEEE-754 binary32 / binary64.
FEATURE_DTYPES: tuple[str, ...] = ("<f4", "<f8")
_NUMBER_TYPES = frozenset((float, int))  # JSON numbers as orjson decodes them (bool is not one)


@dataclass(frozen=True, slots=True, eq=False, init=False)
class FeaturesInput:
    """A precomputed feature vector (skips the backbone), sent as JSON numbers (``dtype`` None,
    wire kind ``features``) or as little-endian float bytes (``dtype`` '<f4' | '<f8', wire kind
    ``features_bin``). Either way the input kind is ``features``: a head takes both.

    ``values`` is a read-only 1-D numpy array, float32 for '<f4' and float64 otherwise: parsing
    makes no per-float Python objects, and the featurizer quantizes exactly the values sent
    (float32 ones widened exactly). Any sequence of numbers is converted (a copy)."""

    values: np.ndarray
    dtype: FeatureDtype | None = None
    kind: Literal["features"] = field(default="features", init=False)

    def __init__(self, values: Sequence[float] | np.ndarray, dtype: FeatureDtype | None = None) -> None:
        object.__setattr__(self, "values", _feature_array(values, dtype))
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "kind", "features")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FeaturesInput):
            return NotImplemented
        return self.dtype == other.dtype and bool(np.array_equal(self.values, other.values))

    def __hash__(self) -> int:
        return hash((self.dtype, (self.values + 0.0).tobytes()))  # + 0.0: -0.0 == 0.0 hash alike


@dataclass(frozen=True, slots=True)
class TextInput:
    """Text for a text backbone."""

    text: str
    kind: Literal["text"] = field(default="text", init=False)


@dataclass(frozen=True, slots=True)
class ImageInput:
    """Encoded image bytes (decoded from base64) for an image backbone."""

    data: bytes
    format: Literal["png"] = "png"
    kind: Literal["image"] = field(default="image", init=False)


@dataclass(frozen=True, slots=True)
class SealedInput:
    """An input sealed for transit (``schemas/transit.py``): the featurizer opens it into one of
    the other kinds right after parsing, under its by-head partition's transit key ``key_id``."""

    key_id: str
    epk: bytes
    nonce: bytes
    ciphertext: bytes
    kind: Literal["sealed"] = field(default="sealed", init=False)


Input = FeaturesInput | TextInput | ImageInput | SealedInput


def _feature_array(values: Any, dtype: object) -> np.ndarray:
    """``values`` as FeaturesInput keeps them: read-only 1-D, float32 for '<f4' else float64.
    The parser's own arrays are kept as they are; anything else is copied (the caller's array
    may change later). InvalidRequest for an unknown dtype or what is not a vector of numbers."""
    if dtype is not None and dtype not in FEATURE_DTYPES:
        raise fail("bad_features_dtype",
                   f"features dtype must be '<f4' | '<f8' or None (JSON), got {short_repr(dtype)}")
    want = np.float32 if dtype == "<f4" else np.float64
    if type(values) is np.ndarray and values.dtype == want and values.ndim == 1 and not values.flags.writeable:
        return values
    try:
        with np.errstate(over="ignore"):  # float64 beyond float32 range: inf, refused as non-finite
            arr = np.array(values, dtype=want)
    except (TypeError, ValueError, OverflowError) as exc:
        raise fail("bad_features", f"features must be a vector of numbers: {exc}") from None
    if arr.ndim != 1:
        raise fail("bad_features", f"features must be a 1-D vector, got shape {arr.shape}")
    arr.flags.writeable = False
    return arr


def _feature_list(v: object) -> np.ndarray:
    """``input.values``: the float64 array of a non-empty JSON array of finite numbers. One C-level
    pass checks the element types and one makes the array (no Python loop over the values)."""
    if type(v) is not list or not v:
        raise fail("bad_features", f"input.values must be a non-empty list of numbers, got {short_repr(v)}")
    if not _NUMBER_TYPES.issuperset(map(type, v)):
        bad = next(x for x in v if type(x) not in _NUMBER_TYPES)
        raise fail("bad_features", f"input.values must hold only numbers, found {short_repr(bad)}")
    try:
        arr = np.array(v, dtype=np.float64)
    except OverflowError:  # an int too large for a float64 is not finite as a feature
        raise fail("non_finite_feature", "input.values holds a number beyond float64 range") from None
    _check_finite(arr)
    arr.flags.writeable = False
    return arr


def _feature_bytes(dtype: object, data: object) -> np.ndarray:
    """``features_bin``: a read-only view of the decoded bytes as ``dtype`` (no copy, no floats
    in Python), after the checks the schema cannot make (whole values, finite bit patterns)."""
    if type(dtype) is not str or dtype not in FEATURE_DTYPES:
        raise fail("bad_features_dtype", f"input.dtype must be '<f4' | '<f8', got {short_repr(dtype)}")
    if type(data) is not str:
        raise fail("bad_base64", f"input.data must be a base64 string, got {short_repr(data)}")
    raw = _b64decode(data)
    size = 4 if dtype == "<f4" else 8
    if not raw or len(raw) % size:
        raise fail("bad_features", f"input.data holds {len(raw)} bytes: not a non-empty whole number of "
                                    f"{size}-byte {dtype} values")
    arr = np.frombuffer(raw, dtype=dtype)
    _check_finite(arr)
    return arr


def _check_finite(arr: np.ndarray) -> None:
    if not np.isfinite(arr).all():
        raise fail("non_finite_feature", "input holds a NaN or infinite feature value")


def check_input(v: object) -> Input:
    if type(v) is not dict:
        raise fail("bad_input", f"input must be an object, got {short_repr(v)}")
    kind = v.get("kind")
    if kind is None:
        raise fail("bad_input", "input.kind is missing")
    if type(kind) is not str or kind not in _INPUT_KEYS:
        raise fail("bad_input_kind",
                    f"input.kind must be features | features_bin | text | image | sealed, got {short_repr(kind)}")
    wanted = _INPUT_KEYS[kind]
    for key in v:
        if key != "kind" and key not in wanted:
            raise fail("bad_input", f"input of kind {kind!r} takes no field {key!r}")
    for key in wanted:
        if key not in v:
            raise fail("bad_input", f"input of kind {kind!r} needs field {key!r}")
    if kind == "features":
        return FeaturesInput(_feature_list(v["values"]))
    if kind == "features_bin":
        return FeaturesInput(_feature_bytes(v["dtype"], v["data"]), v["dtype"])
    if kind == "sealed":
        return _sealed_input(v)
    if kind == "text":
        text = v["text"]
        if type(text) is not str or not text:
            raise fail("bad_text", f"input.text must be a non-empty string, got {short_repr(text)}")
        return TextInput(text)
    fmt, data = v["format"], v["data"]
    if fmt != "png":
        raise fail("bad_image_format", f"input.format must be 'png', got {short_repr(fmt)}")
    if type(data) is not str or len(data) < 4:
        raise fail("bad_base64", f"input.data must be a base64 string of >= 4 characters, got {short_repr(data)}")
    return ImageInput(_b64decode(data), "png")


def _sealed_input(v: dict[str, Any]) -> SealedInput:
    """The sealed kind's fields, sizes checked as the schema does (the opening is the featurizer's)."""
    key_id = v["key_id"]
    if type(key_id) is not str or _KEY_ID_RE.fullmatch(key_id) is None:
        raise fail("bad_sealed_input", f"input.key_id must be 32 lowercase hex characters, got {short_repr(key_id)}")
    parts = []
    for name, size, exact in (("epk", 32, True), ("nonce", 12, True), ("ciphertext", 16, False)):
        raw = v[name]
        try:
            b = _b64decode(raw) if type(raw) is str else None
        except InvalidRequest:
            b = None
        if b is None or (len(b) != size if exact else len(b) < size):
            want = f"{size} bytes" if exact else f"at least {size} bytes"
            raise fail("bad_sealed_input",
                       f"input.{name} must be padded standard base64 of {want}, got {short_repr(raw)}")
        parts.append(b)
    return SealedInput(key_id, parts[0], parts[1], parts[2])


def parse_inner_input(raw: bytes) -> Input:
    """The inner input object of an opened sealed input (JSON bytes), checked like ``input``;
    a nested sealed input is refused (``bad_sealed_input``)."""
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise fail("bad_sealed_input", f"the opened input is not UTF-8 JSON: {exc}") from None
    if (dup := duplicate_key(raw, d)) is not None:
        raise fail("duplicate_key", f"the opened input holds the key {dup[:64]!r} twice")
    inp = check_input(d)
    if isinstance(inp, SealedInput):
        raise fail("bad_sealed_input", "a sealed input must not hold another sealed input")
    return inp


def _b64decode(data: str) -> bytes:
    """Strict padded standard base64, the schema's pattern: length % 4 == 0, '=' only at the end
    (at most two). binascii's strict mode refuses other characters and misplaced padding in C."""
    try:
        raw = data.encode("ascii")
    except UnicodeEncodeError:
        raise fail("bad_base64", "input.data holds non-ASCII characters") from None
    if len(raw) % 4:
        raise fail("bad_base64", "input.data length is not a multiple of 4 (padding missing?)")
    if raw.endswith(b"==="):
        raise fail("bad_base64", "input.data has more than two '=' of padding")
    try:
        return binascii.a2b_base64(raw, strict_mode=True)
    except binascii.Error as exc:
        raise fail("bad_base64", f"input.data is not standard base64 (A-Z a-z 0-9 + / and '=' padding): {exc}"
                    ) from None


def input_to_dict(inp: Input) -> dict[str, Any]:
    """The JSON object of an ``input`` (binary fields base64): also the plaintext of a sealed one."""
    b64 = base64.b64encode
    if isinstance(inp, FeaturesInput):
        if inp.dtype is None:
            return {"kind": "features", "values": inp.values.tolist()}
        data = inp.values.astype(inp.dtype, copy=False).tobytes()
        return {"kind": "features_bin", "dtype": inp.dtype, "data": b64(data).decode("ascii")}
    if isinstance(inp, TextInput):
        return {"kind": "text", "text": inp.text}
    if isinstance(inp, ImageInput):
        return {"kind": "image", "format": inp.format, "data": b64(inp.data).decode("ascii")}
    if isinstance(inp, SealedInput):
        return {"kind": "sealed", "key_id": inp.key_id, "epk": b64(inp.epk).decode("ascii"),
                "nonce": b64(inp.nonce).decode("ascii"), "ciphertext": b64(inp.ciphertext).decode("ascii")}
    raise fail("bad_input", f"input must be FeaturesInput | TextInput | ImageInput | SealedInput, "
                             f"got {type(inp).__name__}")
