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

The ledger's dead letters of refused ``deltas`` messages (every reason: ``bad_delta``,
``wrong_partition``, ``unknown_head`` and the per-entry rejections) go through
:func:`redact_delta` under the same setting:

- A message that decodes and holds only sealed entries (rows sealed per sample) is kept as sent:
  ciphertext, noise once the samples' keys are destroyed, and an operator can replay it.
- Anything else (plaintext rows, a packed entry, whose ledger blob is a Gram matrix of rows, or
  bytes that do not decode: a corrupt or truncated message still holds its rows) becomes a JSON
  summary (``"schema": "unlearn.redacted-delta/v1"``) of what decodes: head, source, grid, and
  per entry its kind, sign, row count and event, sample and subject ids; no row, label, blob or
  hash bytes. The full message is at the dead letter's ``source`` in ``deltas``.

Pure, and never raises: the featurizer calls it on every refused request, the ledger on every
refused delta.
"""

from __future__ import annotations

import json
from typing import Any

from unlearn.schemas.delta_codec import DELTA_MAGIC, PackedEntry, RowsEntry, SealedRowsEntry, decode_delta

__all__ = ["REDACTED_DELTA_SCHEMA", "SEALED_FIELDS", "is_redacted", "readable_delta", "redact_delta",
           "redact_original"]

REDACTED_DELTA_SCHEMA = "unlearn.redacted-delta/v1"
"""The ``schema`` of :func:`redact_delta`'s summary of a refused ``deltas`` message."""

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


_KINDS = {RowsEntry: "rows", PackedEntry: "packed", SealedRowsEntry: "sealed"}


def redact_delta(raw: bytes) -> bytes:
    """``raw`` when it is a delta of sealed entries only, else a JSON summary without a single
    row, label or ledger value (module docstring): what the ledger's dead letter keeps."""
    summary: dict[str, Any] = {"schema": REDACTED_DELTA_SCHEMA, "bytes": len(raw)}
    try:
        delta = decode_delta(raw)
    except Exception as exc:  # never raise: CodecError is expected, anything else is redacted alike
        summary["decoded"] = False
        summary["error"] = type(exc).__name__
        return json.dumps(summary, separators=(",", ":")).encode()
    if delta.entries and all(isinstance(e, SealedRowsEntry) for e in delta.entries):
        return raw
    summary.update(decoded=True, head_id=delta.head_id, source_id=delta.source_id, d=delta.d,
                   frac_bits=delta.frac_bits, label_frac_bits=delta.label_frac_bits,
                   entries=[{"kind": _KINDS.get(type(e), "unknown"), "sign": e.sign, "n": e.n,
                             "event_ids": list(e.event_ids), "sample_ids": list(e.sample_ids),
                             "subject_ids": list(e.subject_ids)} for e in delta.entries])
    return json.dumps(summary, separators=(",", ":")).encode()


def readable_delta(raw: bytes, head_id: str, subject_id: str) -> str | None:
    """Why a dead letter's original ``raw`` (a refused delta kept as sent:
    UNLEARN_DEADLETTER_INPUTS=keep) still holds readable rows of the subject in this head, or
    None (what ``erasure-report`` checks). Undecodable bytes count when they name the subject."""
    if raw[:4] != DELTA_MAGIC:
        return None
    try:
        delta = decode_delta(raw)
    except Exception:  # never raise: a corrupt delta still holds its rows
        return "an undecodable delta naming the subject" if subject_id.encode() in raw else None
    if delta.head_id != head_id:
        return None
    n = sum(e.subject_ids.count(subject_id) for e in delta.entries if not isinstance(e, SealedRowsEntry))
    return f"a plaintext delta with {n} rows of the subject" if n else None


def is_redacted(raw: bytes) -> bool:
    """Whether ``raw`` is a request whose ``input`` :func:`redact_original` took out, or
    :func:`redact_delta`'s summary of a delta (what ``erasure-report`` counts as clear: no raw
    input or row left to read)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError, TypeError):
        return False
    if type(doc) is dict and doc.get("schema") == REDACTED_DELTA_SCHEMA:
        return True
    inp = doc.get("input") if type(doc) is dict else None
    return type(inp) is dict and inp.get("redacted") is True and set(inp) <= {"kind", "redacted"}
