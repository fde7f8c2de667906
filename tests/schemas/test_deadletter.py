"""Dead letters (``unlearn.deadletter/v1``): round-trip, match the JSON Schema, and the decoder
refuses garbage with a CodecError."""

from __future__ import annotations

import jsonschema
import orjson
import pytest

from unlearn.schemas import (
    SCHEMA_DIR,
    CodecError,
    DeadLetter,
    InvalidRequest,
    deadletter_for,
    decode_deadletter,
    encode_deadletter,
    parse_request,
)


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = orjson.loads((SCHEMA_DIR / name).read_bytes())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


DEADLETTER_V = _validator("deadletter.v1.schema.json")


def test_deadletter_round_trip_and_schema() -> None:
    original = b'{"schema": "unlearn.request/v9"}\xff'
    with pytest.raises(InvalidRequest) as info:
        parse_request(original)
    rec = deadletter_for(original, info.value, "featurizer", topic="p.requests", partition=2, offset=41, key=b"user-9")
    assert rec.reason == "not_json"
    raw = encode_deadletter(rec)
    assert DEADLETTER_V.is_valid(orjson.loads(raw))
    back = decode_deadletter(raw)
    assert back == rec and back.original == original

    from_codec = deadletter_for(b"\x00", CodecError("delta: truncated"), "ledger", ts=1.0)
    assert from_codec.reason == "codec_error" and from_codec.topic is None
    assert decode_deadletter(encode_deadletter(from_codec)) == from_codec
    assert deadletter_for(None, RuntimeError("boom"), "ledger").reason == "internal_error"


def test_deadletter_garbage_is_codec_error() -> None:
    good = orjson.loads(encode_deadletter(DeadLetter(b"x", "bad_op", "d", "featurizer", ts=1.0)))
    bad_docs = [
        b"",
        b"[]",
        orjson.dumps({**good, "schema": "unlearn.deadletter/v2"}),
        orjson.dumps({**good, "original": "!!!"}),
        orjson.dumps({**good, "reason": ""}),
        orjson.dumps({**good, "source": None}),
        orjson.dumps({k: v for k, v in good.items() if k != "stage"}),
        orjson.dumps({**good, "ts": "yesterday"}),
    ]
    for raw in bad_docs:
        with pytest.raises(CodecError):
            decode_deadletter(raw)
