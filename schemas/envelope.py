"""The request envelope (``unlearn.request/v1``): parse, validate, encode.

The contract is ``schemas/request.v1.schema.json`` (upstream apps in any language validate
against it). The featurizer parses every request, so validation here is hand-written, fast
checks in a fixed order rather than a generic JSON Schema engine; ``tests/schemas/test_envelope.py``
checks on a corpus and on generated documents that they accept exactly what the schema accepts
(but for the finiteness of ``features_bin`` values, which no schema can see). A rejected request
raises :class:`~unlearn.schemas.request_errors.InvalidRequest` with a machine-readable ``reason``
that goes to ``deadletter``; nothing here raises anything else on bad input. The add's ``input``
is parsed by ``schemas/request_inputs.py``, the ``source_id`` convention is ``schemas/source_id.py``.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

import orjson

from unlearn.schemas.json_keys import duplicate_key
from unlearn.schemas.request_errors import fail, short_repr
from unlearn.schemas.request_inputs import Input, check_input, input_to_dict

__all__ = [
    "ID_CHARS",
    "ID_MAX_CHARS",
    "is_valid_id",
    "LABEL_MAX",
    "OPS",
    "REQUEST_SCHEMA_V1",
    "Op",
    "Request",
    "encode_request",
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


# --------------------------------------------------------------------------- validation


def _is_number(v: object) -> bool:
    # bool is an int subclass in Python but not a JSON Schema number.
    return (type(v) is float) or (type(v) is int)


def is_valid_id(v: object) -> bool:
    """Whether ``v`` is an id: 1..128 characters of ``[A-Za-z0-9._:@+-]`` (ID_CHARS)."""
    return type(v) is str and _ID_RE.fullmatch(v) is not None


def _check_id(d: Mapping[str, Any], name: str) -> str:
    v = d[name]
    if not is_valid_id(v):
        raise fail(f"bad_field:{name}", f"{name} must be 1..{ID_MAX_CHARS} characters of [{ID_CHARS}], "
                                         f"got {short_repr(v)}")
    return v


def _number_list(v: object, reason: str, what: str, non_finite: str) -> tuple[float, ...]:
    if type(v) is not list or not v:
        raise fail(reason, f"{what} must be a non-empty list of numbers, got {short_repr(v)}")
    for x in v:
        if not _is_number(x):
            raise fail(reason, f"{what} must hold only numbers, found {short_repr(x)}")
    try:
        out = tuple(map(float, v))
    except OverflowError:  # an int too large for a float64 is not finite as a feature
        raise fail(non_finite, f"{what} holds a number beyond float64 range") from None
    # Fast path: a finite sum means every term is finite; only a non-finite sum (a NaN/inf, or
    # an overflow of finite terms) needs the per-element look.
    if not math.isfinite(sum(out)) and not all(map(math.isfinite, out)):
        raise fail(non_finite, f"{what} holds NaN or an infinity")
    return out


def _check_label(v: object) -> int | tuple[float, ...]:
    if type(v) is int or (type(v) is float and v.is_integer()):
        if not 0 <= v <= LABEL_MAX:
            raise fail("bad_label", f"a class index must be in 0..{LABEL_MAX}, got {short_repr(v)}")
        return int(v)
    if type(v) is list:
        return _number_list(v, "bad_label", "label", "non_finite_label")
    raise fail("bad_label", f"label must be a class index (int >= 0) or a list of numbers, got {short_repr(v)}")


def _is_op(v: object) -> TypeGuard[Op]:
    return type(v) is str and v in OPS


def request_from_dict(d: object) -> Request:
    """Validate a decoded JSON value against v1 and build a Request (InvalidRequest if not)."""
    if type(d) is not dict:
        raise fail("not_object", f"a request must be a JSON object, got {type(d).__name__}")
    if "schema" not in d:
        raise fail("missing_field:schema", "field 'schema' is required (e.g. 'unlearn.request/v1')")
    if d["schema"] != REQUEST_SCHEMA_V1 or type(d["schema"]) is not str:
        raise fail("unknown_schema_version", f"schema {short_repr(d['schema'])} is not {REQUEST_SCHEMA_V1!r}")
    for key in d:
        if key not in _ALLOWED:
            raise fail(f"unknown_field:{key[:64]}", f"field {short_repr(key)} is not part of {REQUEST_SCHEMA_V1}")
    for name in ("event_id", "op", "head_id", "client_id", "subject_id"):
        if name not in d:
            raise fail(f"missing_field:{name}", f"field {name!r} is required")
    event_id, head_id, client_id, subject_id = (_check_id(d, n) for n in _ID_FIELDS)
    op = d["op"]
    if not _is_op(op):
        raise fail("bad_op", f"op must be add | delete | delete_subject, got {short_repr(op)}")
    if op == "add":
        for name in ("sample_id", "label", "input"):
            if name not in d:
                raise fail(f"missing_field:{name}", f"op 'add' requires {name!r}")
    elif op == "delete":
        if "sample_id" not in d:
            raise fail("missing_field:sample_id", "op 'delete' requires 'sample_id'")
        for name in ("label", "input"):
            if name in d:
                raise fail(
                    f"unexpected_field:{name}", f"op 'delete' takes no {name!r} (the add's features are reused)"
                )
    else:
        for name in ("sample_id", "label", "input"):
            if name in d:
                raise fail(f"unexpected_field:{name}", f"op 'delete_subject' takes no {name!r}")
    sample_id = _check_id(d, "sample_id") if "sample_id" in d else None
    label = _check_label(d["label"]) if "label" in d else None
    inp = check_input(d["input"]) if "input" in d else None
    ts = None
    if "ts" in d:
        t = d["ts"]
        try:
            ts = float(t) if _is_number(t) else math.nan
        except OverflowError:
            ts = math.inf
        if not 0 <= ts < math.inf:
            raise fail("bad_ts", f"ts must be a finite number >= 0 (Unix seconds), got {short_repr(t)}")
    return Request(event_id, op, head_id, client_id, subject_id, sample_id, label, inp, ts)


def parse_request(raw: bytes | bytearray | memoryview | str) -> Request:
    """Decode and validate one ``requests`` message value; InvalidRequest on anything wrong."""
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise fail("not_json", f"not valid UTF-8 JSON: {exc}") from None
    except TypeError as exc:  # e.g. None as the message value (a tombstone)
        raise fail("not_json", f"no JSON bytes: {exc}") from None
    if (dup := duplicate_key(raw, d)) is not None:
        raise fail("duplicate_key", f"the key {dup[:64]!r} appears twice in one object: its value is ambiguous")
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


