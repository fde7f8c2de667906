"""envelopes.json: requests given as client API fields, their exact encoded bytes and Ed25519
signatures under a fixed key, and the invalid ones with their reason codes."""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clients.vectors.json_bytes import b64
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.request_inputs import FeaturesInput, ImageInput, TextInput
from unlearn.schemas.signature import Signer

#: The Ed25519 seed of the vectors' signing key (envelopes.json; transit.json signs with it too).
SIGN_SEED = bytes(range(1, 33))


def _input(spec: dict[str, Any]) -> Any:
    kind = spec["kind"]
    if kind == "features":
        return FeaturesInput(spec["values"], {"json": None, "f64": "<f8", "f32": "<f4"}[spec["encoding"]])
    if kind == "text":
        return TextInput(spec["text"])
    if kind == "image":
        return ImageInput(base64.b64decode(spec["png_b64"]), "png")
    raise ValueError(kind)


def request_from_spec(spec: dict[str, Any]) -> Request:
    """The Request a client builds from API fields (as the vectors list them); transit seals these too."""
    label = spec.get("label")
    lab = tuple(float(v) for v in label) if isinstance(label, list) else label
    return Request(spec["event_id"], spec["op"], spec["head_id"], spec["client_id"], spec["subject_id"],
                   spec.get("sample_id"), lab, _input(spec["input"]) if "input" in spec else None, spec.get("ts"))


