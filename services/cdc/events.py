"""Pure mapping of one Debezium PostgreSQL change event to the head's requests (docs/cdc.md).

No broker, no database: `unlearn cdc` feeds it every record of the change topic, and it answers
with the request envelopes to produce (``docs/formats.md``) and the refusals to dead-letter. Why
each choice:

- **Event time is the source's commit time** (``source.ts_us``, the commit timestamp PostgreSQL
  records in microseconds), so remove wins (docs/featurizer.md) follows the commit order: a row's
  delete is committed after its insert, and a re-insert after its delete. An update that changes
  the label or the features is a delete at the commit time and an add one microsecond later.
- **Event ids are a function of the change** (table, LSN, op, sample), and the request of a
  change is a function of the change alone, so a change Connect redelivers after a crash is the
  same event with the same content: the featurizer counts it once.
- **Anything that cannot become a request is refused** with a reason, never skipped: a NULL, a
  wrong type or a wrong length, an id outside the id alphabet, a TRUNCATE (not applied: refused).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["REASONS", "Refusal", "TableMap", "change_requests", "event_id", "event_us", "features_input", "is_snapshot"]

_ID = re.compile(r"^[A-Za-z0-9._:@+-]{1,128}$")
_PNG = b"\x89PNG\r\n\x1a\n"

REASONS: dict[str, str] = {
    "cdc_null_column": "the row's sample id, subject id, label or features column is NULL (or a NULL array element)",
    "cdc_wrong_type": "a column has a type the mapping does not take (features: real[], double precision[] or "
                      "bytea; label: an integer; ids: text or integers)",
    "cdc_wrong_length": "features are empty, or a bytea of features is not a whole number of <f4 values",
    "cdc_bad_id": "a sample or subject id is not 1..128 characters of [A-Za-z0-9._:@+-]",
    "cdc_non_finite": "a feature is NaN or infinite",
    "cdc_no_before_image": "a delete or update without the old row's columns: the table needs REPLICA IDENTITY FULL",
    "cdc_truncate_refused": "TRUNCATE is not applied to the head: delete the rows with DELETE",
    "cdc_bad_event": "the change event is not a Debezium change event of the configured table",
}
"""Deadletter reason codes of `unlearn cdc` (documented in docs/cdc.md and docs/formats.md)."""


@dataclass(frozen=True, slots=True)
class TableMap:
    """Which table feeds which head, and which columns are what."""

    table: str  # schema.table
    head: str
    sample_id: str
    subject_id: str
    label: str
    features: str
    client_id: str = "cdc"


@dataclass(frozen=True, slots=True)
class Refusal(Exception):
    """A change (or half of an update) that cannot become a request: dead-lettered, never dropped."""

    reason: str
    detail: str
    event_id: str | None = None

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def event_id(m: TableMap, lsn: object, op: str, sample: str) -> str:
    """The deterministic id of one request of a change: readable when it fits the id alphabet,
    else a hash of the same parts (a redelivered change gets the same id either way)."""
    readable = f"cdc:{m.table}:{lsn}:{op}:{sample}"
    if _ID.match(readable):
        return readable
    digest = hashlib.sha256(f"{m.table}\x00{lsn}\x00{op}\x00{sample}".encode()).hexdigest()[:40]
    return f"cdc:{lsn}:{op}:{digest}"


def _field_types(schema: Any) -> dict[str, dict[str, Any]]:
    """Column name -> its Connect schema, from the envelope's ``after`` (or ``before``) struct."""
    if not isinstance(schema, dict):
        return {}
    for part in schema.get("fields") or ():
        if isinstance(part, dict) and part.get("field") in ("after", "before") and part.get("fields"):
            return {f["field"]: f for f in part["fields"] if isinstance(f, dict) and "field" in f}
    return {}


def _id_of(row: dict[str, Any], col: str, what: str) -> str:
    v = row.get(col)
    if v is None:
        raise Refusal("cdc_null_column", f"{what} column {col!r} is NULL")
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise Refusal("cdc_wrong_type", f"{what} column {col!r} holds {type(v).__name__}, not text or an integer")
    s = str(v)
    if not _ID.match(s):
        raise Refusal("cdc_bad_id", f"{what} {s[:40]!r} is not 1..128 characters of [A-Za-z0-9._:@+-]")
    return s


