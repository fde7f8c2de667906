"""``receipts``: each delete's proof, for the upstream app that asked (``receipt.v3.schema.json``).

One receipt per delete / delete_subject, in one of three statuses:

- ``applied`` (the ledger): which head version first excludes the samples and, when the head
  knows it, ``retained_hash``: the fingerprint of the multiset hash of that version's retained
  rows (docs/design.md section 6), a commitment that costs O(row) per event. The ledger digest
  (O(d^2)) is the certificate and travels with exact head updates, so ``digest`` is optional and
  the ledger writes none. Anyone holding the retained set can recompute both and check the claim.
- ``rejected``: why (a deadletter reason code), so the client is never left waiting.
- ``tombstoned`` (the featurizer): the delete removed nothing (its sample, or the subject's
  samples, was not in the head when it was judged, or only with a later event time; ``sample_ids``:
  the sample named, or none for a delete_subject), and its tombstone, dated ``tombstone_ts`` (its
  event time), refuses any add of it dated at or before then until ``tombstone_expires`` (absent:
  kept for ever; docs/featurizer.md "Remove wins"); ``tombstone_client_id``, when present, says
  it refuses only that client's adds (signed mode, a client without ``may_delete_others``).
  Every delete that is not rejected leaves such a tombstone, applied or not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.envelope import ID_CHARS, ID_MAX_CHARS, is_valid_id

__all__ = [
    "RECEIPT_SCHEMA_V3",
    "Receipt",
    "decode_receipt",
    "encode_receipt",
    "receipt_from_dict",
    "receipt_to_dict",
]

RECEIPT_SCHEMA_V3 = "unlearn.receipt/v3"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ALLOWED = frozenset(
    ("schema", "event_id", "subject_id", "head_id", "sample_ids", "status", "reason", "head_version", "digest", "ts",
     "retained_hash", "tombstone_ts", "tombstone_expires", "tombstone_client_id")
)
_TOMBSTONE_FIELDS = ("tombstone_ts", "tombstone_expires", "tombstone_client_id")


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
    tombstone_client_id: str | None = None  # tombstoned: the only client whose adds it refuses (None: every client)

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
                   tombstone_ts: float, tombstone_expires: float | None, ts: float,
                   tombstone_client_id: str | None = None) -> Receipt:
        """Nothing was removed (nothing of it was in the head, or only with a later event time);
        no add of it dated at or before ``tombstone_ts`` (by ``tombstone_client_id``, None: by any
        client) can enter until ``tombstone_expires``."""
        return cls(event_id, subject_id, head_id, tuple(sample_ids), "tombstoned", ts,
                   tombstone_ts=tombstone_ts, tombstone_expires=tombstone_expires,
                   tombstone_client_id=tombstone_client_id)

    @property
    def removed(self) -> bool:
        """Whether the delete removed something (an applied receipt names its samples)."""
        return self.status == "applied" and bool(self.sample_ids)


def _check_common(d: dict[str, Any]) -> None:
    """The schema, the field names and the fields every status has."""
    if d.get("schema") != RECEIPT_SCHEMA_V3:
        raise CodecError(f"receipt: unknown schema {d.get('schema')!r:.80}")
    for k in d:
        if k not in _ALLOWED:
            raise CodecError(f"receipt: unknown field {k!r:.80}")
    for k in ("event_id", "subject_id", "head_id", "sample_ids", "status", "ts"):
        if k not in d:
            raise CodecError(f"receipt: missing field {k!r}")
    for k in ("event_id", "subject_id", "head_id"):
        if not is_valid_id(d[k]):
            raise CodecError(f"receipt: {k} must be 1..{ID_MAX_CHARS} characters of [{ID_CHARS}]")
    samples = d["sample_ids"]
    if type(samples) is not list or not all(is_valid_id(s) for s in samples):
        raise CodecError("receipt: sample_ids must be a list of ids")
    _non_negative(d["ts"], "ts")
    if d["status"] != "tombstoned" and any(k in d for k in _TOMBSTONE_FIELDS):
        raise CodecError(f"receipt: only a tombstoned receipt has {', '.join(_TOMBSTONE_FIELDS)}")


def _non_negative(v: object, name: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < math.inf:
        raise CodecError(f"receipt: {name} must be a finite number >= 0")
    return float(v)


def _hex64(d: dict[str, Any], name: str) -> str | None:
    """``d[name]`` if it is 64 lowercase hex characters, None if absent."""
    if name not in d:
        return None
    v = d[name]
    if type(v) is not str or not _HEX64.fullmatch(v):
        raise CodecError(f"receipt: {name} must be 64 lowercase hex characters")
    return v


def _applied(d: dict[str, Any]) -> dict[str, Any]:
    if "head_version" not in d:
        raise CodecError("receipt: an applied receipt needs head_version")
    if "reason" in d:
        raise CodecError("receipt: an applied receipt has no reason")
    version = d["head_version"]
    if not (type(version) is int or (type(version) is float and version.is_integer())) or not 0 <= version < 2**64:
        raise CodecError("receipt: head_version must be an int in 0..2^64-1")
    return {"head_version": int(version), "digest": _hex64(d, "digest"), "retained_hash": _hex64(d, "retained_hash")}


def _rejected(d: dict[str, Any]) -> dict[str, Any]:
    if "head_version" in d or "digest" in d or "retained_hash" in d:
        raise CodecError("receipt: a rejected receipt has no head_version, digest or retained_hash")
    reason = d.get("reason")
    if type(reason) is not str or not reason:
        raise CodecError("receipt: a rejected receipt needs a non-empty reason")
    return {"reason": reason}


def _tombstoned(d: dict[str, Any]) -> dict[str, Any]:
    if any(k in d for k in ("head_version", "digest", "retained_hash", "reason")):
        raise CodecError("receipt: a tombstoned receipt has no head_version, digest, retained_hash or reason")
    if "tombstone_ts" not in d:
        raise CodecError("receipt: a tombstoned receipt needs tombstone_ts")
    expires = d.get("tombstone_expires")
    client = d.get("tombstone_client_id")
    if "tombstone_client_id" in d and not is_valid_id(client):
        raise CodecError(f"receipt: tombstone_client_id must be 1..{ID_MAX_CHARS} characters of [{ID_CHARS}]")
    return {"tombstone_ts": _non_negative(d["tombstone_ts"], "tombstone_ts"),
            "tombstone_expires": None if "tombstone_expires" not in d else _non_negative(expires, "tombstone_expires"),
            "tombstone_client_id": client}


_BY_STATUS = {"applied": _applied, "rejected": _rejected, "tombstoned": _tombstoned}


def receipt_from_dict(d: object) -> Receipt:
    """Validate a decoded JSON value against ``unlearn.receipt/v3``; CodecError if it does not conform."""
    if type(d) is not dict:
        raise CodecError("receipt: not a JSON object")
    _check_common(d)
    status = d["status"]
    fields = _BY_STATUS.get(status) if type(status) is str else None
    if fields is None:
        raise CodecError(f"receipt: status must be applied | rejected | tombstoned, got {status!r:.80}")
    return Receipt(d["event_id"], d["subject_id"], d["head_id"], tuple(d["sample_ids"]), status, float(d["ts"]),
                   **fields(d))


def receipt_to_dict(r: Receipt) -> dict[str, Any]:
    """The JSON object for ``r`` (the fields its status takes only)."""
    d: dict[str, Any] = {
        "schema": RECEIPT_SCHEMA_V3,
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
    if r.tombstone_client_id is not None:
        d["tombstone_client_id"] = r.tombstone_client_id
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
