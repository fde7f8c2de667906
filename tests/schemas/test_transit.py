"""Transit sealing of raw inputs (schemas/transit.py): round trips, and a sealed input opens only
under exactly its key and context (docs/formats.md, "Sealed inputs")."""

from __future__ import annotations

import base64
import dataclasses

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unlearn.schemas.envelope import (
    FeaturesInput,
    InvalidRequest,
    Request,
    SealedInput,
    TextInput,
    encode_request,
    input_to_dict,
    parse_request,
)
from unlearn.schemas.transit import (
    TransitError,
    TransitPublicKey,
    decode_public_record,
    encode_public_record,
    new_transit_key,
    open_input,
    open_request,
    seal_input,
    seal_request,
)

PAIR = new_transit_key()
OTHER = new_transit_key()
PUB = TransitPublicKey(3, PAIR.key_id, PAIR.public_key, 1.0, 2.0)
IDS = ("ev-1", "faces", "alice", "img-1")

_id = st.text(alphabet="abcXYZ019._:@+-", min_size=1, max_size=12)
_inputs = (st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=8)
           .map(FeaturesInput) | st.text(min_size=1, max_size=40).map(TextInput))
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _add(inp: FeaturesInput | TextInput, event: str = "ev-1", head: str = "faces", subject: str = "alice",
         sample: str = "img-1") -> Request:
    return Request(event, "add", head, "app", subject, sample, 2, inp, 5.0)


@SLOW
@given(_inputs, _id, _id, _id, _id)
def test_a_sealed_request_round_trips_through_the_wire(inp: FeaturesInput | TextInput, event: str, head: str,
                                                       subject: str, sample: str) -> None:
    req = _add(inp, event, head, subject, sample)
    sealed = seal_request(req, PUB)
    assert isinstance(sealed.input, SealedInput) and sealed.input.key_id == PAIR.key_id
    wire = encode_request(sealed)
    assert orjson.dumps(input_to_dict(inp)) not in wire  # the plaintext input is not on the wire
    assert open_request(parse_request(wire), PAIR) == req


@SLOW
@given(st.data())
def test_any_byte_flip_fails(data: st.DataObject) -> None:
    sealed = seal_input(PUB, b'{"kind":"text","text":"secret"}', *IDS)
    name = data.draw(st.sampled_from(["epk", "nonce", "ciphertext"]))
    raw = bytearray(getattr(sealed, name))
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(TransitError):
        open_input(PAIR, dataclasses.replace(sealed, **{name: bytes(raw)}), *IDS)


@SLOW
@given(st.integers(0, 3), _id)
def test_a_moved_ciphertext_fails(which: int, other: str) -> None:
    sealed = seal_input(PUB, b'{"kind":"text","text":"secret"}', *IDS)
    moved = list(IDS)
    moved[which] = IDS[which] + other  # another event, head, subject or sample
    with pytest.raises(TransitError):
        open_input(PAIR, sealed, *moved)
    assert open_input(PAIR, sealed, *IDS) == b'{"kind":"text","text":"secret"}'


def test_another_key_or_key_id_fails() -> None:
    sealed = seal_input(PUB, b'{"kind":"text","text":"x"}', *IDS)
    with pytest.raises(TransitError):
        open_input(OTHER, sealed, *IDS)  # names PAIR's key id
    with pytest.raises(TransitError):
        open_input(OTHER, dataclasses.replace(sealed, key_id=OTHER.key_id), *IDS)  # wrong private key
    relabelled = dataclasses.replace(PAIR, key_id=OTHER.key_id)  # the right key under another id: AAD differs
    with pytest.raises(TransitError):
        open_input(relabelled, dataclasses.replace(sealed, key_id=OTHER.key_id), *IDS)


def test_a_nested_sealed_input_or_bad_inner_json_is_refused() -> None:
    inner = encode_request(seal_request(_add(TextInput("t")), PUB))
    nested = orjson.dumps(orjson.loads(inner)["input"])
    req = _add(TextInput("t"))
    twice = dataclasses.replace(req, input=seal_input(PUB, nested, *IDS))
    with pytest.raises(InvalidRequest) as info:
        open_request(twice, PAIR)
    assert info.value.reason == "bad_sealed_input"
    garbage = dataclasses.replace(req, input=seal_input(PUB, b"not json", *IDS))
    with pytest.raises(InvalidRequest) as info:
        open_request(garbage, PAIR)
    assert info.value.reason == "bad_sealed_input"
    bad_kind = dataclasses.replace(req, input=seal_input(PUB, b'{"kind":"audio"}', *IDS))
    with pytest.raises(InvalidRequest) as info:
        open_request(bad_kind, PAIR)
    assert info.value.reason == "bad_input_kind"


def test_deletes_are_not_sealed_and_the_public_record_round_trips() -> None:
    delete = Request("e", "delete", "h", "c", "s", "x")
    assert seal_request(delete, PUB) is delete
    assert decode_public_record(encode_public_record(PUB)) == PUB
    for bad in (b"{}", b"[]", b"not json", orjson.dumps({**orjson.loads(encode_public_record(PUB)),
                                                        "public_key": base64.b64encode(b"short").decode()})):
        with pytest.raises(TransitError):
            decode_public_record(bad)
