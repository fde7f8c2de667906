"""Receipts (``unlearn.receipt/v3``): the decoder accepts exactly what the JSON Schema accepts,
and round-trips."""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest

from unlearn.schemas import SCHEMA_DIR, CodecError, Receipt, decode_receipt, encode_receipt, receipt_to_dict


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = orjson.loads((SCHEMA_DIR / name).read_bytes())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


RECEIPT_V = _validator("receipt.v3.schema.json")
_DROP = object()


DIGEST = "ab" * 32


def _receipt(**changes: Any) -> dict[str, Any]:
    d = receipt_to_dict(Receipt.applied("ev-9", "user-9", "fmnist", ["img-3", "img-4"], 12, DIGEST, 1767225600.5))
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return d


V3 = "unlearn.receipt/v3"
RECEIPTS_VALID = [
    _receipt(),
    _receipt(sample_ids=[]),
    _receipt(head_version=0, ts=0),
    _receipt(retained_hash="cd" * 32),
    _receipt(digest=_DROP),  # the ledger worker writes no digest
    _receipt(digest=_DROP, retained_hash="cd" * 32),
    receipt_to_dict(Receipt.applied("ev-9", "user-9", "fmnist", ["img-3"], 3, None, 1.0, retained_hash="01" * 32)),
    receipt_to_dict(Receipt.rejected("ev-9", "user-9", "fmnist", ["img-3"], "sample_not_present", 5.0)),
    receipt_to_dict(Receipt.tombstoned("ev-9", "user-9", "fmnist", ["img-3"], 4.5, 604804.5, 5.0)),
    receipt_to_dict(Receipt.tombstoned("ev-9", "user-9", "fmnist", [], 4.5, None, 5.0)),  # kept for ever
    receipt_to_dict(Receipt.tombstoned("ev-9", "user-9", "fmnist", [], 4.5, None, 5.0, "app-1")),  # scoped
    {"schema": V3, "event_id": "e", "subject_id": "s", "head_id": "h", "sample_ids": [], "status": "tombstoned",
     "ts": 0, "tombstone_ts": 0},
]
_TOMB = receipt_to_dict(Receipt.tombstoned("ev-9", "user-9", "fmnist", ["img-3"], 4.5, 10.0, 5.0))
RECEIPTS_INVALID = [
    _receipt(schema="unlearn.receipt/v4"),
    _receipt(schema="unlearn.receipt/v2"),  # one version: nothing older was released
    _receipt(schema="unlearn.receipt/v1"),
    {**_TOMB, "schema": "unlearn.receipt/v2"},
    _receipt(tombstone_ts=1.0),  # tombstone fields on an applied receipt
    _receipt(tombstone_expires=1.0),
    {k: v for k, v in _TOMB.items() if k != "tombstone_ts"},
    {**_TOMB, "tombstone_ts": -1},
    {**_TOMB, "tombstone_ts": True},
    {**_TOMB, "tombstone_expires": None},  # absent when kept for ever, never null
    {**_TOMB, "tombstone_client_id": None},  # absent when it matches every client, never null
    {**_TOMB, "tombstone_client_id": ""},
    {**_TOMB, "tombstone_client_id": "app 1"},
    _receipt(tombstone_client_id="app-1"),  # only a tombstoned receipt is scoped
    {**_TOMB, "head_version": 3},
    {**_TOMB, "digest": DIGEST},
    {**_TOMB, "reason": "unknown_sample"},
    _receipt(status="pending"),
    _receipt(status=["applied"]),
    _receipt(digest="AB" * 32),
    _receipt(digest="ab" * 31),
    _receipt(digest=DIGEST + "\n"),
    _receipt(digest=None),  # absent when not carried, never null
    _receipt(head_version=-1),
    _receipt(head_version=1.5),
    _receipt(head_version=True),
    _receipt(head_version=_DROP),
    _receipt(reason="why"),
    _receipt(sample_ids=["ok", ""]),
    _receipt(sample_ids="img-3"),
    _receipt(event_id=_DROP),
    _receipt(event_id="e/1"),
    _receipt(ts=-1),
    _receipt(ts="1"),
    _receipt(extra=True),
    _receipt(status="rejected"),  # has head_version/digest, no reason
    _receipt(status="rejected", head_version=_DROP, digest=_DROP),  # no reason
    _receipt(status="rejected", head_version=_DROP, digest=_DROP, reason=""),
    _receipt(status="rejected", head_version=_DROP, digest=_DROP, reason="r", tombstone_ts=1.0),
    _receipt(retained_hash="CD" * 32),
    _receipt(retained_hash="cd" * 31),
    _receipt(retained_hash=None),  # absent when unknown, never null
    _receipt(status="rejected", head_version=_DROP, digest=_DROP, reason="r", retained_hash="cd" * 32),
    _receipt(status="rejected", head_version=_DROP, reason="r"),  # a digest on a rejected receipt
]


@pytest.mark.parametrize("doc", RECEIPTS_VALID)
def test_valid_receipts_round_trip_and_match_schema(doc: dict[str, Any]) -> None:
    assert RECEIPT_V.is_valid(doc)
    r = decode_receipt(orjson.dumps(doc))
    assert decode_receipt(encode_receipt(r)) == r
    assert orjson.loads(encode_receipt(r))["schema"] == V3
    assert r.removed == (r.status == "applied" and bool(r.sample_ids))


@pytest.mark.parametrize("doc", RECEIPTS_INVALID)
def test_invalid_receipts_are_rejected_like_the_schema(doc: dict[str, Any]) -> None:
    assert not RECEIPT_V.is_valid(doc)
    with pytest.raises(CodecError):
        decode_receipt(orjson.dumps(doc))


def test_receipt_garbage_is_codec_error() -> None:
    for raw in (b"", b"{", b"[]", b"null"):
        with pytest.raises(CodecError):
            decode_receipt(raw)
