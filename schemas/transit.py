"""Transit sealing of raw inputs, pure (why and when: docs/erasure.md section 5; bytes, and the
2^20-message bound per derived key: docs/formats.md, "Sealed inputs"). A producer seals an add's
``input`` under its head's by-head partition's current transit key (X25519 -> HKDF-SHA256 ->
AES-256-GCM, :func:`seal_input`; associated data :func:`transit_aad` binds the request's ids and
the key id); :class:`TransitSealer` reuses one ephemeral key for many requests (thread-safe, an
exact count, :class:`SealerExhausted` past :data:`SEALER_MAX_MESSAGES`); the featurizer opens with
:func:`open_input`, deriving each (transit key, epk) AES key once (:func:`opening_key`);
:class:`TransitPublicKey` is the public record (``unlearn.transit-key/v1``).
"""

from __future__ import annotations

import base64
import binascii
import os
import struct
import threading
from dataclasses import dataclass, replace

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from unlearn.schemas.envelope import Request
from unlearn.schemas.request_inputs import SealedInput, input_to_dict, parse_inner_input
from unlearn.schemas.sealed import KEY_ID_BYTES, NONCE_BYTES, TAG_BYTES

__all__ = [
    "PUBLIC_KEY_BYTES",
    "SEALER_MAX_MESSAGES",
    "TRANSIT_KEY_SCHEMA",
    "TRANSIT_PURPOSE",
    "TransitError",
    "TransitKeyPair",
    "TransitPublicKey",
    "TransitSealer",
    "SealerExhausted",
    "decode_public_record",
    "encode_public_record",
    "new_transit_key",
    "open_input",
    "open_request",
    "opening_key",
    "seal_input",
    "seal_request",
    "transit_aad",
    "transit_key",
]

PUBLIC_KEY_BYTES = 32
TRANSIT_PURPOSE = "request-input"
TRANSIT_KEY_SCHEMA = "unlearn.transit-key/v1"
_TRANSIT_AAD_TAG = b"unlearn-transit/v1\x00"
_HKDF_INFO = b"unlearn-transit/v1 aes-256-gcm"
SEALER_MAX_MESSAGES = 1 << 20
"""Messages one :class:`TransitSealer` seals before a producer rolls a new ephemeral key (module
docstring: random-nonce collision chance below 2^-57 per derived key)."""


class TransitError(ValueError):
    """A sealed input that does not open (wrong key, moved, tampered, truncated), or a malformed
    transit key or public record."""


class SealerExhausted(TransitError):
    """A :class:`TransitSealer` has sealed its ``max_messages``: seal under a new ephemeral key
    (another thread may have taken the last slot between a check of ``exhausted`` and the seal)."""


@dataclass(frozen=True, slots=True)
class TransitPublicKey:
    """What a producer needs to seal for one by-head partition until ``use_until`` (Unix s)."""

    partition: int
    key_id: str
    public_key: bytes
    created: float
    use_until: float


@dataclass(frozen=True, slots=True)
class TransitKeyPair:
    """One epoch's key pair (the private half never leaves the featurizer and its key family)."""

    key_id: str
    private_key: bytes

    def __repr__(self) -> str:  # never print key material
        return f"TransitKeyPair(key_id={self.key_id!r})"

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte X25519 public key."""
        return _public_raw(X25519PrivateKey.from_private_bytes(self.private_key).public_key())


def _public_raw(pub: X25519PublicKey) -> bytes:
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def new_transit_key() -> TransitKeyPair:
    """A fresh epoch key pair with a fresh random key id (32 lowercase hex characters)."""
    priv = X25519PrivateKey.generate().private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                     serialization.NoEncryption())
    return TransitKeyPair(os.urandom(KEY_ID_BYTES).hex(), priv)


def _field(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<H", len(b)) + b


def transit_aad(event_id: str, head_id: str, subject_id: str, sample_id: str, key_id: str) -> bytes:
    """``"unlearn-transit/v1\\0"`` then purpose, event id, head id, subject id, sample id and
    transit key id, each as u16 LE length + UTF-8 bytes."""
    fields = (TRANSIT_PURPOSE, event_id, head_id, subject_id, sample_id, key_id)
    return _TRANSIT_AAD_TAG + b"".join(_field(s) for s in fields)


def transit_key(shared: bytes, epk: bytes, public_key: bytes) -> bytes:
    """The AES-256 key: HKDF-SHA256 of the X25519 shared secret, salt ``epk || public key``."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=epk + public_key, info=_HKDF_INFO).derive(shared)


