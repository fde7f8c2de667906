"""``receipts``: each delete's proof, for the upstream app that asked (``receipt.v2.schema.json``).

An applied receipt says which head version first excludes the samples and, when the head knows
it, ``retained_hash``: the fingerprint of the multiset hash of that version's retained rows
(docs/design.md section 6), a commitment that costs O(row) per event. The ledger digest (O(d^2))
is the certificate; it is carried by exact head updates, no longer by receipts (v2: ``digest``
optional; the ledger worker writes none). Anyone holding the retained set can recompute both and
check the claim. A rejected receipt says why (a deadletter reason code) so the client is never
left waiting.

A ``tombstoned`` receipt (v3) answers a delete that removed nothing: its sample (or the subject's
samples) was not in the head when it was judged, or only with a later event time. It is written
by the featurizer and says so honestly (``sample_ids``: the sample named, or none for a
delete_subject), and that the delete's tombstone, dated ``tombstone_ts`` (its event time),
refuses any add of it dated at or before then until ``tombstone_expires`` (absent: kept for
ever; docs/featurizer.md "Remove wins"). Every delete that is not rejected leaves such a
tombstone, applied or not.

Decoders read v1 (written before v2, ``digest`` required), v2 and v3; encoders write v2 for
applied and rejected receipts (byte-identical to before) and v3 only for tombstoned ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from unlearn.schemas._binary import CodecError
from unlearn.schemas.envelope import ID_CHARS, ID_MAX_CHARS, is_valid_id

__all__ = [
    "RECEIPT_SCHEMA_V1",
    "RECEIPT_SCHEMA_V2",
    "RECEIPT_SCHEMA_V3",
    "Receipt",
    "decode_receipt",
    "encode_receipt",
    "receipt_from_dict",
    "receipt_to_dict",
]

RECEIPT_SCHEMA_V1 = "unlearn.receipt/v1"
RECEIPT_SCHEMA_V2 = "unlearn.receipt/v2"
RECEIPT_SCHEMA_V3 = "unlearn.receipt/v3"
_SCHEMAS = (RECEIPT_SCHEMA_V1, RECEIPT_SCHEMA_V2, RECEIPT_SCHEMA_V3)
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ALLOWED = frozenset(
    ("schema", "event_id", "subject_id", "head_id", "sample_ids", "status", "reason", "head_version", "digest", "ts",
     "retained_hash", "tombstone_ts", "tombstone_expires")
)
_TOMBSTONE_FIELDS = ("tombstone_ts", "tombstone_expires")


@dataclass(frozen=True, slots=True)
class Receipt:
    """Outcome of one delete / delete_subject request."""

    event_id: str
    subject_id: str
    head_id: str
    sample_ids: tuple[str, ...]
    status: Literal["applied", "rejected", "tombstoned"]
    ts: float
    head_version: int | None = None
    digest: str | None = None
    reason: str | None = None
    retained_hash: str | None = None
    tombstone_ts: float | None = None  # tombstoned: the delete's event time (Unix seconds)
    tombstone_expires: float | None = None  # tombstoned: when the tombstone may be dropped (None: never)

    def __post_init__(self) -> None:
        if not isinstance(self.sample_ids, tuple):
            object.__setattr__(self, "sample_ids", tuple(self.sample_ids))

    @classmethod
    def applied(cls, event_id: str, subject_id: str, head_id: str, sample_ids: Sequence[str],
                head_version: int, digest: str | None, ts: float, retained_hash: str | None = None) -> Receipt:
        """The samples are out of ``head_version`` (digest = that version's ledger digest, None
        when not carried; ``retained_hash`` = its retained rows' multiset hash fingerprint, None
        when unknown)."""
        return cls(event_id, subject_id, head_id, tuple(sample_ids), "applied", ts, head_version, digest,
                   retained_hash=retained_hash)

    @classmethod
    def rejected(cls, event_id: str, subject_id: str, head_id: str, sample_ids: Sequence[str],
                 reason: str, ts: float) -> Receipt:
        """The delete was not applied; ``reason`` is a machine-readable code."""
        return cls(event_id, subject_id, head_id, tuple(sample_ids), "rejected", ts, reason=reason)

    @classmethod
    def tombstoned(cls, event_id: str, subject_id: str, head_id: str, sample_ids: Sequence[str],
                   tombstone_ts: float, tombstone_expires: float | None, ts: float) -> Receipt:
        """Nothing was removed (nothing of it was in the head, or only with a later event time);
        no add of it dated at or before ``tombstone_ts`` can enter until ``tombstone_expires``."""
        return cls(event_id, subject_id, head_id, tuple(sample_ids), "tombstoned", ts,
                   tombstone_ts=tombstone_ts, tombstone_expires=tombstone_expires)

    @property
    def removed(self) -> bool:
        """Whether the delete removed something (an applied receipt names its samples)."""
        return self.status == "applied" and bool(self.sample_ids)


_is_id = is_valid_id


def receipt_from_dict(d: object) -> Receipt:
    """Validate a decoded JSON value against receipt v1 or v2; CodecError if it does not conform."""
    if type(d) is not dict:
        raise CodecError("receipt: not a JSON object")
    schema = d.get("schema")
    if schema not in _SCHEMAS:
        raise CodecError(f"receipt: unknown schema {schema!r:.80}")
    for k in d:
        if k not in _ALLOWED:
            raise CodecError(f"receipt: unknown field {k!r:.80}")
    for k in ("event_id", "subject_id", "head_id", "sample_ids", "status", "ts"):
        if k not in d:
            raise CodecError(f"receipt: missing field {k!r}")
    for k in ("event_id", "subject_id", "head_id"):
        if not _is_id(d[k]):
            raise CodecError(f"receipt: {k} must be 1..{ID_MAX_CHARS} characters of [{ID_CHARS}]")
    samples = d["sample_ids"]
    if type(samples) is not list or not all(_is_id(s) for s in samples):
        raise CodecError("receipt: sample_ids must be a list of ids")
    ts = d["ts"]
    if type(ts) not in (int, float) or not 0 <= ts < math.inf:
        raise CodecError("receipt: ts must be a finite number >= 0")
    status = d["status"]
    version, digest, reason = d.get("head_version"), d.get("digest"), d.get("reason")
    retained = d.get("retained_hash")
    tomb_ts, tomb_expires = d.get("tombstone_ts"), d.get("tombstone_expires")
    if (status == "tombstoned") != (schema == RECEIPT_SCHEMA_V3):
        raise CodecError("receipt: status tombstoned is v3, and v3 is status tombstoned")
    if status != "tombstoned" and any(k in d for k in _TOMBSTONE_FIELDS):
        raise CodecError("receipt: only a tombstoned receipt has tombstone_ts or tombstone_expires")
    if status == "applied":
        if "head_version" not in d or (schema == RECEIPT_SCHEMA_V1 and "digest" not in d):
            raise CodecError("receipt: an applied receipt needs head_version (and, in v1, digest)")
        if "reason" in d:
            raise CodecError("receipt: an applied receipt has no reason")
        if not (type(version) is int or (type(version) is float and version.is_integer())) or not 0 <= version < 2**64:
            raise CodecError("receipt: head_version must be an int in 0..2^64-1")
        if "digest" in d and (type(digest) is not str or not _HEX64.fullmatch(digest)):
            raise CodecError("receipt: digest must be 64 lowercase hex characters")
        if "retained_hash" in d and (type(retained) is not str or not _HEX64.fullmatch(retained)):
            raise CodecError("receipt: retained_hash must be 64 lowercase hex characters")
        version = int(version)
    elif status == "rejected":
        if "head_version" in d or "digest" in d or "retained_hash" in d:
            raise CodecError("receipt: a rejected receipt has no head_version, digest or retained_hash")
        if type(reason) is not str or not reason:
            raise CodecError("receipt: a rejected receipt needs a non-empty reason")
    elif status == "tombstoned":
        if any(k in d for k in ("head_version", "digest", "retained_hash", "reason")):
            raise CodecError("receipt: a tombstoned receipt has no head_version, digest, retained_hash or reason")
        if "tombstone_ts" not in d:
            raise CodecError("receipt: a tombstoned receipt needs tombstone_ts")
        for k in _TOMBSTONE_FIELDS:
            v = d.get(k)
            if k in d and not (isinstance(v, (int, float)) and type(v) is not bool and 0 <= v < math.inf):
                raise CodecError(f"receipt: {k} must be a finite number >= 0")
        tomb_ts = float(d["tombstone_ts"])
        tomb_expires = float(d["tombstone_expires"]) if "tombstone_expires" in d else None
    else:
        raise CodecError(f"receipt: status must be applied | rejected | tombstoned, got {status!r:.80}")
    return Receipt(d["event_id"], d["subject_id"], d["head_id"], tuple(samples), status, float(ts),
                   version, digest, reason, retained, tomb_ts, tomb_expires)


def receipt_to_dict(r: Receipt) -> dict[str, Any]:
    """The JSON object for ``r`` (fields its status takes only): v3 when tombstoned, else v2."""
    d: dict[str, Any] = {
        "schema": RECEIPT_SCHEMA_V3 if r.status == "tombstoned" else RECEIPT_SCHEMA_V2,
        "event_id": r.event_id,
        "subject_id": r.subject_id,
        "head_id": r.head_id,
        "sample_ids": list(r.sample_ids),
        "status": r.status,
        "ts": r.ts,
    }
    if r.head_version is not None:
        d["head_version"] = r.head_version
    if r.digest is not None:
        d["digest"] = r.digest
    if r.reason is not None:
        d["reason"] = r.reason
    if r.retained_hash is not None:
        d["retained_hash"] = r.retained_hash
    if r.tombstone_ts is not None:
        d["tombstone_ts"] = r.tombstone_ts
    if r.tombstone_expires is not None:
        d["tombstone_expires"] = r.tombstone_expires
    return d


def encode_receipt(r: Receipt) -> bytes:
    """JSON bytes for the ``receipts`` topic (key it by ``r.subject_id``); validated first."""
    d = receipt_to_dict(r)
    receipt_from_dict(d)
    return orjson.dumps(d)


def decode_receipt(raw: bytes | bytearray | memoryview | str) -> Receipt:
    """Parse and validate a receipt; CodecError on anything wrong."""
    try:
        d = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError) as exc:
        raise CodecError(f"receipt: not JSON: {exc}") from None
    return receipt_from_dict(d)
