"""The request envelope (``unlearn.request/v1``): parse, validate, encode; and the ``source_id``
that ties a delta back to the requests it was made from.

**The envelope.** The contract is ``schemas/request.v1.schema.json`` (upstream apps in any
language validate against it). The featurizer parses every request, so validation here is
hand-written, fast checks in a fixed order rather than a generic JSON Schema engine;
``tests/schemas/test_schemas.py`` checks on a corpus and on generated documents that they accept
exactly what the schema accepts (but for the finiteness of ``features_bin`` values, which no
schema can see). A rejected request raises :class:`InvalidRequest` with a machine-readable
``reason`` that goes to ``deadletter``; nothing here raises anything else on bad input.

**source_id**, ``"<stream>/<partition>@<offset>"``: a featurizer stamps each delta with the
stream, partition and the last input offset the delta covers. A delta re-produced after a
featurizer crash (transactional outbox replay) therefore carries a source offset the ledger has
already covered, and the ledger skips it. The ledger, the verifier and the featurizer all read
the convention from here (docs/featurizer.md).
"""

from __future__ import annotations

import base64
import binascii
import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

import numpy as np
import orjson

from unlearn.schemas.json_keys import duplicate_key

__all__ = [
    "FEATURE_DTYPES",
    "ID_CHARS",
    "ID_MAX_CHARS",
    "is_valid_id",
    "LABEL_MAX",
    "OPS",
    "REQUEST_REASONS",
    "REQUEST_SCHEMA_V1",
    "SEALED_KEY_ID_CHARS",
    "FeatureDtype",
    "FeaturesInput",
    "ImageInput",
    "Input",
    "InvalidRequest",
    "Op",
    "Request",
    "SealedInput",
    "TextInput",
    "encode_request",
    "input_to_dict",
    "parse_inner_input",
    "parse_request",
    "request_from_dict",
    "request_to_dict",
]

REQUEST_SCHEMA_V1 = "unlearn.request/v1"
Op = Literal["add", "delete", "delete_subject"]
OPS: tuple[str, ...] = ("add", "delete", "delete_subject")
ID_MAX_CHARS = 128  # ids are message keys and ledger keys: bounded (schema: $defs/id)
#: The id grammar (schema: $defs/id). Ids become message keys, ledger and cache keys and log
#: fields: a closed alphabet keeps newlines (forged log lines), path separators, control and
#: look-alike characters out of all of them. '@' and '+' admit e-mail addresses as subject ids.
ID_CHARS = "A-Za-z0-9._:@+-"
_ID_RE = re.compile(f"[{ID_CHARS}]{{1,{ID_MAX_CHARS}}}")
LABEL_MAX = 2**31 - 1  # a class index fits int32 in any language (schema: label.maximum)

_ID_FIELDS = ("event_id", "head_id", "client_id", "subject_id")
_ALLOWED = frozenset(
    ("schema", "event_id", "op", "head_id", "client_id", "subject_id", "sample_id", "label", "input", "ts")
)
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

REQUEST_REASONS: dict[str, str] = {
    "not_json": "the bytes are not UTF-8 JSON (orjson: also non-finite numbers like 1e999)",
    "not_object": "the JSON value is not an object",
    "duplicate_key": "an object holds one key twice (also written with escapes, e.g. head\\u005fid after "
                     "head_id): parsers disagree on which value counts",
    "missing_field:<name>": "a required field is absent (schema first)",
    "unknown_schema_version": "`schema` is not 'unlearn.request/v1'",
    "unknown_field:<name>": "a field the schema does not define",
    "bad_field:<name>": "an id field is not 1..128 characters of [A-Za-z0-9._:@+-]",
    "bad_op": "op is not add | delete | delete_subject",
    "unexpected_field:<name>": "a field the op does not take (label/input on delete, ...)",
    "bad_label": "label is not an int in 0..2^31-1 nor a non-empty list of numbers",
    "bad_input": "input is not an object with a string `kind` and exactly that kind's fields",
    "bad_input_kind": "input.kind is not features | features_bin | text | image | sealed",
    "bad_features": "input.values is not a non-empty list of numbers, or features_bin data is empty or "
                    "not a whole number of values",
    "bad_features_dtype": "features_bin input.dtype is not '<f4' | '<f8'",
    "non_finite_feature": "a feature value is NaN or infinite (a features_bin bit pattern, or encode side)",
    "non_finite_label": "a label vector value is NaN or infinite (encode side)",
    "bad_text": "input.text is not a non-empty string",
    "bad_image_format": "input.format is not 'png'",
    "bad_base64": "input.data (image, features_bin) is not padded standard base64 (image: >= 4 characters)",
    "bad_ts": "ts is not a number >= 0",
    "bad_sealed_input": "a sealed input's key_id is not 32 lowercase hex characters, or its epk (32 bytes), "
                        "nonce (12 bytes) or ciphertext (>= 16 bytes) is not padded standard base64 of that size",
}
"""Every reason code ``parse_request`` can give (``<name>`` is the field name)."""