class TransitSealer:
    """One producer's ephemeral key for one transit key: the X25519 exchange and HKDF happen once
    here, each :meth:`seal` is one AES-GCM encryption with a fresh random nonce. Only the derived
    AES key is kept (the ephemeral private key is dropped at once). Roll a new one when
    :attr:`exhausted` or when the transit key changes (``services/client/transit_key_cache.py`` does).
    Thread-safe: the count is taken under a lock, so at most ``max_messages`` seals ever succeed
    (the next raise :class:`SealerExhausted`); the encryption itself runs outside it."""

    __slots__ = ("_aead", "_lock", "epk", "max_messages", "public", "sealed")

    def __init__(self, public: TransitPublicKey, max_messages: int = SEALER_MAX_MESSAGES) -> None:
        if len(public.public_key) != PUBLIC_KEY_BYTES:
            raise TransitError(f"a transit public key has {PUBLIC_KEY_BYTES} bytes, got {len(public.public_key)}")
        eph = X25519PrivateKey.generate()
        self.public = public
        self.epk = _public_raw(eph.public_key())
        try:
            shared = eph.exchange(X25519PublicKey.from_public_bytes(public.public_key))
        except ValueError as exc:  # a low-order public key: all-zero shared secret
            raise TransitError(f"transit public key {public.key_id}: {exc}") from None
        self._aead = AESGCM(transit_key(shared, self.epk, public.public_key))
        self.max_messages = max_messages
        self.sealed = 0  # messages sealed (or being sealed) under the derived key; exact under threads
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never print key material
        return f"TransitSealer(key_id={self.public.key_id!r}, sealed={self.sealed})"

    @property
    def exhausted(self) -> bool:
        """Whether this sealer has sealed its :attr:`max_messages` (use a new one)."""
        return self.sealed >= self.max_messages

    def seal(self, inner_json: bytes, event_id: str, head_id: str, subject_id: str, sample_id: str) -> SealedInput:
        """The sealed input of ``inner_json`` bound to these ids, under a fresh random nonce;
        :class:`SealerExhausted` once ``max_messages`` were sealed (no more under this key)."""
        with self._lock:  # a read-modify-write: unlocked, two threads could both take the last slot
            if self.sealed >= self.max_messages:
                raise SealerExhausted(f"transit sealer for key {self.public.key_id} has sealed its "
                                      f"{self.max_messages} messages: use a new ephemeral key")
            self.sealed += 1
        nonce = os.urandom(NONCE_BYTES)
        ct = self._aead.encrypt(nonce, inner_json,
                                transit_aad(event_id, head_id, subject_id, sample_id, self.public.key_id))
        return SealedInput(self.public.key_id, self.epk, nonce, ct)

    def seal_request(self, req: Request) -> Request:
        """``req`` with its input sealed (an add; anything else is returned as it is)."""
        if req.op != "add" or req.input is None or req.sample_id is None or isinstance(req.input, SealedInput):
            return req
        inner = orjson.dumps(input_to_dict(req.input))
        return replace(req, input=self.seal(inner, req.event_id, req.head_id, req.subject_id, req.sample_id))


def seal_input(public: TransitPublicKey, inner_json: bytes, event_id: str, head_id: str, subject_id: str,
               sample_id: str) -> SealedInput:
    """The envelope's sealed input (``kind: sealed``) of ``inner_json`` (the JSON of the inner input
    object) for ``public``'s partition, under a fresh ephemeral key and nonce (one-shot
    :class:`TransitSealer`)."""
    return TransitSealer(public, 1).seal(inner_json, event_id, head_id, subject_id, sample_id)