def _label_of(row: dict[str, Any], col: str) -> int:
    v = row.get(col)
    if v is None:
        raise Refusal("cdc_null_column", f"label column {col!r} is NULL")
    if isinstance(v, bool) or not isinstance(v, int):
        raise Refusal("cdc_wrong_type", f"label column {col!r} holds {type(v).__name__}, not an integer")
    if not 0 <= v <= 2_147_483_647:
        raise Refusal("cdc_wrong_type", f"label {v} is not a class index in 0..2^31-1")
    return v


def features_input(value: Any, col_schema: dict[str, Any] | None, col: str) -> dict[str, Any]:
    """The request ``input`` of a features column: ``real[]`` -> float32 bits (``features_bin``
    ``<f4``: Connect writes a float4 as its shortest decimal, which names exactly one float32),
    ``double precision[]`` -> float64 values, ``bytea`` -> ``<f4`` bytes, or a PNG image for the
    head's backbone."""
    if value is None:
        raise Refusal("cdc_null_column", f"features column {col!r} is NULL")
    kind = (col_schema or {}).get("type")
    item = ((col_schema or {}).get("items") or {}).get("type")
    if kind == "bytes" and isinstance(value, str):
        raw = base64.b64decode(value)
        if raw.startswith(_PNG):
            return {"kind": "image", "format": "png", "data": value}
        if not raw or len(raw) % 4:
            raise Refusal("cdc_wrong_length", f"features bytea {col!r} has {len(raw)} bytes, not a positive "
                          "multiple of 4 (<f4)")
        if any(not math.isfinite(x) for (x,) in struct.iter_unpack("<f", raw)):
            raise Refusal("cdc_non_finite", f"features bytea {col!r} holds a NaN or infinite value")
        return {"kind": "features_bin", "dtype": "<f4", "data": value}
    if kind == "array" and item in ("float", "double") and isinstance(value, list):
        if not value:
            raise Refusal("cdc_wrong_length", f"features array {col!r} is empty")
        if any(x is None for x in value):
            raise Refusal("cdc_null_column", f"features array {col!r} has a NULL element")
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in value):
            raise Refusal("cdc_wrong_type", f"features array {col!r} has a non-numeric element")
        if any(not math.isfinite(float(x)) for x in value):
            raise Refusal("cdc_non_finite", f"features array {col!r} holds a NaN or infinite value")
        if item == "float":
            packed = struct.pack(f"<{len(value)}f", *(float(x) for x in value))
            return {"kind": "features_bin", "dtype": "<f4", "data": base64.b64encode(packed).decode("ascii")}
        return {"kind": "features", "values": [float(x) for x in value]}
    raise Refusal("cdc_wrong_type", f"features column {col!r} is {kind}{f' of {item}' if item else ''}, not "
                  "real[], double precision[] or bytea")


def _delete(m: TableMap, row: dict[str, Any], lsn: object, op: str, ts_us: int) -> dict[str, Any]:
    sample = _id_of(row, m.sample_id, "sample id")
    eid = event_id(m, lsn, op, sample)
    try:
        subject = _id_of(row, m.subject_id, "subject id")
    except Refusal as exc:
        if exc.reason == "cdc_null_column":  # REPLICA IDENTITY DEFAULT sends the key columns only
            raise Refusal("cdc_no_before_image", f"delete of sample {sample!r} without its subject id: "
                          f"ALTER TABLE {m.table} REPLICA IDENTITY FULL", eid) from None
        raise Refusal(exc.reason, exc.detail, eid) from None
    return {"schema": "unlearn.request/v1", "event_id": eid, "op": "delete", "head_id": m.head,
            "client_id": m.client_id, "subject_id": subject, "sample_id": sample, "ts": ts_us / 1e6}


def _add(m: TableMap, row: dict[str, Any], types: dict[str, dict[str, Any]], lsn: object, op: str,
         ts_us: int) -> dict[str, Any]:
    sample = _id_of(row, m.sample_id, "sample id")
    eid = event_id(m, lsn, op, sample)
    try:
        subject = _id_of(row, m.subject_id, "subject id")
        label = _label_of(row, m.label)
        inp = features_input(row.get(m.features), types.get(m.features), m.features)
    except Refusal as exc:
        raise Refusal(exc.reason, exc.detail, eid) from None
    return {"schema": "unlearn.request/v1", "event_id": eid, "op": "add", "head_id": m.head,
            "client_id": m.client_id, "subject_id": subject, "sample_id": sample, "label": label,
            "input": inp, "ts": ts_us / 1e6}


