"""Dead letters keep no plaintext raw input (docs/erasure.md sections 1 and 10).

A refused add of a sample the featurizer holds no key for (bad dimension, label out of range, an
unsealed input while sealed ones are required, ...) would otherwise keep its raw input in
``deadletter`` in plaintext, where no later delete of the subject can reach it (nothing indexes
refused samples by subject). :func:`redact_original` replaces the request's ``input`` by
``{"kind": <kind>, "redacted": true}`` and keeps the rest of the envelope (ids, op, label, schema,
ts), so the operator still sees what was refused and why; the dead letter names the record's
place in ``requests``, where the full input stays until retention or its transit key's
destruction. No hash of the input is kept: a short text could be guessed from one.

- A sealed input (``kind`` "sealed", only the sealed fields) is kept: it is ciphertext, noise once
  its transit key is destroyed.
- Any other ``input`` (a plaintext kind, an unknown kind, or not even an object) is redacted.
- Bytes that are not a JSON object, or an object without ``input``, are kept as they are: there
  is no input to take out and nothing to attribute the bytes to.
- An object with a repeated key is written again from what the parser kept (the last value of
  each key), so an earlier plaintext ``input`` cannot hide behind a later sealed or null one.

Pure, and never raises: the featurizer calls it on every refused request.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["SEALED_FIELDS", "is_redacted", "redact_original"]

SEALED_FIELDS = frozenset({"kind", "key_id", "epk", "nonce", "ciphertext"})
"""The fields of a sealed input (docs/formats.md, "Sealed inputs"): one with more is redacted."""


def _is_sealed(value: Any) -> bool:
    return type(value) is dict and value.get("kind") == "sealed" and set(value) <= SEALED_FIELDS


def redact_original(raw: bytes) -> bytes:
    """``raw`` with a plaintext ``input`` replaced by ``{"kind": ..., "redacted": true}`` (module
    docstring); ``raw`` itself when there is none to take out."""
    dup = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal dup
        out = dict(items)
        dup = dup or len(out) < len(items)
        return out

    try:
        # the standard parser, not orjson: it also reads integers beyond 64 bits, so such a
        # request (refused as invalid by the featurizer) is redacted too
        doc = json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, RecursionError, TypeError):  # not JSON (UnicodeDecodeError is a ValueError)
        return raw
    if type(doc) is not dict or "input" not in doc:
        return raw
    inp = doc["input"]
    if inp is None or _is_sealed(inp):
        if not dup:
            return raw
        # a repeated key: the parser kept the last value, an earlier "input" may be plaintext
    else:
        kind = inp.get("kind") if type(inp) is dict else None
        doc["input"] = {"kind": kind, "redacted": True} if isinstance(kind, str) else {"redacted": True}
    try:
        return json.dumps(doc, separators=(",", ":"), allow_nan=True).encode()
    except (ValueError, RecursionError):  # cannot happen for what json.loads returned; never raise
        return raw


def is_redacted(raw: bytes) -> bool:
    """Whether ``raw`` is a request whose ``input`` :func:`redact_original` took out (what
    ``erasure-report`` counts as clear: no raw input left to read)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError, TypeError):
        return False
    inp = doc.get("input") if type(doc) is dict else None
    return type(inp) is dict and inp.get("redacted") is True and set(inp) <= {"kind", "redacted"}
