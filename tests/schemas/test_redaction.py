"""Property tests of dead-letter redaction (schemas/redaction.py, docs/erasure.md section 10):
never raises on any bytes; never leaves a value of a plaintext input (a feature value, the text,
the base64 data) in the output; keeps the ids, op, label and ts; keeps sealed inputs and bytes
that are no JSON object as they are. The ledger's refused deltas (``redact_delta``): no row,
label or ledger-blob value survives, intact or corrupt; the ids do; sealed-only deltas are kept."""

from __future__ import annotations

import json

import numpy as np
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unlearn.schemas.delta_codec import Delta, PackedEntry, RowsEntry, decode_delta, encode_delta
from unlearn.schemas.envelope import Request, encode_request, parse_request
from unlearn.schemas.redaction import (
    REDACTED_DELTA_SCHEMA,
    is_redacted,
    readable_delta,
    redact_delta,
    redact_original,
)
from unlearn.schemas.request_inputs import FeaturesInput, ImageInput, TextInput
from unlearn.schemas.sealed import new_key, seal_delta
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


# ---------------------------------------------------------------- refused deltas (the ledger)
_letters = st.text(alphabet="abcdefghXYZ", min_size=1, max_size=10)  # ids without digits: no value hides in one
_big = st.integers(2**31, 2**62).flatmap(lambda v: st.sampled_from([v, -v]))  # 10+ digits, 8 bytes


@st.composite
def _plain_deltas(draw: st.DrawFn) -> Delta:
    d, n = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    ids = [draw(st.lists(_letters, min_size=n, max_size=n)) for _ in range(3)]
    q = np.array(draw(st.lists(_big, min_size=n * d, max_size=n * d)), dtype=np.int64).reshape(n, d)
    labels = (np.array(draw(st.lists(_big, min_size=n * 2, max_size=n * 2)), dtype=np.int64).reshape(n, 2)
              if draw(st.booleans()) else np.array(draw(st.lists(st.integers(2**31, 2**40), min_size=n, max_size=n))))
    entries: list[RowsEntry | PackedEntry] = [RowsEntry(draw(st.sampled_from([1, -1])), *ids, labels, q)]
    if draw(st.booleans()):  # a packed entry's blob is a Gram matrix of rows: it goes too
        entries.append(PackedEntry(1, ["pe"], ["ps"], ["pu"], b"BLOB-SECRET" * 3, b"H" * 4096))
    return Delta(draw(_letters), "src", d, 30, 0, tuple(entries))


def _values(delta: Delta) -> list[bytes]:
    """Every row and label value of ``delta``, as int64 LE bytes and as decimal text."""
    out = [b"BLOB-SECRET"]
    for e in delta.entries:
        if isinstance(e, RowsEntry):
            for v in (*e.q.ravel(), *e.labels.ravel()):
                out += [np.int64(v).astype("<i8").tobytes(), str(int(v)).encode()]
    return out


@SLOW
@given(_plain_deltas(), st.sampled_from(["intact", "flip", "truncate"]), st.integers(0, 10**6))
def test_a_refused_plaintext_delta_keeps_its_ids_and_no_value(delta: Delta, how: str, where: int) -> None:
    raw = encode_delta(delta)
    if how == "flip":  # a corrupt message (checksum mismatch) still holds its rows
        i = where % len(raw)
        raw = raw[:i] + bytes([raw[i] ^ 0x5A]) + raw[i + 1:]
    elif how == "truncate":
        raw = raw[:where % len(raw)]
    out = redact_delta(raw)
    for v in _values(delta):
        assert v not in out
    doc = json.loads(out)
    assert doc["schema"] == REDACTED_DELTA_SCHEMA and doc["bytes"] == len(raw) and is_redacted(out)
    if how == "intact":  # (refused for its message key, head or an entry: it decodes)
        assert doc["decoded"] is True and doc["head_id"] == delta.head_id and doc["d"] == delta.d
        assert [(e["kind"], e["sign"], e["n"], e["event_ids"], e["sample_ids"], e["subject_ids"])
                for e in doc["entries"]] == [
            ("rows" if isinstance(e, RowsEntry) else "packed", e.sign, e.n, list(e.event_ids), list(e.sample_ids),
             list(e.subject_ids)) for e in delta.entries]


@SLOW
@given(st.binary(max_size=300), st.booleans())
def test_delta_redaction_never_raises_and_keeps_only_sealed_deltas(raw: bytes, framed: bool) -> None:
    if framed:  # past the magic, into the decoder
        raw = b"ULDT" + raw
    out = redact_delta(raw)
    assert isinstance(out, bytes)
    assert is_redacted(out) or (out == raw and all(e.__class__.__name__ == "SealedRowsEntry"
                                                   for e in decode_delta(raw).entries))


def test_a_sealed_only_delta_is_kept_as_sent_and_a_mixed_one_is_summarized() -> None:
    q = np.array([[2**30 - 7, -(2**30) + 3]], dtype=np.int64)
    plain = Delta("h", "src", 2, 30, 0, (RowsEntry(1, ["e"], ["s"], ["u"], np.array([2**32 + 5]), q),))
    key = new_key()
    sealed = encode_delta(seal_delta(plain, lambda h, s: key))
    assert redact_delta(sealed) == sealed and not is_redacted(sealed)  # ciphertext: noise once the key is gone
    packed = PackedEntry(1, ["p"], ["ps"], ["pu"], b"BLOB-SECRET")
    mixed = encode_delta(seal_delta(Delta("h", "src", 2, 30, 0, (*plain.entries, packed)), lambda h, s: key))
    out = redact_delta(mixed)
    assert b"BLOB-SECRET" in mixed and b"BLOB-SECRET" not in out
    assert [e["kind"] for e in json.loads(out)["entries"]] == ["sealed", "packed"]
    for raw in (b"", b"ULDT", encode_delta(plain)):
        assert is_redacted(redact_delta(raw)) and json.loads(redact_delta(raw))["bytes"] == len(raw)


def test_erasure_report_finds_plaintext_rows_of_the_subject_in_a_delta_kept_as_sent() -> None:
    q = np.array([[5, 6], [7, 8]], dtype=np.int64)
    plain = Delta("h", "src", 2, 30, 0, (RowsEntry(1, ["e1", "e2"], ["s1", "s2"], ["alice", "bob"], np.arange(2), q),))
    raw = encode_delta(plain)
    assert readable_delta(raw, "h", "alice") == "a plaintext delta with 1 rows of the subject"
    assert readable_delta(raw, "h", "carol") is None and readable_delta(raw, "other", "alice") is None
    assert readable_delta(raw[:-1], "h", "alice") == "an undecodable delta naming the subject"
    key = new_key()
    assert readable_delta(encode_delta(seal_delta(plain, lambda h, s: key)), "h", "alice") is None
    assert readable_delta(redact_delta(raw), "h", "alice") is None  # a summary: ids, no rows
    assert readable_delta(b'{"subject_id": "alice"}', "h", "alice") is None  # a request: judged elsewhere
