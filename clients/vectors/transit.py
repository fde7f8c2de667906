"""transit.json: sealing with fixed keys and nonces and every intermediate value, the by-head
partition rule and transit-key records, so the Java client seals what the featurizer opens."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from clients.vectors.envelopes import SIGN_SEED, request_from_spec
from clients.vectors.json_bytes import b64
from unlearn.common.by_head import head_partition
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.request_inputs import SealedInput, input_to_dict
from unlearn.schemas.signature import Signer
from unlearn.schemas.transit import (
    TransitKeyPair,
    TransitPublicKey,
    decode_public_record,
    encode_public_record,
    open_request,
    transit_aad,
    transit_key,
)

TRANSIT_PRIVATE = hashlib.sha256(b"transit-key-fixed").digest()
TRANSIT_KEY_ID = "0123456789abcdef0123456789abcdef"
EPHEMERAL = hashlib.sha256(b"ephemeral-fixed").digest()


def gen_transit() -> dict[str, Any]:
    """Transit sealing with a fixed transit key pair, a fixed ephemeral key and fixed nonces: every
    intermediate (shared secret, HKDF key, aad, plaintext) and the sealed envelope; the featurizer's
    open_request opens each. Also the by-head partition rule and transit-key records."""
    pair = TransitKeyPair(TRANSIT_KEY_ID, TRANSIT_PRIVATE)
    pub = TransitPublicKey(5, TRANSIT_KEY_ID, pair.public_key, 1767225600.0, 1767229200.0)
    eph = X25519PrivateKey.from_private_bytes(EPHEMERAL)
    epk = eph.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    shared = eph.exchange(X25519PublicKey.from_public_bytes(pub.public_key))
    k = transit_key(shared, epk, pub.public_key)
    common = {"head_id": "faces", "client_id": "app-1", "subject_id": "user-9"}
    specs = [
        {"event_id": "ev-s1", "op": "add", "sample_id": "img-1", "label": 3,
         "input": {"kind": "features", "encoding": "json", "values": [0.5, -0.25, 0.0]}, "ts": 1767225600.125},
        {"event_id": "ev-s2", "op": "add", "sample_id": "img-2", "label": 1,
         "input": {"kind": "features", "encoding": "f32", "values": [0.1, 0.2]}, "ts": 1767225600.25},
        {"event_id": "ev-s3", "op": "add", "sample_id": "t-1", "label": [1.5, -2.0],
         "input": {"kind": "text", "text": "héllo \"world\""}, "ts": 1767225601.0},
    ]
    sealed_cases = []
    signer = Signer(Ed25519PrivateKey.from_private_bytes(SIGN_SEED))
    for i, spec in enumerate(specs):
        full = {**common, **spec}
        req = request_from_spec(full)
        nonce = hashlib.sha256(b"nonce-%d" % i).digest()[:12]
        inner = orjson.dumps(input_to_dict(req.input))  # type: ignore[arg-type]
        aad = transit_aad(req.event_id, req.head_id, req.subject_id, req.sample_id, TRANSIT_KEY_ID)  # type: ignore[arg-type]
        ct = AESGCM(k).encrypt(nonce, inner, aad)
        sealed = Request(req.event_id, req.op, req.head_id, req.client_id, req.subject_id, req.sample_id, req.label,
                         SealedInput(TRANSIT_KEY_ID, epk, nonce, ct), req.ts)
        value = encode_request(sealed)
        opened = open_request(sealed, pair)
        assert opened.input == req.input, spec
        sealed_cases.append({**full, "nonce_hex": nonce.hex(), "plaintext": inner.decode("utf-8"),
                             "aad_hex": aad.hex(), "value": value.decode("utf-8"),
                             "sig": dict(signer.headers(value))["unlearn-sig"].decode()})  # type: ignore[union-attr]
    partitions = [{"head_id": h, "partitions": n, "partition": head_partition(h, n)}
                  for h in ("faces", "fmnist", "emb.v2:a@b+c-d_e", "x" * 128, "h", "tweets", "é")
                  for n in (1, 2, 3, 8, 12, 1000)]
    record = encode_public_record(pub)
    bad_records = [b"{}", b"not json", orjson.dumps({**orjson.loads(record), "public_key": b64(bytes(31))}),
                   orjson.dumps({**orjson.loads(record), "partition": -1}),
                   orjson.dumps({**orjson.loads(record), "schema": "unlearn.transit-key/v2"})]
    for r in bad_records:
        try:
            decode_public_record(r)
        except ValueError:
            continue
        raise AssertionError(r)
    return {
        "about": "X25519(ephemeral, transit public) -> HKDF-SHA256(salt epk||public, info "
                 "'unlearn-transit/v1 aes-256-gcm') -> AES-256-GCM(nonce, plaintext = inner input JSON, aad); "
                 "'value' is the sealed request's exact bytes, 'sig' its Ed25519 signature (envelopes.json key)",
        "transit_key": {"key_id": TRANSIT_KEY_ID, "private_hex": TRANSIT_PRIVATE.hex(),
                        "public_hex": pub.public_key.hex(), "record": record.decode("ascii")},
        "ephemeral": {"private_hex": EPHEMERAL.hex(), "public_hex": epk.hex(), "shared_hex": shared.hex(),
                      "aes_key_hex": k.hex()},
        "sealed": sealed_cases,
        "head_partition": partitions,
        "bad_records": [r.decode("utf-8", "replace") for r in bad_records],
    }
