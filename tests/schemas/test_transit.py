"""Transit sealing of raw inputs (schemas/transit.py): round trips, and a sealed input opens only
under exactly its key and context (docs/formats.md, "Sealed inputs"). One ephemeral key for many
requests (``TransitSealer``): the bytes are the ordinary format, each request opens exactly as a
one-shot seal does (with or without a cached derived key), and every associated-data binding
still fails when a ciphertext is moved, including onto another request of the same sealer."""

from __future__ import annotations

import base64
import dataclasses
import threading

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.thread_support import run_racing
from unlearn.schemas.envelope import Request, encode_request, parse_request
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.request_inputs import FeaturesInput, SealedInput, TextInput, input_to_dict
from unlearn.schemas.transit import (
    SEALER_MAX_MESSAGES,
    SealerExhausted,
    TransitError,
    TransitPublicKey,
    TransitSealer,
    decode_public_record,
    encode_public_record,
    new_transit_key,
    open_input,
    open_request,
    opening_key,
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


_f32 = (st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=8)
        .flatmap(lambda v: st.sampled_from([FeaturesInput(v), FeaturesInput(v, "<f4")])))
_adds = st.builds(lambda inp, ev, h, s, x: Request(ev, "add", h, "app", s, x, 1, inp, 5.0),
                  _f32 | st.text(min_size=1, max_size=40).map(TextInput), _id, _id, _id, _id)


@SLOW
@given(st.lists(_adds, min_size=1, max_size=6))
def test_a_reused_ephemeral_key_opens_every_request_like_a_one_shot_seal(reqs: list[Request]) -> None:
    sealer = TransitSealer(PUB)
    wires = [encode_request(sealer.seal_request(r)) for r in reqs]
    parsed = [parse_request(w) for w in wires]
    sealed = [p.input for p in parsed]
    assert all(isinstance(s, SealedInput) and s.epk == sealer.epk and s.key_id == PAIR.key_id for s in sealed)
    assert len({s.nonce for s in sealed if isinstance(s, SealedInput)}) == len(reqs)  # a fresh nonce each
    assert sealer.sealed == len(reqs)
    aead = opening_key(PAIR, sealer.epk)
    for req, p in zip(reqs, parsed, strict=True):
        assert open_request(p, PAIR) == req == open_request(p, PAIR, aead)
        assert open_request(parse_request(encode_request(seal_request(req, PUB))), PAIR) == req  # one-shot alike
        assert orjson.dumps(input_to_dict(req.input)) not in encode_request(p)  # type: ignore[arg-type]


@SLOW
@given(_adds, _adds, st.integers(0, 4))
def test_every_binding_fails_when_moved_under_a_reused_key(a: Request, b: Request, which: int) -> None:
    sealer = TransitSealer(PUB)
    sa, sb = sealer.seal_request(a), sealer.seal_request(b)
    assert isinstance(sa.input, SealedInput) and isinstance(sb.input, SealedInput)
    aead = opening_key(PAIR, sealer.epk)
    ids = [a.event_id, a.head_id, a.subject_id, a.sample_id or ""]
    for key in (None, aead):
        if which < 4:  # another event, head, subject or sample id
            moved = list(ids)
            moved[which] += "~"
            with pytest.raises(TransitError):
                open_input(PAIR, sa.input, *moved, aead=key)
        else:  # the right private key under another key id: the AAD names the key id
            relabelled = dataclasses.replace(PAIR, key_id=OTHER.key_id)
            with pytest.raises(TransitError):
                open_input(relabelled, dataclasses.replace(sa.input, key_id=OTHER.key_id), *ids, aead=key)
        # b's ciphertext (same sealer, same epk, same derived key) moved onto a's ids
        if (b.event_id, b.head_id, b.subject_id, b.sample_id) != (a.event_id, a.head_id, a.subject_id, a.sample_id):
            with pytest.raises(TransitError):
                open_input(PAIR, sb.input, *ids, aead=key)
        assert open_input(PAIR, sa.input, *ids, aead=key) == orjson.dumps(input_to_dict(a.input))  # type: ignore


def test_a_sealer_is_exhausted_after_its_bound_and_two_sealers_differ() -> None:
    assert SEALER_MAX_MESSAGES == 1 << 20
    small = TransitSealer(PUB, max_messages=2)
    req = Request("e", "add", "h", "c", "s", "x", 1, TextInput("t"), 1.0)
    assert not small.exhausted
    small.seal_request(req)
    small.seal_request(req)
    assert small.exhausted
    other = TransitSealer(PUB)
    assert other.epk != small.epk  # a new ephemeral key, so a new derived key
    delete = Request("e", "delete", "h", "c", "s", "x")
    assert other.seal_request(delete) is delete and other.sealed == 0
    assert "key_id" in repr(other) and PAIR.key_id in repr(other)


def test_an_unusable_epk_or_public_key_is_a_transit_error() -> None:
    with pytest.raises(TransitError):
        opening_key(PAIR, b"short")
    with pytest.raises(TransitError):
        opening_key(PAIR, bytes(32))  # low order: all-zero shared secret
    with pytest.raises(TransitError):
        TransitSealer(dataclasses.replace(PUB, public_key=bytes(32)))
    with pytest.raises(TransitError):
        TransitSealer(dataclasses.replace(PUB, public_key=b"short"))


def _hammer(sealer: TransitSealer, threads: int, each: int) -> tuple[list[tuple[tuple[str, ...], SealedInput]], int]:
    """``threads`` threads sealing ``each`` messages through one sealer at once, switching as often
    as the interpreter allows: (ids, sealed input) of every seal that succeeded, and the refusals."""
    barrier = threading.Barrier(threads)
    done: list[list[tuple[tuple[str, ...], SealedInput]]] = [[] for _ in range(threads)]
    refused = [0] * threads

    def work(t: int) -> None:
        barrier.wait()
        for i in range(each):
            ids = (f"ev-{t}-{i}", "faces", "alice", f"img-{t}-{i}")
            try:
                done[t].append((ids, sealer.seal(b'{"kind":"text","text":"x"}', *ids)))
            except SealerExhausted:
                refused[t] += 1

    run_racing(work, threads)
    return [x for d in done for x in d], sum(refused)


@pytest.mark.parametrize("cap", [1, 37, 10_000])
def test_a_sealer_shared_by_threads_counts_exactly_and_never_seals_past_its_bound(cap: int) -> None:
    """Every seal takes its slot under the sealer's lock: no increment is lost (the count is exact
    when under the cap) and no thread seals past it (SealerExhausted instead); every message opens
    under its own ids with a fresh nonce."""
    threads, each = 8, 300
    sealer = TransitSealer(PUB, max_messages=cap)
    sealed, refused = _hammer(sealer, threads, each)
    assert len(sealed) == min(cap, threads * each) == sealer.sealed
    assert refused == threads * each - len(sealed)
    assert sealer.exhausted == (cap <= threads * each)
    assert len({s.nonce for _, s in sealed}) == len(sealed)
    aead = opening_key(PAIR, sealer.epk)
    for ids, s in sealed:
        assert open_input(PAIR, s, *ids, aead=aead) == b'{"kind":"text","text":"x"}'
    with pytest.raises(SealerExhausted):  # a TransitError, like every other refusal of this module
        TransitSealer(PUB, max_messages=0).seal(b"{}", *IDS)
