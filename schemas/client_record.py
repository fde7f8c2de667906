"""``client-registry`` records: one client's identity and rights, ``unlearn.client/v1`` (JSON).

A client (an upstream app, a federated site, an operator's tool) is registered with its
Ed25519 public keys (each under a key id), the heads it may write (``"*"``: every head), whether
it may delete samples that another client added, and its rate limit (a token bucket of
``rate_per_second`` and ``burst`` requests). In ``UNLEARN_AUTH_MODE=signed`` the featurizer
accepts only requests signed by a key of the client their envelope names (docs/security.md).

Records are versioned like head contracts: the latest version of a client wins, and a change
(revoking a key or the whole client, adding a key) is a new version; nothing is deleted, so a
revocation cannot be undone by losing a record. JSON (``client.v1.schema.json``) because
operators and other languages read it; :func:`parse_client` is strict and names the field.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from dataclasses import dataclass, replace
from typing import Any

import orjson

from unlearn.schemas.envelope import is_valid_id
from unlearn.schemas.registry_record import (
    ID_GRAMMAR,
    check_id_and_version,
    load_document,
    open_document,
    require_fields,
    typed,
)

__all__ = [
    "ALL_HEADS",
    "CLIENT_SCHEMA_V1",
    "ClientError",
    "ClientKey",
    "ClientRecord",
    "decode_client",
    "encode_client",
    "key_fingerprint",
    "parse_client",
]

CLIENT_SCHEMA_V1 = "unlearn.client/v1"
ALL_HEADS = "*"
"""In ``heads``: the client may write every head."""
_MAX_KEYS = 16
_MAX_HEADS = 1024
_FIELDS = ("schema", "client_id", "version", "keys", "heads", "may_delete_others", "rate_per_second", "burst",
           "revoked")
_KEY_FIELDS = ("key_id", "public_key", "revoked")


class ClientError(ValueError):
    """A client record that is malformed, out of range, or not a valid change of its predecessor."""


def key_fingerprint(public_key: bytes) -> str:
    """The default key id of a public key: ``ed25519:`` and 16 hex digits of its SHA-256, so a
    key can be named without choosing a name (the CLI and the SDK agree on it)."""
    return "ed25519:" + hashlib.sha256(public_key).hexdigest()[:16]


@dataclass(frozen=True)
class ClientKey:
    """One Ed25519 public key (32 raw bytes) of a client, under ``key_id``."""

    key_id: str
    public_key: bytes
    revoked: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (the key as padded standard base64)."""
        return {"key_id": self.key_id, "public_key": base64.b64encode(self.public_key).decode(),
                "revoked": self.revoked}


