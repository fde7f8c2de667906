"""Property tests of dead-letter redaction (schemas/redaction.py, docs/erasure.md section 10):
never raises on any bytes; never leaves a value of a plaintext input (a feature value, the text,
the base64 data) in the output; keeps the ids, op, label and ts; keeps sealed inputs and bytes
that are no JSON object as they are."""

from __future__ import annotations

import json

import numpy as np
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unlearn.schemas.envelope import FeaturesInput, ImageInput, Request, TextInput, encode_request, parse_request
from unlearn.schemas.redaction import is_redacted, redact_original
from unlearn.schemas.transit import TransitPublicKey, new_transit_key, seal_request

SLOW = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_id = st.text(alphabet="abcXYZ019._:@+-", min_size=1, max_size=12)
# values that cannot occur by chance in an envelope: 17 significant digits, a marker text, random bytes
_floats = st.floats(min_value=0.1000000000001, max_value=0.9999999999, allow_nan=False)
_texts = st.text(min_size=0, max_size=30).map(lambda t: "SECRET-" + t)
_plain_texts = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 ", max_size=30).map(lambda t: "SECRET-" + t)
_images = st.binary(min_size=9, max_size=60)


def _request(inp: FeaturesInput | TextInput | ImageInput, event: str, subject: str, sample: str) -> Request:
    return Request(event, "add", "faces", "app", subject, sample, 3, inp, 5.0)


def _secrets(inp: FeaturesInput | TextInput | ImageInput, wire: bytes) -> list[bytes]:
    """What of ``inp`` must not survive: its values as they appear in ``wire``."""
    d = json.loads(wire)["input"]
    if isinstance(inp, TextInput):  # as the wire escapes it
        return [orjson.dumps(inp.text)[1:-1]]
    if d["kind"] in ("image", "features_bin"):
        return [d["data"].encode()]
    return [repr(float(v)).encode() for v in d["values"]]


_inputs = st.one_of(
    st.lists(_floats, min_size=1, max_size=6).map(FeaturesInput),
    st.lists(_floats, min_size=1, max_size=6).map(lambda v: FeaturesInput(np.asarray(v), dtype="<f8")),
    _texts.map(TextInput),
    _images.map(ImageInput),
)


@SLOW
@given(_inputs, _id, _id, _id)
def test_a_plaintext_input_leaves_no_value_and_the_envelope_stays(inp: FeaturesInput | TextInput | ImageInput,
                                                                   event: str, subject: str, sample: str) -> None:
    wire = encode_request(_request(inp, event, subject, sample))
    out = redact_original(wire)
    for secret in _secrets(inp, wire):
        assert secret in wire and secret not in out
    doc, before = json.loads(out), json.loads(wire)
    if isinstance(inp, TextInput):  # nor decoded, however the output escapes it
        assert inp.text not in json.dumps(doc, ensure_ascii=False)
    assert doc["input"] == {"kind": before["input"]["kind"], "redacted": True}
    assert {k: v for k, v in doc.items() if k != "input"} == {k: v for k, v in before.items() if k != "input"}
    assert (doc["event_id"], doc["subject_id"], doc["sample_id"]) == (event, subject, sample)
    assert is_redacted(out) and not is_redacted(wire)  # what erasure-report counts as clear


@SLOW
@given(st.binary(max_size=200))
def test_never_raises_on_arbitrary_bytes(raw: bytes) -> None:
    assert isinstance(redact_original(raw), bytes)


@SLOW
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                    max_leaves=12), _plain_texts)
def test_any_input_other_than_a_sealed_one_is_taken_out(value: object, secret: str) -> None:
    """Unknown kinds, and inputs that are no object at all, are redacted too; an earlier plaintext
    input cannot hide behind a repeated key."""
    if value is None:
        value = [secret]
    raw = json.dumps({"event_id": "e", "input": {"kind": "text", "text": secret, "x": value}},
                     ensure_ascii=False).encode()
    assert secret.encode() in raw and secret.encode() not in redact_original(raw)
    raw = json.dumps({"event_id": "e", "input": value if value is not None else 1}).encode()
    out = json.loads(redact_original(raw))
    assert out["event_id"] == "e" and out["input"]["redacted"] is True
    hidden = b'{"input": {"kind": "text", "text": %s}, "input": null}' % json.dumps(secret, ensure_ascii=False).encode()
    assert secret.encode() in hidden and secret.encode() not in redact_original(hidden)


def test_sealed_inputs_and_non_objects_are_kept_as_they_are() -> None:
    pair = new_transit_key()
    sealed = seal_request(_request(TextInput("SECRET"), "ev", "alice", "x1"),
                          TransitPublicKey(0, pair.key_id, pair.public_key, 1.0, 2.0))
    wire = encode_request(sealed)
    assert redact_original(wire) == wire and parse_request(wire).input.kind == "sealed" and not is_redacted(wire)
    for raw in (b"", b"not json SECRET", b'["SECRET"]', b'"SECRET"', b'{"op": "delete", "subject_id": "a"}',
                b'{"input": null}', b'\xff\xfe{"input":1}'):
        assert redact_original(raw) == raw
    # a "sealed" input with a field of its own is no sealed input: taken out
    extra = json.loads(wire)
    extra["input"]["values"] = [0.123456789]
    assert b"0.123456789" not in redact_original(json.dumps(extra).encode())
    # integers beyond 64 bits (refused as invalid by the featurizer's parser) do not keep it readable
    big = b'{"n": 123456789012345678901234567890, "input": {"kind": "text", "text": "SECRET"}}'
    assert b"SECRET" not in redact_original(big)