class InvalidRequest(ValueError):
    """A request that must go to deadletter: ``reason`` is machine-readable, ``detail`` human."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


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
    """An input sealed for transit (``schemas/sealed.py``): the featurizer opens it into one of
    the other kinds right after parsing, under its by-head partition's transit key ``key_id``."""

    key_id: str
    epk: bytes
    nonce: bytes
    ciphertext: bytes
    kind: Literal["sealed"] = field(default="sealed", init=False)


Input = FeaturesInput | TextInput | ImageInput | SealedInput


@dataclass(frozen=True, slots=True)
class Request:
    """One validated request. ``label`` is an int (class index) or a tuple of floats."""

    event_id: str
    op: Op
    head_id: str
    client_id: str
    subject_id: str
    sample_id: str | None = None
    label: int | tuple[float, ...] | None = None
    input: Input | None = None
    ts: float | None = None

    def __post_init__(self) -> None:
        label = self.label
        if label is not None and not isinstance(label, (int, tuple)):
            if isinstance(label, numbers.Integral):  # numpy integer scalars
                object.__setattr__(self, "label", int(label))
            elif isinstance(label, Iterable):
                object.__setattr__(self, "label", _float_tuple(label))

    @property
    def schema(self) -> str:
        return REQUEST_SCHEMA_V1


def _float_tuple(values: Iterable[Any]) -> tuple[float, ...]:
    """Lists, tuples and numpy arrays to a tuple of Python floats (the JSON number type)."""
    tolist = getattr(values, "tolist", None)
    return tuple(map(float, tolist() if tolist is not None else values))


def _feature_array(values: Any, dtype: object) -> np.ndarray:
    """``values`` as FeaturesInput keeps them: read-only 1-D, float32 for '<f4' else float64.
    The parser's own arrays are kept as they are; anything else is copied (the caller's array
    may change later). InvalidRequest for an unknown dtype or what is not a vector of numbers."""
    if dtype is not None and dtype not in FEATURE_DTYPES:
        raise _fail("bad_features_dtype", f"features dtype must be '<f4' | '<f8' or None (JSON), got {_short(dtype)}")
    want = np.float32 if dtype == "<f4" else np.float64
    if type(values) is np.ndarray and values.dtype == want and values.ndim == 1 and not values.flags.writeable:
        return values
    try:
        with np.errstate(over="ignore"):  # float64 beyond float32 range: inf, refused as non-finite
            arr = np.array(values, dtype=want)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _fail("bad_features", f"features must be a vector of numbers: {exc}") from None
    if arr.ndim != 1:
        raise _fail("bad_features", f"features must be a 1-D vector, got shape {arr.shape}")
    arr.flags.writeable = False
    return arr


# --------------------------------------------------------------------------- validation
def _fail(reason: str, detail: str) -> InvalidRequest:
    return InvalidRequest(reason, detail)


def _is_number(v: object) -> bool:
    # bool is an int subclass in Python but not a JSON Schema number.
    return (type(v) is float) or (type(v) is int)


def is_valid_id(v: object) -> bool:
    """Whether ``v`` is an id: 1..128 characters of ``[A-Za-z0-9._:@+-]`` (ID_CHARS)."""
    return type(v) is str and _ID_RE.fullmatch(v) is not None


def _check_id(d: Mapping[str, Any], name: str) -> str:
    v = d[name]
    if not is_valid_id(v):
        raise _fail(f"bad_field:{name}", f"{name} must be 1..{ID_MAX_CHARS} characters of [{ID_CHARS}], "
                                         f"got {_short(v)}")
    return v


def _number_list(v: object, reason: str, what: str, non_finite: str) -> tuple[float, ...]:
    if type(v) is not list or not v:
        raise _fail(reason, f"{what} must be a non-empty list of numbers, got {_short(v)}")
    for x in v:
        if not _is_number(x):
            raise _fail(reason, f"{what} must hold only numbers, found {_short(x)}")
    try:
        out = tuple(map(float, v))
    except OverflowError:  # an int too large for a float64 is not finite as a feature
        raise _fail(non_finite, f"{what} holds a number beyond float64 range") from None
    # Fast path: a finite sum means every term is finite; only a non-finite sum (a NaN/inf, or
    # an overflow of finite terms) needs the per-element look.
    if not math.isfinite(sum(out)) and not all(map(math.isfinite, out)):
        raise _fail(non_finite, f"{what} holds NaN or an infinity")
    return out