@dataclass(frozen=True)
class ClientRecord:
    """One version of a client's registration (module docstring; fields as in the JSON).
    ``rate_per_second`` 0 means no rate limit."""

    client_id: str
    version: int
    keys: tuple[ClientKey, ...]
    heads: tuple[str, ...]
    may_delete_others: bool = False
    rate_per_second: float = 100.0
    burst: int = 200
    revoked: bool = False

    def __post_init__(self) -> None:
        _check(self)

    def key(self, key_id: str) -> ClientKey | None:
        """The key registered under ``key_id`` (revoked or not), or None."""
        return next((k for k in self.keys if k.key_id == key_id), None)

    def may_write(self, head_id: str) -> bool:
        """Whether the client may send requests for ``head_id``."""
        return ALL_HEADS in self.heads or head_id in self.heads

    def revoke(self, key_id: str | None = None) -> ClientRecord:
        """The next version with ``key_id`` revoked, or the whole client when None."""
        if key_id is None:
            return replace(self, version=self.version + 1, revoked=True)
        if self.key(key_id) is None:
            raise ClientError(f"client {self.client_id!r} has no key {key_id!r}")
        keys = tuple(replace(k, revoked=True) if k.key_id == key_id else k for k in self.keys)
        return replace(self, version=self.version + 1, keys=keys)

    def with_key(self, key: ClientKey) -> ClientRecord:
        """The next version with one more key (key rotation: add the new one, then revoke the old)."""
        if self.key(key.key_id) is not None:
            raise ClientError(f"client {self.client_id!r} already has a key {key.key_id!r}")
        return replace(self, version=self.version + 1, keys=(*self.keys, key))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object."""
        return {
            "schema": CLIENT_SCHEMA_V1, "client_id": self.client_id, "version": self.version,
            "keys": [k.to_dict() for k in self.keys], "heads": list(self.heads),
            "may_delete_others": self.may_delete_others, "rate_per_second": self.rate_per_second,
            "burst": self.burst, "revoked": self.revoked,
        }


def _check(c: ClientRecord) -> None:
    """Every range rule of the format (the JSON Schema says the same)."""
    check_id_and_version("client_id", c.client_id, c.version, ClientError)
    if not 1 <= len(c.keys) <= _MAX_KEYS:
        raise ClientError(f"a client has 1..{_MAX_KEYS} keys, got {len(c.keys)}")
    for k in c.keys:
        if not is_valid_id(k.key_id):
            raise ClientError(f"key_id must be {ID_GRAMMAR}, got {k.key_id!r}")
        if not isinstance(k.public_key, bytes) or len(k.public_key) != 32:
            raise ClientError(f"key {k.key_id!r}: an Ed25519 public key is 32 bytes")
    if len({k.key_id for k in c.keys}) != len(c.keys):
        raise ClientError("key ids must be distinct")
    if len(c.heads) > _MAX_HEADS or not all(h == ALL_HEADS or is_valid_id(h) for h in c.heads):
        raise ClientError(f"heads must be at most {_MAX_HEADS} head ids or '*'")
    if not (math.isfinite(c.rate_per_second) and c.rate_per_second >= 0):
        raise ClientError(f"rate_per_second must be a finite number >= 0, got {c.rate_per_second}")
    if not 1 <= c.burst <= 1_000_000:
        raise ClientError(f"burst must be in 1..1000000, got {c.burst}")


def _typed(d: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    return typed(d, name, kind, ClientError)


def _parse_key(d: Any) -> ClientKey:
    if not isinstance(d, dict) or set(d) - set(_KEY_FIELDS) or not {"key_id", "public_key"} <= set(d):
        raise ClientError(f"a key is an object with key_id, public_key and optional revoked, got {d!r:.80}")
    try:
        raw = base64.b64decode(_typed(d, "public_key", str), validate=True)
    except binascii.Error:
        raise ClientError("public_key must be padded standard base64") from None
    return ClientKey(_typed(d, "key_id", str), raw, _typed(d, "revoked", bool) if "revoked" in d else False)


def parse_client(d: Any) -> ClientRecord:
    """A client record from its JSON object; raises :class:`ClientError` naming the first problem."""
    d = open_document(d, schema=CLIENT_SCHEMA_V1, fields=_FIELDS, what="a client record", error=ClientError)
    require_fields(d, _FIELDS, ClientError)
    keys, heads = _typed(d, "keys", list), _typed(d, "heads", list)
    if not all(isinstance(h, str) for h in heads):
        raise ClientError("heads must be a list of strings")
    return ClientRecord(
        client_id=_typed(d, "client_id", str), version=_typed(d, "version", int),
        keys=tuple(_parse_key(k) for k in keys), heads=tuple(heads),
        may_delete_others=_typed(d, "may_delete_others", bool),
        rate_per_second=float(_typed(d, "rate_per_second", (int, float))), burst=_typed(d, "burst", int),
        revoked=_typed(d, "revoked", bool),
    )


def encode_client(c: ClientRecord) -> bytes:
    """The record value on ``client-registry`` (key: the client id, UTF-8)."""
    return orjson.dumps(c.to_dict())


def decode_client(raw: bytes) -> ClientRecord:
    """A record value of ``client-registry``; raises :class:`ClientError` (also for bad JSON)."""
    return parse_client(load_document(raw, ClientError))
