"""Duplicated JSON object keys: one request, one meaning (``duplicate_key``).

JSON parsers disagree on ``{"head_id": "a", "head_id": "b"}`` (RFC 8259 leaves it undefined;
orjson and Python keep the last value, others the first or refuse), and ``"head\\u005fid"`` is the
same name written otherwise. A request whose meaning depends on which parser reads it is refused.

The check costs next to nothing for ordinary requests: without a backslash every ``"`` delimits a
string, so a key held twice is a string written twice; only bytes with a backslash or a key's
name written twice as a string (possibly as a value) are parsed again, by the standard library
with a hook that sees every member.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

__all__ = ["duplicate_key"]


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise _Duplicate(k)
        seen[k] = v
    return seen


def _keys(obj: Any) -> list[str]:
    """Every object key in a parsed JSON value (a request nests objects two levels deep)."""
    out: list[str] = []
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            out += v.keys()
            stack += [x for x in v.values() if isinstance(x, dict | list)]
        elif isinstance(v, list):
            stack += [x for x in v if isinstance(x, dict | list)]
    return out


def _no_repeated_key(data: bytes, parsed: Any) -> bool:
    """True only when no object of ``data`` (valid JSON without a backslash) can hold a key twice.
    Without a backslash every ``"`` delimits a string, so the strings are the odd pieces of
    ``data.split(b'"')``, and a key held twice is a string written twice: one split (one pass over
    the bytes) instead of a search of the whole request per key; the keys are only collected when
    some string repeats (a value may repeat a key's name or another value)."""
    strings = data.split(b'"')[1::2]
    if len(set(strings)) == len(strings):
        return True
    counts = Counter(strings)
    return all(counts[k.encode()] == 1 for k in _keys(parsed))


def duplicate_key(raw: bytes | bytearray | memoryview | str, parsed: Any) -> str | None:
    """The first key an object of ``raw`` holds twice (``parsed``: its value as orjson read it),
    or None."""
    data = raw.encode() if isinstance(raw, str) else bytes(raw)
    if b"\\" not in data and _no_repeated_key(data, parsed):
        return None
    try:
        json.loads(data, object_pairs_hook=_unique)
    except _Duplicate as dup:
        return dup.key
    except ValueError:  # orjson read it; what the standard library refuses is no duplicate
        return None
    return None
