"""receipts.json: receipt documents decode_receipt accepts (with their fields) and refuses, so
the Java Receipt.decode draws the same line."""

from __future__ import annotations

from typing import Any

import orjson

from clients.vectors.json_bytes import b64
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.receipts import decode_receipt


def gen_receipts() -> dict[str, Any]:
    """Receipt documents decode_receipt accepts (with the decoded fields) and refuses."""
    h64 = "ab" * 32
    base = {"schema": "unlearn.receipt/v3", "event_id": "ev-1", "subject_id": "user-9", "head_id": "faces",
            "sample_ids": ["img-3"], "status": "applied", "head_version": 12, "ts": 1767225600.5}
    rej = {"schema": "unlearn.receipt/v3", "event_id": "ev-2", "subject_id": "u", "head_id": "faces",
           "sample_ids": [], "status": "rejected", "reason": "unknown_sample", "ts": 1}
    valid_docs: list[bytes] = [
        orjson.dumps(base), orjson.dumps({**base, "retained_hash": h64}), orjson.dumps({**base, "digest": h64}),
        orjson.dumps(rej),
        orjson.dumps({**base, "head_version": 2**64 - 1, "sample_ids": ["a", "b", "c"]}),
        orjson.dumps({**base, "head_version": 4.0}), b' {"schema" : "unlearn.receipt/v3", "event_id":"e",'
        b'"subject_id":"s","head_id":"h","sample_ids":[],"status":"rejected","reason":"x","ts":0} ',
        orjson.dumps({**base, "ts": 0}), orjson.dumps({**rej, "reason": "r\u00e9"}),
        b'{"schema":"unlearn.receipt/v3","event_id":"a","event_id":"b","subject_id":"s","head_id":"h",'
        b'"sample_ids":[],"status":"rejected","reason":"x","ts":1e2}',
    ]
    invalid_docs: list[bytes] = [
        b"", b"[]", b"not json", b'"x"', orjson.dumps({**base, "schema": "unlearn.receipt/v2"}),
        orjson.dumps({k: v for k, v in base.items() if k != "ts"}), orjson.dumps({**base, "extra": 1}),
        orjson.dumps({**base, "event_id": "e/1"}), orjson.dumps({**base, "sample_ids": ["ok", ""]}),
        orjson.dumps({**base, "ts": -1}), orjson.dumps({**base, "ts": "1"}), orjson.dumps({**base, "ts": True}),
        orjson.dumps({k: v for k, v in base.items() if k != "head_version"}),
        orjson.dumps({**base, "schema": "unlearn.receipt/v1", "digest": h64}), orjson.dumps({**base, "reason": "x"}),
        orjson.dumps({**base, "head_version": -1}),
        orjson.dumps({**base, "head_version": 1}).replace(b":1,", b":18446744073709551616,"),
        orjson.dumps({**base, "head_version": 1.5}), orjson.dumps({**base, "head_version": True}),
        orjson.dumps({**base, "digest": h64.upper()}), orjson.dumps({**base, "retained_hash": "ab"}),
        orjson.dumps({**rej, "head_version": 1}), orjson.dumps({**rej, "reason": ""}),
        orjson.dumps({**rej, "status": "pending"}), orjson.dumps({**base, "sample_ids": "img-3"}),
        orjson.dumps({**base, "digest": None}), b'{"schema":"unlearn.receipt/v3",}', b"{\"ts\":NaN}",
        orjson.dumps({**base, "ts": 1e308}).replace(b"1e+308", b"1e999"), b"\xff\xfe",
    ]
    tomb = {"schema": "unlearn.receipt/v3", "event_id": "ev-3", "subject_id": "u", "head_id": "faces",
            "sample_ids": ["s-1"], "status": "tombstoned", "tombstone_ts": 1767225600.5, "ts": 1767225601}
    valid_docs += [orjson.dumps(tomb), orjson.dumps({**tomb, "tombstone_expires": 1767312000, "sample_ids": []}),
                   orjson.dumps({**tomb, "tombstone_client_id": "app-1"})]
    invalid_docs += [orjson.dumps({**tomb, "schema": "unlearn.receipt/v2"}),
                     orjson.dumps({k: v for k, v in tomb.items() if k != "tombstone_ts"}),
                     orjson.dumps({**tomb, "head_version": 3}), orjson.dumps({**tomb, "tombstone_ts": -1}),
                     orjson.dumps({**base, "tombstone_ts": 1.0}), orjson.dumps({**rej, "tombstone_expires": 1.0}),
                     orjson.dumps({**tomb, "tombstone_expires": "soon"}),
                     orjson.dumps({**tomb, "tombstone_client_id": ""}),
                     orjson.dumps({**tomb, "tombstone_client_id": 7}),
                     orjson.dumps({**base, "tombstone_client_id": "app-1"})]
    valid = []
    for doc in valid_docs:
        r = decode_receipt(doc)
        valid.append({"doc": doc.decode("utf-8"), "expect": {
            "event_id": r.event_id, "subject_id": r.subject_id, "head_id": r.head_id, "sample_ids": list(r.sample_ids),
            "status": r.status, "ts": r.ts, "head_version": None if r.head_version is None else str(r.head_version),
            "digest": r.digest, "reason": r.reason, "retained_hash": r.retained_hash,
            "tombstone_ts": r.tombstone_ts, "tombstone_expires": r.tombstone_expires,
            "tombstone_client_id": r.tombstone_client_id}})
    invalid = []
    for doc in invalid_docs:
        try:
            decode_receipt(doc)
        except CodecError as exc:
            invalid.append({"doc_b64": b64(doc), "python_error": str(exc)})
            continue
        raise AssertionError(doc)
    return {"about": "decode_receipt: accepted documents and their fields (head_version as a decimal string), "
                     "refused ones (base64 of the bytes)", "valid": valid, "invalid": invalid}