def gen_envelopes() -> dict[str, Any]:
    """Requests (given as the fields a client API takes) -> encode_request's exact bytes, their
    Ed25519 signature headers under a fixed key, and invalid requests with their reason code."""
    priv = Ed25519PrivateKey.from_private_bytes(SIGN_SEED)
    signer = Signer(priv)
    signer_named = Signer(priv, "k-2026")
    rng = np.random.default_rng(11)
    common = {"head_id": "faces", "client_id": "app-1", "subject_id": "user-9"}
    specs: list[dict[str, Any]] = [
        {"name": "add_json", "event_id": "ev-1", "op": "add", "sample_id": "img-3", "label": 3,
         "input": {"kind": "features", "encoding": "json", "values": [0.5, -0.25, 0.0]}, "ts": 1767225600.125},
        {"name": "add_json_tricky_numbers", "event_id": "ev-2", "op": "add", "sample_id": "s", "label": 0,
         "input": {"kind": "features", "encoding": "json",
                   "values": [1e-7, 1.5e-5, 1e16, 1e15, -0.0, 5e-324, 0.1, 3, 1.7976931348623157e308]},
         "ts": 0.0},
        {"name": "add_f64", "event_id": "ev-3", "op": "add", "sample_id": "s", "label": 1,
         "input": {"kind": "features", "encoding": "f64", "values": [0.5, -0.25]}, "ts": 1.0},
        {"name": "add_f32", "event_id": "ev-4", "op": "add", "sample_id": "s", "label": 1,
         "input": {"kind": "features", "encoding": "f32", "values": [0.1, -0.2, 1e-3, 3.0]}, "ts": 2.5},
        {"name": "add_f64_random", "event_id": "ev-5", "op": "add", "sample_id": "s", "label": 2147483647,
         "input": {"kind": "features", "encoding": "f64", "values": rng.standard_normal(17).tolist()},
         "ts": 1767225600.0},
        {"name": "add_label_vector", "event_id": "ev-6", "op": "add", "sample_id": "s", "label": [0.25, -1.0, 3],
         "input": {"kind": "features", "encoding": "json", "values": rng.standard_normal(5).tolist()}, "ts": 3.0},
        {"name": "add_text_escapes", "event_id": "ev-7", "op": "add", "sample_id": "t-9", "label": 0,
         "input": {"kind": "text", "text": "quote \" backslash \\ slash / nl \n tab \t cr \r bs \b ff \f "
                                           "ctl \u0001\u001f del \u007f é 😀 \u2028 end"}, "ts": 4.0},
        {"name": "add_image", "event_id": "ev-8", "op": "add", "sample_id": "p-4", "label": 7,
         "input": {"kind": "image", "png_b64": b64(b"\x89PNG\r\n\x1a\n" + bytes(range(20)))}, "ts": 5.0},
        {"name": "add_no_ts", "event_id": "ev-9", "op": "add", "sample_id": "s", "label": 1,
         "input": {"kind": "features", "encoding": "json", "values": [1.0]}},
        {"name": "delete", "event_id": "ev-10", "op": "delete", "sample_id": "img-3", "ts": 1767225601.5},
        {"name": "delete_subject", "event_id": "ev-11", "op": "delete_subject", "ts": 1767225602.0},
        {"name": "delete_email_subject", "event_id": "a.b:c@d+e-f_g", "op": "delete", "sample_id": "x",
         "subject_id": "jane.doe+tag@example.com", "ts": 7.0},
    ]
    cases = []
    for spec in specs:
        full = {**common, **spec}
        value = encode_request(request_from_spec(full))
        sig_headers = dict(signer.headers(value))
        cases.append({**full, "value": value.decode("utf-8"),
                      "sig_key": sig_headers["unlearn-sig-key"].decode(),  # type: ignore[union-attr]
                      "sig": sig_headers["unlearn-sig"].decode()})  # type: ignore[union-attr]
    bad_specs = [
        ("bad_id_char", {**common, "event_id": "ev/1", "op": "delete", "sample_id": "s"}, "bad_field:event_id"),
        ("id_too_long", {**common, "event_id": "e" * 129, "op": "delete", "sample_id": "s"}, "bad_field:event_id"),
        ("nan_feature", {**common, "event_id": "e", "op": "add", "sample_id": "s", "label": 1,
                         "input": {"kind": "features", "encoding": "json", "values": [math.nan]}},
         "non_finite_feature"),
        ("inf_f32_feature", {**common, "event_id": "e", "op": "add", "sample_id": "s", "label": 1,
                             "input": {"kind": "features", "encoding": "f32", "values": [1e39]}},
         "non_finite_feature"),
        ("nan_label", {**common, "event_id": "e", "op": "add", "sample_id": "s", "label": [math.nan],
                       "input": {"kind": "features", "encoding": "json", "values": [1.0]}}, "non_finite_label"),
        ("negative_label", {**common, "event_id": "e", "op": "add", "sample_id": "s", "label": -1,
                            "input": {"kind": "features", "encoding": "json", "values": [1.0]}}, "bad_label"),
        ("empty_features", {**common, "event_id": "e", "op": "add", "sample_id": "s", "label": 1,
                            "input": {"kind": "features", "encoding": "json", "values": []}}, "bad_features"),
        ("empty_text", {**common, "event_id": "e", "op": "add", "sample_id": "s", "label": 1,
                        "input": {"kind": "text", "text": ""}}, "bad_text"),
        ("negative_ts", {**common, "event_id": "e", "op": "delete", "sample_id": "s", "ts": -1.0}, "bad_ts"),
    ]
    invalid = []
    for name, spec, reason in bad_specs:
        try:
            encode_request(request_from_spec(spec))
        except InvalidRequest as exc:
            assert exc.reason == reason, (name, exc.reason)
            invalid.append({"name": name, **{k: v for k, v in spec.items() if not _nan_in(v)},
                            "nan": [k for k, v in spec.items() if _nan_in(v)], "reason": reason})
            continue
        raise AssertionError(f"invalid request {name} encoded")
    seed_pem = priv.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()).decode("ascii")
    named = encode_request(request_from_spec({**common, **specs[0]}))
    return {
        "about": "encode_request bytes (orjson, fields in schema order) for requests given as API fields "
                 "(input.encoding json|f64|f32 = features / features_bin <f8 / <f4); signature headers "
                 "unlearn-sig-key / unlearn-sig (Ed25519 of the value bytes, key below); invalid requests "
                 "with the reason code (fields named in 'nan' hold NaN, which JSON cannot carry)",
        "signing_key": {"seed_hex": SIGN_SEED.hex(), "pkcs8_pem": seed_pem, "public_b64": b64(signer.public_key),
                        "key_id": signer.key_id,
                        "named": {"key_id": "k-2026", "value": named.decode(),
                                  "sig": dict(signer_named.headers(named))["unlearn-sig"].decode()}},  # type: ignore[union-attr]
        "cases": cases, "invalid": invalid,
    }


def _nan_in(v: Any) -> bool:
    if isinstance(v, float):
        return math.isnan(v)
    if isinstance(v, list):
        return any(_nan_in(x) for x in v)
    if isinstance(v, dict):
        return any(_nan_in(x) for x in v.values())
    return False