def _feature_list(v: object) -> np.ndarray:
    """``input.values``: the float64 array of a non-empty JSON array of finite numbers. One C-level
    pass checks the element types and one makes the array (no Python loop over the values)."""
    if type(v) is not list or not v:
        raise _fail("bad_features", f"input.values must be a non-empty list of numbers, got {_short(v)}")
    if not _NUMBER_TYPES.issuperset(map(type, v)):
        bad = next(x for x in v if type(x) not in _NUMBER_TYPES)
        raise _fail("bad_features", f"input.values must hold only numbers, found {_short(bad)}")
    try:
        arr = np.array(v, dtype=np.float64)
    except OverflowError:  # an int too large for a float64 is not finite as a feature
        raise _fail("non_finite_feature", "input.values holds a number beyond float64 range") from None
    _check_finite(arr)
    arr.flags.writeable = False
    return arr


def _feature_bytes(dtype: object, data: object) -> np.ndarray:
    """``features_bin``: a read-only view of the decoded bytes as ``dtype`` (no copy, no floats
    in Python), after the checks the schema cannot make (whole values, finite bit patterns)."""
    if type(dtype) is not str or dtype not in FEATURE_DTYPES:
        raise _fail("bad_features_dtype", f"input.dtype must be '<f4' | '<f8', got {_short(dtype)}")
    if type(data) is not str:
        raise _fail("bad_base64", f"input.data must be a base64 string, got {_short(data)}")
    raw = _b64decode(data)
    size = 4 if dtype == "<f4" else 8
    if not raw or len(raw) % size:
        raise _fail("bad_features", f"input.data holds {len(raw)} bytes: not a non-empty whole number of "
                                    f"{size}-byte {dtype} values")
    arr = np.frombuffer(raw, dtype=dtype)
    _check_finite(arr)
    return arr


def _check_finite(arr: np.ndarray) -> None:
    if not np.isfinite(arr).all():
        raise _fail("non_finite_feature", "input holds a NaN or infinite feature value")


def _check_label(v: object) -> int | tuple[float, ...]:
    if type(v) is int or (type(v) is float and v.is_integer()):
        if not 0 <= v <= LABEL_MAX:
            raise _fail("bad_label", f"a class index must be in 0..{LABEL_MAX}, got {_short(v)}")
        return int(v)
    if type(v) is list:
        return _number_list(v, "bad_label", "label", "non_finite_label")
    raise _fail("bad_label", f"label must be a class index (int >= 0) or a list of numbers, got {_short(v)}")


def _is_op(v: object) -> TypeGuard[Op]:
    return type(v) is str and v in OPS


def _check_input(v: object) -> Input:
    if type(v) is not dict:
        raise _fail("bad_input", f"input must be an object, got {_short(v)}")
    kind = v.get("kind")
    if kind is None:
        raise _fail("bad_input", "input.kind is missing")
    if type(kind) is not str or kind not in _INPUT_KEYS:
        raise _fail("bad_input_kind",
                    f"input.kind must be features | features_bin | text | image | sealed, got {_short(kind)}")
    wanted = _INPUT_KEYS[kind]
    for key in v:
        if key != "kind" and key not in wanted:
            raise _fail("bad_input", f"input of kind {kind!r} takes no field {key!r}")
    for key in wanted:
        if key not in v:
            raise _fail("bad_input", f"input of kind {kind!r} needs field {key!r}")
    if kind == "features":
        return FeaturesInput(_feature_list(v["values"]))
    if kind == "features_bin":
        return FeaturesInput(_feature_bytes(v["dtype"], v["data"]), v["dtype"])
    if kind == "sealed":
        return _sealed_input(v)
    if kind == "text":
        text = v["text"]
        if type(text) is not str or not text:
            raise _fail("bad_text", f"input.text must be a non-empty string, got {_short(text)}")
        return TextInput(text)
    fmt, data = v["format"], v["data"]
    if fmt != "png":
        raise _fail("bad_image_format", f"input.format must be 'png', got {_short(fmt)}")
    if type(data) is not str or len(data) < 4:
        raise _fail("bad_base64", f"input.data must be a base64 string of >= 4 characters, got {_short(data)}")
    return ImageInput(_b64decode(data), "png")


