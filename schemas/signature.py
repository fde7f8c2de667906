"""Signed requests: what is signed, and how the signature travels (docs/security.md).

The signature is Ed25519 over the **exact bytes of the request message's value** (the
``unlearn.request/v1`` JSON as produced; nothing is canonicalised, so a producer in any
language signs the bytes it sends). It travels in two Kafka record headers:

- :data:`SIG_KEY_HEADER` (``unlearn-sig-key``): the key id, UTF-8, one of the keys registered
  for the envelope's ``client_id`` in the client registry;
- :data:`SIG_HEADER` (``unlearn-sig``): the 64-byte signature as padded standard base64 (88
  characters).

The featurizer's router forwards headers unchanged into the by-head topic, so the featurizer
that judges the request verifies it. Private keys are PKCS#8 PEM files (what ``openssl genpkey
-algorithm ed25519`` writes, and ``unlearn clients keygen``).
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from unlearn.schemas.client_record import key_fingerprint

__all__ = [
    "SIG_HEADER",
    "SIG_KEY_HEADER",
    "SignatureFormatError",
    "Signer",
    "generate_key_file",
    "load_private_key",
    "public_key_bytes",
    "read_signature",
    "sign_value",
    "verify_value",
]

SIG_KEY_HEADER = "unlearn-sig-key"
SIG_HEADER = "unlearn-sig"
SIGNATURE_BYTES = 64


class SignatureFormatError(ValueError):
    """Signature headers that are present but malformed (repeated, undecodable)."""


def sign_value(value: bytes, private_key: Ed25519PrivateKey) -> bytes:
    """The 64-byte Ed25519 signature of a request value."""
    return private_key.sign(value)


@functools.lru_cache(maxsize=4096)
def _public(raw: bytes) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(raw)


def verify_value(value: bytes, signature: bytes, public_key: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``value`` by the 32-byte
    ``public_key``. Never raises on bad input (a wrong length is simply invalid)."""
    if len(signature) != SIGNATURE_BYTES or len(public_key) != 32:
        return False
    try:
        _public(bytes(public_key)).verify(bytes(signature), bytes(value))
    except (InvalidSignature, ValueError):
        return False
    return True


def read_signature(headers: Sequence[tuple[str, bytes | None]] | None) -> tuple[str, bytes] | None:
    """(key id, signature) from a record's headers; None when neither header is present. Raises
    :class:`SignatureFormatError` when only one is, either is repeated, or they do not decode."""
    keys = [v for k, v in headers or () if k == SIG_KEY_HEADER]
    sigs = [v for k, v in headers or () if k == SIG_HEADER]
    if not keys and not sigs:
        return None
    if len(keys) != 1 or len(sigs) != 1 or keys[0] is None or sigs[0] is None:
        raise SignatureFormatError(f"need exactly one {SIG_KEY_HEADER} and one {SIG_HEADER} header, got "
                                   f"{len(keys)} and {len(sigs)}")
    try:
        key_id = keys[0].decode("utf-8")
        sig = base64.b64decode(sigs[0], validate=True)
    except (UnicodeDecodeError, binascii.Error, ValueError):
        raise SignatureFormatError(f"{SIG_KEY_HEADER} is not UTF-8 or {SIG_HEADER} is not base64") from None
    if len(sig) != SIGNATURE_BYTES:
        raise SignatureFormatError(f"{SIG_HEADER} decodes to {len(sig)} bytes, not {SIGNATURE_BYTES}")
    return key_id, sig


def public_key_bytes(private_key: Ed25519PrivateKey) -> bytes:
    """The raw 32-byte public key of a private key (what the client registry stores)."""
    return private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PKCS#8 PEM file (unencrypted); ValueError otherwise."""
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key


def generate_key_file(path: str | Path) -> Ed25519PrivateKey:
    """A new Ed25519 private key written to ``path`` as PKCS#8 PEM, readable by its owner only;
    refuses to overwrite an existing file (a key is never silently replaced)."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return key


class Signer:
    """Signs request values with one private key under one key id (default: the key's
    fingerprint, :func:`key_fingerprint`); what the SDK and CLI use."""

    def __init__(self, private_key: Ed25519PrivateKey, key_id: str | None = None) -> None:
        self.private_key = private_key
        self.public_key = public_key_bytes(private_key)
        self.key_id = key_id or key_fingerprint(self.public_key)

    @classmethod
    def from_file(cls, path: str | Path, key_id: str | None = None) -> Signer:
        """A signer for the PEM private key at ``path``."""
        return cls(load_private_key(path), key_id)

    def headers(self, value: bytes) -> list[tuple[str, str | bytes | None]]:
        """The two signature headers for a request value (typed as confluent-kafka's ``produce`` takes them)."""
        sig = base64.b64encode(sign_value(value, self.private_key))
        return [(SIG_KEY_HEADER, self.key_id.encode()), (SIG_HEADER, sig)]
