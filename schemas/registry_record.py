"""What the records of the versioned registries share: a strict JSON document per version.

``head-registry`` (``schemas/head_contract.py``) and ``client-registry``
(``schemas/client_record.py``) both keep one JSON object per version of a key: a ``schema``
tag, an id field that is also the record key, a ``version`` >= 1, and fields of their own.
Both parsers refuse the same things the same way (not JSON, not an object, another schema,
unknown or missing fields, a value of the wrong type, ``true`` where a number is wanted), each
with its own error type, naming the first problem. These helpers are that common part, so the
two formats cannot drift apart in how strict they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from unlearn.schemas.envelope import ID_CHARS, ID_MAX_CHARS, is_valid_id

__all__ = ["ID_GRAMMAR", "check_id_and_version", "load_document", "open_document", "require_fields", "typed"]

ID_GRAMMAR = f"1..{ID_MAX_CHARS} characters of [{ID_CHARS}]"
"""What an id (a head id, a client id, a key id) may be, as error messages say it."""


def check_id_and_version(field: str, value: str, version: int, error: type[ValueError]) -> None:
    """The range rules every registry record has, so both formats word them alike: its id
    ``field`` (the record key) is a valid id and its version is at least 1."""
    if not is_valid_id(value):
        raise error(f"{field} must be {ID_GRAMMAR}, got {value!r}")
    if not version >= 1:
        raise error(f"version must be >= 1, got {version}")


def load_document(raw: bytes, error: type[ValueError]) -> Any:
    """The JSON value of a record, raising ``error`` (not orjson's own) for bad JSON so that
    readers skip it like any other invalid record."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise error(f"not JSON: {exc}") from None


def open_document(d: Any, *, schema: str, fields: Iterable[str], what: str,
                  error: type[ValueError]) -> dict[str, Any]:
    """``d`` as a JSON object of ``schema`` with no field outside ``fields``; raises ``error``
    naming the first problem (``what``: "a head contract", ...), so a record of another format
    or a newer version is refused, never half-read."""
    if not isinstance(d, dict):
        raise error(f"{what} must be a JSON object, got {type(d).__name__}")
    if d.get("schema") != schema:
        raise error(f"schema must be {schema!r}, got {d.get('schema')!r}")
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise error(f"unknown field(s): {', '.join(unknown)}")
    return d


def require_fields(d: dict[str, Any], names: Iterable[str], error: type[ValueError]) -> None:
    """Raise ``error`` naming the first of ``names`` missing from ``d`` (no defaults for them)."""
    for name in names:
        if name not in d:
            raise error(f"missing field: {name}")


def typed(d: dict[str, Any], name: str, kind: type | tuple[type, ...], error: type[ValueError]) -> Any:
    """``d[name]`` when it is a ``kind``, else ``error``; a JSON ``true``/``false`` counts as a
    bool only (Python would take it for an int), so ``"version": true`` is refused."""
    v = d[name]
    if (isinstance(v, bool) and kind is not bool) or not isinstance(v, kind):
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise error(f"{name} must be a {want}, got {type(v).__name__}")
    return v
