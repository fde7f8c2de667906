"""``deadletter`` records: whatever a stage could not process, with the reason and the bytes.

Anything rejected anywhere (a malformed request, an unknown schema version, a delete of a sample
that is not there, a corrupt delta) goes here instead of crashing the stage or being dropped
silently. The record keeps the original key and value bytes (base64) and where they came from,
so an operator can inspect, fix and replay them (the featurizer redacts a request's plaintext
input first, the ledger a delta's plaintext rows, ``schemas/redaction.py``: the full message is at
the record's source). JSON, because
operators and other languages read it; the payload itself stays opaque bytes.
"""

from __future__ import annotations

import base64
import binascii
import math
import time
from dataclasses import dataclass
from typing import Any

import orjson

from unlearn.schemas.binary_frame import CodecError

__all__ = [
    "DEADLETTER_SCHEMA_V1",
    "STAGES",
    "DeadLetter",
    "deadletter_for",
    "decode_deadletter",
    "encode_deadletter",
    "encode_deadletter_bounded",
]

DEADLETTER_SCHEMA_V1 = "unlearn.deadletter/v1"
STAGES: tuple[str, ...] = ("featurizer", "ledger", "serving", "receipts", "client")
"""Known stages; other short identifiers are accepted (new services need no schema change)."""
_STAGE_MAX = 64


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One rejected message. ``reason`` is a machine-readable code (see docs/formats.md)."""

    original: bytes
    reason: str
    detail: str
    stage: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    key: bytes | None = None
    event_id: str | None = None
    ts: float = 0.0


def deadletter_for(
    original: bytes | None,
    error: BaseException,
    stage: str,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    key: bytes | None = None,
    event_id: str | None = None,
    ts: float | None = None,
) -> DeadLetter:
    """Build a record from an exception. An error with a ``reason`` attribute (InvalidRequest)
    keeps its code; a CodecError becomes ``codec_error``; anything else ``internal_error``."""
    reason = getattr(error, "reason", None)
    if not isinstance(reason, str) or not reason:
        reason = "codec_error" if isinstance(error, CodecError) else "internal_error"
    detail = getattr(error, "detail", None) or str(error) or type(error).__name__
    return DeadLetter(
        original=original or b"",
        reason=reason,
        detail=str(detail),
        stage=stage,
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        event_id=event_id,
        ts=time.time() if ts is None else ts,
    )


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode("ascii")


def encode_deadletter(rec: DeadLetter) -> bytes:
    """JSON bytes for the ``deadletter`` topic (key it by the original key, or by stage)."""
    _validate(rec, CodecError)
    d: dict[str, Any] = {
        "schema": DEADLETTER_SCHEMA_V1,
        "reason": rec.reason,
        "detail": rec.detail,
        "stage": rec.stage,
        "source": {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset},
        "key": _b64(rec.key),
        "original": _b64(bytes(rec.original)),
        "event_id": rec.event_id,
        "ts": rec.ts,
    }
    return orjson.dumps(d)


def _validate(rec: DeadLetter, err: type[Exception]) -> None:
    if not isinstance(rec.reason, str) or not rec.reason:
        raise err("deadletter: reason must be a non-empty string")
    if not isinstance(rec.detail, str):
        raise err("deadletter: detail must be a string")
    if not isinstance(rec.stage, str) or not 1 <= len(rec.stage) <= _STAGE_MAX:
        raise err(f"deadletter: stage must be a string of 1..{_STAGE_MAX} characters")
    if rec.topic is not None and not isinstance(rec.topic, str):
        raise err("deadletter: topic must be a string or null")
    for name in ("partition", "offset"):
        v = getattr(rec, name)
        if v is not None and (type(v) is not int or v < -1):
            raise err(f"deadletter: {name} must be an int >= -1 or null")
    if rec.event_id is not None and not isinstance(rec.event_id, str):
        raise err("deadletter: event_id must be a string or null")
    if type(rec.ts) not in (int, float) or not (math.isfinite(rec.ts) and rec.ts >= 0):
        raise err("deadletter: ts must be a finite number >= 0")


def decode_deadletter(raw: bytes | bytearray | memoryview) -> DeadLetter:
    """Parse a deadletter record; CodecError if it is not a valid v1 record."""
    try:
        d = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError) as exc:
        raise CodecError(f"deadletter: not JSON: {exc}") from None
    if type(d) is not dict:
        raise CodecError("deadletter: not a JSON object")
    if d.get("schema") != DEADLETTER_SCHEMA_V1:
        raise CodecError(f"deadletter: unknown schema {d.get('schema')!r}")
    src = d.get("source")
    if type(src) is not dict:
        raise CodecError("deadletter: source must be an object")
    try:
        original = base64.b64decode(d["original"], validate=True)
        key = None if d.get("key") is None else base64.b64decode(d["key"], validate=True)
        rec = DeadLetter(
            original=original,
            reason=d["reason"],
            detail=d["detail"],
            stage=d["stage"],
            topic=src.get("topic"),
            partition=src.get("partition"),
            offset=src.get("offset"),
            key=key,
            event_id=d.get("event_id"),
            ts=d["ts"],
        )
    except KeyError as exc:
        raise CodecError(f"deadletter: missing field {exc.args[0]!r}") from None
    except (binascii.Error, TypeError, ValueError) as exc:
        raise CodecError(f"deadletter: bad base64 in original/key: {exc}") from None
    _validate(rec, CodecError)
    return rec


def encode_deadletter_bounded(d: DeadLetter, max_bytes: int) -> bytes:
    """The record's JSON, at most about ``max_bytes``: a huge original (base64 grows it by 4/3) is
    truncated, and the detail says so, rather than failing delivery forever (a poison pill)."""
    value = encode_deadletter(d)
    if len(value) <= max_bytes:
        return value
    keep = max(0, max_bytes // 2 - len(d.detail) - 4096)
    short = DeadLetter(d.original[:keep], d.reason,
                       f"{d.detail} [original truncated from {len(d.original)} to {keep} bytes]",
                       d.stage, d.topic, d.partition, d.offset, d.key, d.event_id, d.ts)
    return encode_deadletter(short)
