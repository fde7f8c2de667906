"""Signed requests, pure: the signature over the exact value bytes, the client record format,
and every refusal of the featurizer's screening (streams/featurizer/auth.py), no broker."""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.streams.featurizer.test_featurize import MemCache, cfg
from unlearn.schemas.client_record import (
    ClientError,
    ClientKey,
    ClientRecord,
    decode_client,
    encode_client,
    key_fingerprint,
)
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.request_inputs import FeaturesInput, TextInput
from unlearn.schemas.signature import (
    SIG_HEADER,
    SIG_KEY_HEADER,
    SignatureFormatError,
    Signer,
    generate_key_file,
    load_private_key,
    read_signature,
    sign_value,
    verify_value,
)
from unlearn.services.client.settings import ClientSettings
from unlearn.streams.featurizer.auth import AUTH_REASONS, Authorizer, AuthState
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.featurize import featurize_batch
from unlearn.streams.featurizer.reasons import FEATURIZER_REASONS
from unlearn.streams.featurizer.settings import FeaturizerSettings

NOW = 1_800_000_000.0
KEY_A = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
KEY_B = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
SIGN_A, SIGN_B = Signer(KEY_A, "a1"), Signer(KEY_B, "b1")


def record(client: str, signer: Signer, heads: tuple[str, ...] = ("*",), **kw: object) -> ClientRecord:
    return ClientRecord(client, 1, (ClientKey(signer.key_id, signer.public_key),), heads, **kw)  # type: ignore[arg-type]


def req(ev: str, op: str = "add", head: str = "h", client: str = "alice", subject: str = "s", sample: str | None = "x",
        ts: float | None = NOW) -> bytes:
    if op == "add":
        return encode_request(Request(ev, "add", head, client, subject, sample, 0, FeaturesInput((1.0, 0.0)), ts))
    if op == "delete":
        return encode_request(Request(ev, "delete", head, client, subject, sample, ts=ts))
    return encode_request(Request(ev, "delete_subject", head, client, subject, ts=ts))


def msgs(*items: tuple[bytes, Signer | None] | tuple[bytes, Signer | None, list], start: int = 0) -> list[InMessage]:
    out = []
    for i, item in enumerate(items):
        value, signer = item[0], item[1]
        headers = item[2] if len(item) > 2 else (signer.headers(value) if signer else [])  # type: ignore[misc]
        out.append(InMessage(0, start + i, value, b"k", None, tuple(headers)))
    return out


# --------------------------------------------------------------------------- signature
def test_sign_and_verify_over_the_exact_bytes() -> None:
    value = req("e1")
    sig = sign_value(value, KEY_A)
    assert verify_value(value, sig, SIGN_A.public_key)
    assert not verify_value(value, sig, SIGN_B.public_key)
    assert not verify_value(value + b" ", sig, SIGN_A.public_key)  # same JSON, other bytes
    assert not verify_value(value, sig[:63], SIGN_A.public_key)
    assert not verify_value(value, sig, b"\x00" * 31)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_byte_flip_invalidates(data: st.DataObject) -> None:
    value = data.draw(st.binary(min_size=1, max_size=300))
    sig = sign_value(value, KEY_A)
    assert verify_value(value, sig, SIGN_A.public_key)
    where = data.draw(st.sampled_from(["value", "signature"]))
    target = bytearray(value if where == "value" else sig)
    i = data.draw(st.integers(0, len(target) - 1))
    target[i] ^= data.draw(st.integers(1, 255))
    if where == "value":
        assert not verify_value(bytes(target), sig, SIGN_A.public_key)
    else:
        assert not verify_value(value, bytes(target), SIGN_A.public_key)


def test_signature_headers() -> None:
    value = req("e1")
    hdrs = SIGN_A.headers(value)
    assert read_signature(hdrs) == ("a1", sign_value(value, KEY_A))
    assert len(dict(hdrs)[SIG_HEADER]) == 88
    assert read_signature([("other", b"x")]) is None
    assert read_signature(None) is None
    for bad in ([hdrs[0]], [hdrs[1]], hdrs + hdrs[1:], [hdrs[0], (SIG_HEADER, b"not base64!")],
                [hdrs[0], (SIG_HEADER, base64.b64encode(b"short"))], [(SIG_KEY_HEADER, b"\xff"), hdrs[1]],
                [(SIG_KEY_HEADER, None), hdrs[1]]):
        with pytest.raises(SignatureFormatError):
            read_signature(bad)