def _sealed_input(v: dict[str, Any]) -> SealedInput:
    """The sealed kind's fields, sizes checked as the schema does (the opening is the featurizer's)."""
    key_id = v["key_id"]
    if type(key_id) is not str or _KEY_ID_RE.fullmatch(key_id) is None:
        raise _fail("bad_sealed_input", f"input.key_id must be 32 lowercase hex characters, got {_short(key_id)}")
    parts = []
    for name, size, exact in (("epk", 32, True), ("nonce", 12, True), ("ciphertext", 16, False)):
        raw = v[name]
        try:
            b = _b64decode(raw) if type(raw) is str else None
        except InvalidRequest:
            b = None
        if b is None or (len(b) != size if exact else len(b) < size):
            want = f"{size} bytes" if exact else f"at least {size} bytes"
            raise _fail("bad_sealed_input", f"input.{name} must be padded standard base64 of {want}, got {_short(raw)}")
        parts.append(b)
    return SealedInput(key_id, parts[0], parts[1], parts[2])


def parse_inner_input(raw: bytes) -> Input:
    """The inner input object of an opened sealed input (JSON bytes), checked like ``input``;
    a nested sealed input is refused (``bad_sealed_input``)."""
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _fail("bad_sealed_input", f"the opened input is not UTF-8 JSON: {exc}") from None
    if (dup := duplicate_key(raw, d)) is not None:
        raise _fail("duplicate_key", f"the opened input holds the key {dup[:64]!r} twice")
    inp = _check_input(d)
    if isinstance(inp, SealedInput):
        raise _fail("bad_sealed_input", "a sealed input must not hold another sealed input")
    return inp


def _b64decode(data: str) -> bytes:
    """Strict padded standard base64, the schema's pattern: length % 4 == 0, '=' only at the end
    (at most two). binascii's strict mode refuses other characters and misplaced padding in C."""
    try:
        raw = data.encode("ascii")
    except UnicodeEncodeError:
        raise _fail("bad_base64", "input.data holds non-ASCII characters") from None
    if len(raw) % 4:
        raise _fail("bad_base64", "input.data length is not a multiple of 4 (padding missing?)")
    if raw.endswith(b"==="):
        raise _fail("bad_base64", "input.data has more than two '=' of padding")
    try:
        return binascii.a2b_base64(raw, strict_mode=True)
    except binascii.Error as exc:
        raise _fail("bad_base64", f"input.data is not standard base64 (A-Z a-z 0-9 + / and '=' padding): {exc}"
                    ) from None


def request_from_dict(d: object) -> Request:
    """Validate a decoded JSON value against v1 and build a Request (InvalidRequest if not)."""
    if type(d) is not dict:
        raise _fail("not_object", f"a request must be a JSON object, got {type(d).__name__}")
    if "schema" not in d:
        raise _fail("missing_field:schema", "field 'schema' is required (e.g. 'unlearn.request/v1')")
    if d["schema"] != REQUEST_SCHEMA_V1 or type(d["schema"]) is not str:
        raise _fail("unknown_schema_version", f"schema {_short(d['schema'])} is not {REQUEST_SCHEMA_V1!r}")
    for key in d:
        if key not in _ALLOWED:
            raise _fail(f"unknown_field:{key[:64]}", f"field {_short(key)} is not part of {REQUEST_SCHEMA_V1}")
    for name in ("event_id", "op", "head_id", "client_id", "subject_id"):
        if name not in d:
            raise _fail(f"missing_field:{name}", f"field {name!r} is required")
    event_id, head_id, client_id, subject_id = (_check_id(d, n) for n in _ID_FIELDS)
    op = d["op"]
    if not _is_op(op):
        raise _fail("bad_op", f"op must be add | delete | delete_subject, got {_short(op)}")
    if op == "add":
        for name in ("sample_id", "label", "input"):
            if name not in d:
                raise _fail(f"missing_field:{name}", f"op 'add' requires {name!r}")
    elif op == "delete":
        if "sample_id" not in d:
            raise _fail("missing_field:sample_id", "op 'delete' requires 'sample_id'")
        for name in ("label", "input"):
            if name in d:
                raise _fail(
                    f"unexpected_field:{name}", f"op 'delete' takes no {name!r} (the add's features are reused)"
                )
    else:
        for name in ("sample_id", "label", "input"):
            if name in d:
                raise _fail(f"unexpected_field:{name}", f"op 'delete_subject' takes no {name!r}")
    sample_id = _check_id(d, "sample_id") if "sample_id" in d else None
    label = _check_label(d["label"]) if "label" in d else None
    inp = _check_input(d["input"]) if "input" in d else None
    ts = None
    if "ts" in d:
        t = d["ts"]
        try:
            ts = float(t) if _is_number(t) else math.nan
        except OverflowError:
            ts = math.inf
        if not 0 <= ts < math.inf:
            raise _fail("bad_ts", f"ts must be a finite number >= 0 (Unix seconds), got {_short(t)}")
    return Request(event_id, op, head_id, client_id, subject_id, sample_id, label, inp, ts)


