"""Refusals: the dead letter of a refused request and, for a delete, the rejected receipt the
client that asked waits for. A dead letter names the request's place in ``requests`` and keeps its
bytes as sent, except a plaintext raw input, which is taken out unless
``UNLEARN_DEADLETTER_INPUTS=keep`` (``schemas/redaction.py``, docs/erasure.md); a delete too broken
to parse still gets its receipt when its ids can be salvaged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from unlearn.schemas.deadletter import DeadLetter
from unlearn.schemas.envelope import Request, is_valid_id
from unlearn.schemas.receipts import Receipt
from unlearn.schemas.redaction import redact_original
from unlearn.streams.featurizer.batch_io import STAGE, InMessage
from unlearn.streams.featurizer.core_config import CoreConfig

__all__ = [
    "refusal",
    "salvage_delete_ids",
]


_DELETE_OPS = ("delete", "delete_subject")


def refusal(m: InMessage, r: Request | None, reason: str, detail: str, config: CoreConfig, ts: float,
            raw_ids: Mapping[str, Any] | None = None) -> tuple[DeadLetter, Receipt | None]:
    """The dead letter of a refused message, plus a rejected receipt when it names a delete: the
    client that asked waits for one. ``raw_ids`` are the ids :func:`salvage_delete_ids` found in
    an invalid request (``r`` is None then). The dead letter names the request's place in
    ``requests`` (where its producer put it), not the by-head copy the featurizer read, and keeps
    no plaintext input unless UNLEARN_DEADLETTER_INPUTS=keep (``schemas/redaction.py``)."""
    if m.origin is not None:
        topic, partition, offset = config.requests_topic, m.origin.partition, m.origin.offset
    else:
        topic, partition, offset = config.input_topic, m.partition, m.offset
    original = bytes(m.value) if m.value is not None else b""
    dl = DeadLetter(
        original=redact_original(original) if config.redact_deadletter_inputs else original,
        reason=reason, detail=detail, stage=STAGE, topic=topic,
        partition=partition, offset=offset, key=m.key,
        event_id=r.event_id if r is not None else (raw_ids or {}).get("event_id"), ts=ts,
    )
    ids: Mapping[str, Any] | None = raw_ids if r is None else {
        "op": r.op, "event_id": r.event_id, "subject_id": r.subject_id, "head_id": r.head_id,
        "sample_ids": [r.sample_id] if r.sample_id else [],
    }
    receipt = None
    if ids and ids.get("op") in _DELETE_OPS:
        receipt = Receipt.rejected(ids["event_id"], ids["subject_id"], ids["head_id"], ids["sample_ids"], reason, ts)
    return dl, receipt


def salvage_delete_ids(raw: bytes | None) -> dict[str, Any] | None:
    """For an invalid request that still names a delete with usable ids: the receipt fields, so the
    client that asked is told it was rejected. None otherwise."""
    if raw is None:
        return None
    try:
        d = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return None
    if type(d) is not dict or d.get("op") not in _DELETE_OPS:
        return None

    if not all(is_valid_id(d.get(k)) for k in ("event_id", "subject_id", "head_id")):
        return None
    sample = d.get("sample_id")
    return {
        "op": d["op"], "event_id": d["event_id"], "subject_id": d["subject_id"], "head_id": d["head_id"],
        "sample_ids": [sample] if is_valid_id(sample) else [],
    }