def test_key_files(tmp_path: Path) -> None:
    path = tmp_path / "k.pem"
    key = generate_key_file(path)
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        generate_key_file(path)
    signer = Signer.from_file(path)
    assert signer.key_id == key_fingerprint(signer.public_key) and signer.key_id.startswith("ed25519:")
    assert signer.public_key == Signer(key).public_key
    assert load_private_key(path).sign(b"m") == key.sign(b"m")


# --------------------------------------------------------------------------- client records
def test_client_record_round_trip_and_changes() -> None:
    c = record("alice", SIGN_A, ("h", "g"), rate_per_second=5.0, burst=3)
    assert decode_client(encode_client(c)) == c
    assert c.may_write("h") and not c.may_write("other") and record("b", SIGN_B).may_write("anything")
    c2 = c.with_key(ClientKey("a2", SIGN_B.public_key)).revoke("a1")
    assert c2.version == 3 and c2.key("a1").revoked and not c2.key("a2").revoked  # type: ignore[union-attr]
    assert c2.revoke().revoked
    with pytest.raises(ClientError):
        c.revoke("nope")
    with pytest.raises(ClientError):
        c.with_key(ClientKey("a1", SIGN_B.public_key))


def test_client_records_match_the_json_schema() -> None:
    import jsonschema

    from unlearn.schemas import SCHEMA_DIR

    v = jsonschema.Draft202012Validator(orjson.loads((SCHEMA_DIR / "client.v1.schema.json").read_bytes()))
    c = record("alice", SIGN_A, ("h", "g"), rate_per_second=0.5, burst=3).with_key(ClientKey("k2", SIGN_B.public_key))
    for doc in (c.to_dict(), c.revoke("k2").revoke().to_dict(), record("b", SIGN_B).to_dict()):
        v.validate(doc)
    for change in ({"heads": ["a b"]}, {"burst": 0}, {"keys": []}, {"extra": 1}, {"rate_per_second": -1},
                   {"keys": [{"key_id": "k", "public_key": "AAAA"}]}):
        assert not v.is_valid({**c.to_dict(), **change}), change


@pytest.mark.parametrize("change", [
    {"schema": "x"}, {"client_id": "a\nb"}, {"version": 0}, {"keys": []}, {"heads": ["../x"]},
    {"rate_per_second": -1}, {"burst": 0}, {"revoked": "no"}, {"extra": 1},
    {"keys": [{"key_id": "k", "public_key": "AAAA"}]}, {"keys": [{"key_id": "k", "public_key": "!"}]},
])
def test_client_record_rejects(change: dict) -> None:
    d = {**record("alice", SIGN_A).to_dict(), **change}
    with pytest.raises(ClientError):
        decode_client(orjson.dumps(d))


# --------------------------------------------------------------------------- screening
def run(messages: list[InMessage], clients: dict[str, ClientRecord], cache: MemCache | None = None,
        state: AuthState | None = None, now: float = NOW, window: float = 300.0):
    cache = cache or MemCache()
    out = featurize_batch(messages, cache, cfg(), now=now, auth=Authorizer(clients, state or AuthState(), window))
    cache.apply(out.mutations)
    return out


def test_every_auth_reason_is_a_featurizer_reason() -> None:
    assert set(AUTH_REASONS) <= set(FEATURIZER_REASONS)


def test_signed_request_accepted_and_each_refusal() -> None:
    clients = {"alice": record("alice", SIGN_A, ("h",)), "bob": record("bob", SIGN_B, ("*",)),
               "gone": record("gone", SIGN_B).revoke(), "old": record("old", SIGN_B).revoke("b1")}
    forged = req("e-forged", client="alice", sample="x7")
    cases = [
        ((req("e-ok"), SIGN_A), None),
        ((req("e-unsigned", sample="x1"), None), "unsigned"),
        ((req("e-badhdr", sample="x2"), None, [(SIG_KEY_HEADER, b"a1")]), "bad_signature"),
        ((req("e-who", client="carol", sample="x3"), SIGN_A), "unknown_client"),
        ((req("e-key", sample="x4"), SIGN_B), "unknown_key"),  # bob's key id under alice
        ((req("e-gone", client="gone", sample="x5"), SIGN_B), "revoked_client"),
        ((req("e-old", client="old", sample="x6"), SIGN_B), "revoked_key"),
        ((forged, None, Signer(KEY_B, "a1").headers(forged)), "bad_signature"),  # alice's key id, bob's key
        ((req("e-head", head="g", sample="x8"), SIGN_A), "head_not_allowed"),
        ((req("e-stale", sample="x9", ts=NOW - 301), SIGN_A), "stale_request"),
        ((req("e-nots", sample="x10", ts=None), SIGN_A), "stale_request"),
        ((req("e-future", sample="x11", ts=NOW + 301), SIGN_A), "stale_request"),
    ]
    out = run(msgs(*(c for c, _ in cases)), clients)
    assert out.accepted == 1
    assert out.receipts == []  # adds get no receipts
    assert [d.reason for d in out.deadletters] == [r for _, r in cases if r]
    assert [d.event_id for d in out.deadletters] == [m for (c, r) in cases if r
                                                     for m in [orjson.loads(c[0])["event_id"]]]