def opening_key(pair: TransitKeyPair, epk: bytes) -> AESGCM:
    """The AES-GCM key of everything sealed under ``pair`` with ephemeral key ``epk`` (what the
    featurizer caches per (key id, epk)); TransitError for an epk that is not a usable key."""
    if len(epk) != PUBLIC_KEY_BYTES:
        raise TransitError("sealed input: epk must be 32 bytes")
    try:
        priv = X25519PrivateKey.from_private_bytes(pair.private_key)
        shared = priv.exchange(X25519PublicKey.from_public_bytes(epk))
    except ValueError as exc:  # e.g. an all-zero shared secret from a low-order epk
        raise TransitError(f"sealed input under transit key {pair.key_id}: {exc}") from None
    return AESGCM(transit_key(shared, epk, pair.public_key))


def open_input(pair: TransitKeyPair, sealed: SealedInput, event_id: str, head_id: str, subject_id: str,
               sample_id: str, aead: AESGCM | None = None) -> bytes:
    """The inner input's JSON bytes; TransitError unless it opens under exactly this context.
    ``aead``: :func:`opening_key` of (``pair``, ``sealed.epk``) if the caller cached it."""
    epk, nonce, ciphertext = sealed.epk, sealed.nonce, sealed.ciphertext
    if sealed.key_id != pair.key_id:
        raise TransitError(f"sealed input names transit key {sealed.key_id}, not {pair.key_id}")
    if len(epk) != PUBLIC_KEY_BYTES or len(nonce) != NONCE_BYTES or len(ciphertext) < TAG_BYTES:
        raise TransitError("sealed input: epk must be 32 bytes, nonce 12, ciphertext at least the 16-byte tag")
    key = aead if aead is not None else opening_key(pair, epk)
    try:
        return key.decrypt(nonce, ciphertext, transit_aad(event_id, head_id, subject_id, sample_id, pair.key_id))
    except InvalidTag:
        raise TransitError(f"sealed input of event {event_id!r} does not open under transit key {pair.key_id}: "
                           "moved to another event, head, subject or sample, or corrupt") from None


def seal_request(req: Request, public: TransitPublicKey) -> Request:
    """``req`` with its input sealed for transit (an add; anything else is returned as it is)."""
    if req.op != "add" or req.input is None or req.sample_id is None or isinstance(req.input, SealedInput):
        return req
    inner = orjson.dumps(input_to_dict(req.input))
    return replace(req, input=seal_input(public, inner, req.event_id, req.head_id, req.subject_id, req.sample_id))


def open_request(req: Request, pair: TransitKeyPair, aead: AESGCM | None = None) -> Request:
    """``req`` with its sealed input opened and parsed (TransitError: does not open;
    ``request_errors.InvalidRequest``: the opened input is not a valid inner input). ``aead``: the
    cached :func:`opening_key` of (``pair``, its epk), if any."""
    if not isinstance(req.input, SealedInput) or req.sample_id is None:
        return req
    inner = open_input(pair, req.input, req.event_id, req.head_id, req.subject_id, req.sample_id, aead)
    return replace(req, input=parse_inner_input(inner))


def encode_public_record(pub: TransitPublicKey) -> bytes:
    """The ``transit-keys`` record value (JSON, ``schema: unlearn.transit-key/v1``)."""
    return orjson.dumps({"schema": TRANSIT_KEY_SCHEMA, "partition": pub.partition, "key_id": pub.key_id,
                         "public_key": base64.b64encode(pub.public_key).decode("ascii"),
                         "created": pub.created, "use_until": pub.use_until})


def decode_public_record(raw: bytes) -> TransitPublicKey:
    """Inverse of :func:`encode_public_record`; TransitError on anything else."""
    try:
        d = orjson.loads(raw)
        if type(d) is not dict or d.get("schema") != TRANSIT_KEY_SCHEMA:
            raise TransitError("not a transit-key record")
        pub = TransitPublicKey(int(d["partition"]), str(d["key_id"]),
                               binascii.a2b_base64(str(d["public_key"]).encode("ascii"), strict_mode=True),
                               float(d["created"]), float(d["use_until"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, UnicodeEncodeError, binascii.Error) as exc:
        if isinstance(exc, TransitError):
            raise
        raise TransitError(f"bad transit-key record: {exc}") from None
    if len(pub.public_key) != PUBLIC_KEY_BYTES or pub.partition < 0:
        raise TransitError("bad transit-key record: public key not 32 bytes, or negative partition")
    return pub