def parse_request(raw: bytes | bytearray | memoryview | str) -> Request:
    """Decode and validate one ``requests`` message value; InvalidRequest on anything wrong."""
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _fail("not_json", f"not valid UTF-8 JSON: {exc}") from None
    except TypeError as exc:  # e.g. None as the message value (a tombstone)
        raise _fail("not_json", f"no JSON bytes: {exc}") from None
    if (dup := duplicate_key(raw, d)) is not None:
        raise _fail("duplicate_key", f"the key {dup[:64]!r} appears twice in one object: its value is ambiguous")
    return request_from_dict(d)


# --------------------------------------------------------------------------- encoding
def request_to_dict(req: Request) -> dict[str, Any]:
    """The JSON object for ``req`` (only the fields its op takes; image data base64)."""
    d: dict[str, Any] = {
        "schema": REQUEST_SCHEMA_V1,
        "event_id": req.event_id,
        "op": req.op,
        "head_id": req.head_id,
        "client_id": req.client_id,
        "subject_id": req.subject_id,
    }
    if req.sample_id is not None:
        d["sample_id"] = req.sample_id
    if req.label is not None:
        d["label"] = list(req.label) if isinstance(req.label, tuple) else req.label
    if req.input is not None:
        d["input"] = input_to_dict(req.input)
    if req.ts is not None:
        d["ts"] = req.ts
    return d


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
    raise _fail("bad_input", f"input must be FeaturesInput | TextInput | ImageInput | SealedInput, "
                             f"got {type(inp).__name__}")


def encode_request(req: Request) -> bytes:
    """Bytes for the ``requests`` topic (key it by ``req.subject_id``).

    Validates first with the same checks as the consumer, so a producer learns about a bad
    request (e.g. a NaN feature, which JSON cannot carry) at the source, not from deadletter.
    """
    d = request_to_dict(req)
    request_from_dict(d)
    return orjson.dumps(d)


def encode_requests(reqs: Iterable[Request]) -> list[bytes]:
    """Many at once (a convenience for loaders and benchmarks)."""
    return [encode_request(r) for r in reqs]


def _short(v: object, limit: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


_SOURCE_RE = re.compile(r"^(.*)/(\d+)@(\d+)$")


def format_source_id(partition: int, offset: int, stream: str = "requests") -> str:
    """``"<stream>/<partition>@<offset>"`` for a delta covering ``partition`` up to ``offset``."""
    if partition < 0 or offset < 0:
        raise ValueError(f"partition and offset must be >= 0, got {partition}, {offset}")
    if not stream:
        raise ValueError("stream must be non-empty")
    return f"{stream}/{int(partition)}@{int(offset)}"


def parse_source(source_id: str) -> tuple[str, int, int] | None:
    """``"<stream>/<partition>@<offset>"`` -> (stream, partition, offset); None if not that form."""
    m = _SOURCE_RE.match(source_id) if isinstance(source_id, str) else None
    if m is None or not m.group(1):
        return None
    return m.group(1), int(m.group(2)), int(m.group(3))


def parse_source_id(source_id: str) -> tuple[int, int] | None:
    """``"<stream>/<partition>@<offset>"`` -> (partition, offset); None if not that form. For
    callers that know the stream already; use :func:`parse_source` when the stream matters
    (federated sites use their own stream names)."""
    parsed = parse_source(source_id)
    return None if parsed is None else (parsed[1], parsed[2])


def dedup_key(source_id: str) -> tuple[str, int] | None:
    """("<stream>/<partition>", offset): what the ledger tracks per head to skip re-produced
    deltas; None for sources outside the convention (no producer-side dedup for them)."""
    parsed = parse_source(source_id)
    return None if parsed is None else (f"{parsed[0]}/{parsed[1]}", parsed[2])


def source_stream(requests_topic: str, topic_prefix: str = "", client_id: str | None = None) -> str:
    """The stream name in source ids: the requests topic without the deployment prefix (so the
    shared topic is ``"requests"``), plus ``[<client_id>]`` for a federated site, so deltas of
    different sites never share a dedup key in the ledger."""
    name = requests_topic
    if topic_prefix and name.startswith(topic_prefix) and len(name) > len(topic_prefix):
        name = name[len(topic_prefix):]
    return f"{name}[{client_id}]" if client_id is not None else name