def test_a_tampered_value_with_its_original_signature_is_refused() -> None:
    value = req("e1")
    hdrs = SIGN_A.headers(value)
    tampered = value.replace(b'"head_id":"h"', b'"head_id":"g"')
    assert tampered != value
    out = run(msgs((tampered, None, hdrs)), {"alice": record("alice", SIGN_A)})
    assert out.reasons() == {"bad_signature": 1}


def test_replayed_within_the_window_and_stale_after_it() -> None:
    clients = {"alice": record("alice", SIGN_A), "bob": record("bob", SIGN_B)}
    state = AuthState()
    add_x = req("e1")
    out = run(msgs((add_x, SIGN_A)), clients, state=state)
    assert out.accepted == 1
    # the same signed bytes again (a later batch), and the same event id in one batch
    out = run(msgs((add_x, SIGN_A), (req("e2", sample="y"), SIGN_A), (req("e2", sample="z"), SIGN_A), start=1),
              clients, state=state, now=NOW + 10)
    assert [d.reason for d in out.deadletters] == ["replayed", "replayed"] and out.accepted == 1
    # another client's event ids are its own: bob cannot burn alice's
    out = run(msgs((req("e1", client="bob", sample="b"), SIGN_B), start=4), clients, state=state, now=NOW + 10)
    assert out.accepted == 1
    # a replayed delete gets a dead letter but no rejected receipt (its first copy was answered)
    cache = MemCache()
    st_ = AuthState()
    d = req("d1", op="delete")
    out = run(msgs((add_x, SIGN_A), (d, SIGN_A), (d, SIGN_A)), clients, cache=cache, state=st_)
    assert out.reasons() == {"replayed": 1} and out.receipts == []
    # past the window the event id is forgotten, and the copy is stale instead
    out = run(msgs((add_x, SIGN_A), start=3), clients, cache=cache, state=st_, now=NOW + 301)
    assert out.reasons() == {"stale_request": 1} and not st_.seen


def test_rate_limit_token_bucket() -> None:
    clients = {"alice": record("alice", SIGN_A, rate_per_second=2.0, burst=3)}
    state = AuthState()
    out = run(msgs(*((req(f"e{i}", sample=f"x{i}"), SIGN_A) for i in range(5))), clients, state=state)
    assert out.accepted == 3 and out.reasons() == {"rate_limited": 2}
    # one second later: two more tokens; refused requests spent none and are not "seen"
    out = run(msgs(*((req(f"e{i}", sample=f"x{i}"), SIGN_A) for i in range(3, 6)), start=5), clients, state=state,
              now=NOW + 1.0)
    assert out.accepted == 2 and out.reasons() == {"rate_limited": 1}
    # unsigned requests naming alice do not drain her bucket
    out = run(msgs(*((req(f"u{i}", sample=f"u{i}"), None) for i in range(10)), (req("e9", sample="x9"), SIGN_A),
                   start=8), clients, state=state, now=NOW + 2.0)
    assert out.reasons() == {"unsigned": 10} and out.accepted == 1
    unlimited = {"alice": record("alice", SIGN_A, rate_per_second=0.0, burst=1)}
    out = run(msgs(*((req(f"e{i}", sample=f"x{i}"), SIGN_A) for i in range(50))), unlimited)
    assert out.accepted == 50