def _commit_us(source: dict[str, Any]) -> int:
    us = source.get("ts_us")
    if isinstance(us, int) and not isinstance(us, bool):
        return us
    ms = source.get("ts_ms")
    if isinstance(ms, int) and not isinstance(ms, bool):
        return ms * 1000
    raise Refusal("cdc_bad_event", "source has neither ts_us nor ts_ms")


def _changed(m: TableMap, before: dict[str, Any], after: dict[str, Any]) -> bool:
    cols = (m.sample_id, m.subject_id, m.label, m.features)
    return any(before.get(c) != after.get(c) for c in cols)


def is_snapshot(envelope: Any) -> bool:
    """Whether a change event is a snapshot read (``op`` ``r``)."""
    return isinstance(envelope, dict) and isinstance(envelope.get("payload"), dict) \
        and envelope["payload"].get("op") == "r"


def event_us(envelope: Any) -> int | None:
    """The event time a change would get without a floor (None if it has none)."""
    try:
        return _commit_us(envelope["payload"]["source"])
    except (Refusal, KeyError, TypeError):
        return None


def change_requests(m: TableMap, envelope: Any, floor_us: int = 0) -> list[dict[str, Any] | Refusal]:
    """The requests (and refusals) of one change event, in the order to produce them.

    ``envelope`` is the JSON of a change event with its schema (``{"schema", "payload"}``, the
    JsonConverter with schemas enabled: the schema tells ``real[]`` from ``double precision[]``).
    A Debezium tombstone (``None``) is no change: ``[]``. ``floor_us``: a streamed change is dated
    no earlier (the snapshot's reads are dated when they are read, after the snapshot's point in
    the WAL: a change committed while the snapshot ran must still come after them)."""
    if envelope is None:
        return []
    if not isinstance(envelope, dict) or not isinstance(envelope.get("payload"), dict):
        return [Refusal("cdc_bad_event", "not a change event with schema and payload")]
    p = envelope["payload"]
    types = _field_types(envelope.get("schema"))
    source = p.get("source") if isinstance(p.get("source"), dict) else {}
    op = p.get("op")
    table = f"{source.get('schema')}.{source.get('table')}"
    if table != m.table:
        return [Refusal("cdc_bad_event", f"a change of {table}, not of {m.table}")]
    lsn = source.get("lsn")
    try:
        ts_us = _commit_us(source)
    except Refusal as exc:
        return [exc]
    if op != "r":
        ts_us = max(ts_us, floor_us)
    if op == "t":
        return [Refusal("cdc_truncate_refused", f"TRUNCATE of {m.table} at LSN {lsn} is not applied to head "
                        f"{m.head!r}: delete the rows with DELETE (docs/cdc.md)", f"cdc:{m.table}:{lsn}:t")]
    before, after = p.get("before"), p.get("after")
    out: list[dict[str, Any] | Refusal] = []

    def emit(fn: Any, *args: Any) -> None:
        try:
            out.append(fn(*args))
        except Refusal as exc:
            out.append(exc)

    if op in ("c", "r") and isinstance(after, dict):
        emit(_add, m, after, types, lsn, op, ts_us)
    elif op == "d" and isinstance(before, dict):
        emit(_delete, m, before, lsn, op, ts_us)
    elif op == "u" and isinstance(after, dict):
        if not isinstance(before, dict):
            return [Refusal("cdc_no_before_image", f"update at LSN {lsn} without the old row: ALTER TABLE "
                            f"{m.table} REPLICA IDENTITY FULL")]
        if _changed(m, before, after):
            emit(_delete, m, before, lsn, "ud", ts_us)
            emit(_add, m, after, types, lsn, "ua", ts_us + 1)
    elif op == "d":
        return [Refusal("cdc_no_before_image", f"delete at LSN {lsn} without the old row: ALTER TABLE "
                        f"{m.table} REPLICA IDENTITY FULL")]
    else:
        return [Refusal("cdc_bad_event", f"op {op!r} with before/after {type(before).__name__}/"
                        f"{type(after).__name__}")]
    return out