def test_deleting_another_clients_sample_needs_the_right() -> None:
    clients = {"alice": record("alice", SIGN_A), "bob": record("bob", SIGN_B),
               "admin": record("admin", Signer(KEY_B, "adm"), may_delete_others=True)}
    admin = Signer(KEY_B, "adm")
    cache = MemCache()
    state = AuthState()
    out = run(msgs((req("a1", sample="x1"), SIGN_A), (req("a2", sample="x2"), SIGN_A),
                   (req("b1", client="bob", sample="x3"), SIGN_B)), clients, cache, state)
    assert out.accepted == 3
    out = run(msgs((req("bd1", "delete", client="bob", sample="x1"), SIGN_B),
                   (req("bd2", "delete_subject", client="bob"), SIGN_B), start=3), clients, cache, state)
    assert out.reasons() == {"not_owner": 2} and out.accepted == 0
    assert [(r.status, r.reason) for r in out.receipts] == [("rejected", "not_owner")] * 2
    out = run(msgs((req("ad1", "delete", client="admin", sample="x1"), admin),
                   (req("ad2", "delete_subject", client="admin"), admin), start=5), clients, cache, state)
    assert out.accepted == 2 and not out.deadletters
    assert sorted(s for _, s in out.mutations.drop_samples) == ["x1", "x2", "x3"]


def test_refused_adds_are_never_encoded() -> None:
    calls: list[str] = []

    def encoder(name: str, items: list) -> object:
        calls.append(name)
        raise AssertionError("a refused add reached the backbone")

    text = encode_request(Request("t1", "add", "h", "alice", "s", "x", 0, TextInput("hello"), NOW))
    out = featurize_batch(msgs((text, None)), MemCache(), cfg(), encoder, now=NOW,  # type: ignore[arg-type]
                          auth=Authorizer({"alice": record("alice", SIGN_A)}, AuthState(), 300.0))
    assert out.reasons() == {"unsigned": 1} and calls == []


def test_auth_off_is_todays_behaviour() -> None:
    out = featurize_batch(msgs((req("e1"), None)), MemCache(), cfg(), now=NOW)
    assert out.accepted == 1


# --------------------------------------------------------------------------- bad-input corpus
def hostile_corpus(signer: Signer, now: float = NOW, client: str = "alice",
                   head: str = "h") -> list[tuple[str, bytes, list]]:
    """(expected reason, value, headers): hostile signature headers, for the pure core and for
    the broker test (test_signed.py). Each must be refused; none may stop the worker."""
    def v(ev: str) -> bytes:
        return req(ev, "delete", head=head, client=client, sample=f"s-{ev}", ts=now)

    good = signer.headers(v("g"))
    sig = dict(good)[SIG_HEADER]
    return [
        ("bad_signature", v("h1"), [(SIG_KEY_HEADER, signer.key_id.encode()), (SIG_HEADER, b"A" * 10_000)]),
        ("unknown_key", v("h2"), [(SIG_KEY_HEADER, "\n[ERROR] forged ☃".encode() * 300), (SIG_HEADER, sig)]),
        ("bad_signature", v("h3"), [(SIG_KEY_HEADER, None), (SIG_HEADER, None)]),
        ("bad_signature", v("h4"), [*signer.headers(v("h4")), (SIG_HEADER, sig)]),
        ("bad_signature", v("h5"), [(SIG_KEY_HEADER, signer.key_id.encode()),
                                    (SIG_HEADER, base64.b64encode(b"\x00" * 63))]),
        ("bad_signature", v("h6"), [(SIG_KEY_HEADER, signer.key_id.encode()),
                                    (SIG_HEADER, base64.b64encode(b"\x00" * 64))]),
        ("not_json", b"\xff not json", signer.headers(b"\xff not json")),
        ("bad_signature", v("h8") + b"\n", signer.headers(v("h8"))),
        ("unknown_key", v("h9"), [(SIG_KEY_HEADER, b"*"), (SIG_HEADER, sig)]),
        ("unsigned", v("h10"), [("Unlearn-Sig-Key", signer.key_id.encode()), ("Unlearn-Sig", sig)]),
        ("bad_signature", v("h11"), [(SIG_KEY_HEADER, b"\xc3\x28"), (SIG_HEADER, sig)]),
    ]


def test_hostile_signature_headers_are_refused_never_raise() -> None:
    corpus = hostile_corpus(SIGN_A)
    out = run([InMessage(0, i, value, None, None, tuple(h)) for i, (_, value, h) in enumerate(corpus)],
              {"alice": record("alice", SIGN_A)})
    assert [d.reason for d in out.deadletters] == [r for r, _, _ in corpus]
    assert all("\n" not in d.detail for d in out.deadletters)
    assert out.receipts == []  # unauthenticated deletes: no receipt under anybody's event id


def test_receipts_only_for_deletes_a_valid_key_vouches_for() -> None:
    clients = {"alice": record("alice", SIGN_A, ("h",)), "gone": record("gone", SIGN_B).revoke()}
    spoof = req("victim-event", "delete", sample="x1")  # alice's pending event id, unsigned
    out = run(msgs((spoof, None), (spoof, SIGN_B), (req("e2", "delete", client="gone", sample="x2"), SIGN_B),
                   (b'{"schema":"unlearn.request/v1","op":"delete","event_id":"victim-2","head_id":"h",'
                    b'"client_id":"alice","subject_id":"s","sample_id":"x1","bogus":1}', None),
                   (req("e3", "delete", head="g", sample="x1"), SIGN_A), (req("e4", "delete", sample="zz"), SIGN_A)),
              clients)
    assert out.reasons() == {"unsigned": 1, "unknown_key": 1, "revoked_client": 1, "unknown_field:bogus": 1,
                             "head_not_allowed": 1}
    assert sorted((r.event_id, r.status, r.reason) for r in out.receipts) == [
        ("e3", "rejected", "head_not_allowed"), ("e4", "tombstoned", None)]
    # a client that may delete only its own samples leaves a tombstone that blocks only its own adds
    assert [(t.id, t.client_id) for t in out.mutations.put_tombstones] == [("zz", "alice")]
    # with auth off, an invalid delete still gets its rejected receipt (today's behaviour)
    bad = msgs((b'{"schema":"unlearn.request/v1","op":"delete","event_id":"v","head_id":"h","client_id":"a",'
                b'"subject_id":"s","sample_id":"x","bogus":1}', None))
    assert [r.event_id for r in featurize_batch(bad, MemCache(), cfg(), now=NOW).receipts] == ["v"]


# --------------------------------------------------------------------------- settings
def test_auth_settings_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from unlearn.infra.settings import Settings

    assert Settings().auth_mode == "off"  # the default: today's behaviour, one-command demo
    key = tmp_path / "k.pem"
    generate_key_file(key)
    monkeypatch.setenv("UNLEARN_AUTH_MODE", "signed")
    monkeypatch.setenv("UNLEARN_AUTH_REPLAY_WINDOW_SECONDS", "60")
    monkeypatch.setenv("UNLEARN_CLIENT_KEY_FILE", str(key))
    s = Settings.from_env()
    window, key_file = FeaturizerSettings.of(s).auth_replay_window_seconds, ClientSettings.of(s).client_key_file
    assert (s.auth_mode, window, key_file) == ("signed", 60.0, str(key))
    for bad, needle in (({"auth_mode": "maybe"}, "UNLEARN_AUTH_MODE"),
                        ({"auth_replay_window_seconds": 0.0}, "UNLEARN_AUTH_REPLAY_WINDOW_SECONDS"),
                        ({"client_key_file": str(tmp_path / "none.pem")}, "UNLEARN_CLIENT_KEY_FILE"),
                        ({"client_key_file": "", "client_key_id": "k"}, "UNLEARN_CLIENT_KEY_ID")):
        with pytest.raises(ValueError, match=needle):
            s.with_(**bad)


def test_sdk_signs_with_the_key_file(tmp_path: Path) -> None:
    from unlearn.infra.settings import Settings
    from unlearn.services.client.sdk import UnlearnClient

    key = tmp_path / "k.pem"
    generate_key_file(key)
    s = Settings().with_(bootstrap="127.0.0.1:1", client_key_file=str(key), client_key_id="mine")
    client = UnlearnClient(s)
    try:
        assert client.signer is not None and client.signer.key_id == "mine"
        assert client.signer.public_key == Signer.from_file(key).public_key
    finally:
        client.close(0.1)
    unsigned = UnlearnClient(Settings(bootstrap="127.0.0.1:1"))
    assert unsigned.signer is None
    unsigned.close(0.1)


def test_key_rotation_add_switch_revoke() -> None:
    new = Signer(KEY_B, "a2")
    v1 = record("alice", SIGN_A)
    v2 = v1.with_key(ClientKey(new.key_id, new.public_key))
    v3 = v2.revoke("a1")
    state = AuthState()
    out = run(msgs((req("e1", sample="x1"), SIGN_A), (req("e2", sample="x2"), new)), {"alice": v2}, state=state)
    assert out.accepted == 2  # both keys sign while the old one is not revoked
    out = run(msgs((req("e3", sample="x3"), SIGN_A), (req("e4", sample="x4"), new), start=2), {"alice": v3},
              state=state)
    assert out.reasons() == {"revoked_key": 1} and out.accepted == 1
