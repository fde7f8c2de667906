"""Sealing for crypto-shredding: per-sample keys, sealed delta rows and transit-sealed raw inputs.

docs/erasure.md says why and when keys are destroyed; docs/formats.md has the byte layouts. Pure:
no I/O, no Kafka; random bytes come from ``os.urandom`` (AESGCM's documented practice) and the
``cryptography`` package.

**Per-sample keys.** Every sample a featurizer accepts gets its own 32-byte data key with a
random 16-byte key id (``SampleKey``). Whatever the system writes into an append-only log about
the sample (its quantized row and label in ``deltas``, its cached record in the
``featurizer-cache`` changelog) is sealed under that key with AES-256-GCM; destroying the key
(``streams/featurizer/erasure.py``) leaves the ciphertext as noise in logs that cannot delete
records.

- :func:`seal` / :func:`unseal`: ``nonce (12 random bytes) || ciphertext || tag (16)``, with the
  associated data :func:`aad` binding the purpose, head id, sample id and key id, so a ciphertext
  cannot be moved to another sample, head or use without failing authentication.
- :func:`commitment`: HMAC-SHA256, under a key derived from the sample key, over the canonical
  row bytes (:func:`row_bytes`). An add and its delete carry the same row, hence the same
  commitment: after the key is gone they can still be shown to be the same row without reading
  it (the verifier's erased-pair check).

**Sealed delta rows.** The featurizer seals each ROWS entry of a ``deltas`` message into a SEALED
entry (:func:`seal_delta`), one key per sample. The ledger worker and the verifier open it back
(:func:`open_delta`) into the ordinary ROWS entry the ledger applies, so
``streams/ledger/head_runtime.py`` never sees a sealed row. A row whose key is destroyed cannot be
opened: it is reported as an :class:`ErasedRow` and left out of the opened delta; an erased add
and the erased delete of the same (head, sample, key id, commitment) contribute ``+x - x = 0``,
which is how a full replay stays exact after erasure.

**Transit sealing of raw inputs** (docs/erasure.md section 5; docs/formats.md, "Sealed inputs").
A producer seals an add's ``input`` object for the by-head partition its head routes to, under
that partition's current *transit key* (an X25519 key pair whose public half the owning
featurizer publishes on ``<prefix>transit-keys``). The featurizer opens it right after parsing;
once the epoch's private half is destroyed, every copy of the sealed input left in ``requests``,
``requests.by-head`` or ``deadletter`` is noise.

- :func:`seal_input` / :func:`open_input`: ephemeral X25519 -> HKDF-SHA256 -> AES-256-GCM, the
  associated data :func:`transit_aad` binding a purpose string, the event, head, subject and
  sample ids and the transit key id, so a ciphertext cannot be moved to another request.
- :class:`TransitSealer`: one ephemeral key (so one X25519 exchange and one HKDF) for many
  requests under one transit key; each request still gets a fresh random 96-bit nonce and its
  own associated data, and the bytes are the same format. At most :data:`SEALER_MAX_MESSAGES`
  (2^20) messages per derived key keep the chance that two random nonces collide below 2^-57
  (NIST SP 800-38D allows 2^32 random-nonce messages per key, for 2^-32). Safe to share between
  threads: each seal takes its slot under a lock (an exact count, never past the bound; past it
  :class:`SealerExhausted`).
- :func:`opening_key` / :func:`open_input`'s ``aead``: the featurizer derives a (transit key,
  epk) pair's AES key once and caches it (``streams/featurizer/transit_open.DerivedKeys``).
- :class:`TransitPublicKey`: the public record (``unlearn.transit-key/v1``, JSON).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from unlearn.schemas.delta_codec import Delta, Entry, RowsEntry, SealedRowsEntry
from unlearn.schemas.envelope import Request, SealedInput, input_to_dict, parse_inner_input

__all__ = [
    "COMMITMENT_BYTES",
    "KEY_BYTES",
    "KEY_ID_BYTES",
    "NONCE_BYTES",
    "OVERHEAD",
    "PURPOSE_CHANGELOG",
    "PURPOSE_DEADLETTER",
    "PURPOSE_ROW",
    "SampleKey",
    "SealError",
    "aad",
    "commitment",
    "decode_key_record",
    "encode_key_record",
    "new_key",
    "parse_row",
    "row_bytes",
    "seal",
    "unseal",
    "ErasedRow",
    "KeyLookup",
    "Opened",
    "is_sealed",
    "open_delta",
    "seal_delta",
    "seal_entry",
    "PUBLIC_KEY_BYTES",
    "SEALER_MAX_MESSAGES",
    "TAG_BYTES",
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

KEY_BYTES = 32
KEY_ID_BYTES = 16
NONCE_BYTES = 12
TAG_BYTES = 16
OVERHEAD = NONCE_BYTES + TAG_BYTES
COMMITMENT_BYTES = 32

PURPOSE_ROW = "delta-row"  # a row (+ label) of a deltas message
PURPOSE_CHANGELOG = "cache-sample"  # a featurizer-cache sample record
PURPOSE_DEADLETTER = "deadletter-original"  # the original bytes of a refused request

_AAD_TAG = b"unlearn-seal/v1\x00"
_COMMIT_TAG = b"unlearn-commit/v1\x00"
_KEY_RECORD_MAGIC = b"ULSK\x01"
_COMMIT_KEY_MSG = _COMMIT_TAG + b"key"
_U16 = struct.Struct("<H").pack
_KEY_ID = re.compile(f"[0-9a-f]{{{2 * KEY_ID_BYTES}}}")


class SealError(ValueError):
    """A ciphertext that does not open under the given key and context (wrong key, moved,
    corrupted or truncated), or a malformed key record."""


@dataclass(frozen=True, slots=True)
class SampleKey:
    """One sample's data key. ``key_id``: 32 lowercase hex characters (16 random bytes)."""

    key_id: str
    key: bytes = b""

    def __post_init__(self) -> None:
        if len(self.key) != KEY_BYTES:
            raise SealError(f"a sample key has {KEY_BYTES} bytes, got {len(self.key)}")
        if _KEY_ID.fullmatch(self.key_id) is None:
            raise SealError(f"a key id is {2 * KEY_ID_BYTES} lowercase hex characters, got {self.key_id[:40]!r}")

    def __repr__(self) -> str:  # never print key material
        return f"SampleKey(key_id={self.key_id!r})"


def new_key() -> SampleKey:
    """A fresh random key with a fresh random key id."""
    return SampleKey(os.urandom(KEY_ID_BYTES).hex(), os.urandom(KEY_BYTES))


def aad(purpose: str, head_id: str, sample_id: str, key_id: str) -> bytes:
    """The associated data: ``"unlearn-seal/v1\\0"`` then purpose, head id, sample id, key id, each
    as u16 LE length + UTF-8 bytes (one join: this runs once per sealed or opened row)."""
    p, h, s, k = purpose.encode("utf-8"), head_id.encode("utf-8"), sample_id.encode("utf-8"), key_id.encode("utf-8")
    return b"".join((_AAD_TAG, _U16(len(p)), p, _U16(len(h)), h, _U16(len(s)), s, _U16(len(k)), k))


def seal(key: SampleKey, purpose: str, head_id: str, sample_id: str, plaintext: bytes) -> bytes:
    """``nonce || AES-256-GCM(plaintext, aad) || tag`` under a fresh random 96-bit nonce."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key.key).encrypt(nonce, plaintext, aad(purpose, head_id, sample_id, key.key_id))


def unseal(key: SampleKey, purpose: str, head_id: str, sample_id: str, sealed: bytes) -> bytes:
    """The plaintext of :func:`seal`; SealError unless it opens under exactly this context."""
    if len(sealed) < OVERHEAD:
        raise SealError(f"sealed value of {len(sealed)} bytes is shorter than nonce and tag ({OVERHEAD})")
    try:
        return AESGCM(key.key).decrypt(bytes(sealed[:NONCE_BYTES]), bytes(sealed[NONCE_BYTES:]),
                                       aad(purpose, head_id, sample_id, key.key_id))
    except InvalidTag:
        raise SealError(f"sealed value for ({head_id!r}, {sample_id!r}) does not open under key "
                        f"{key.key_id} ({purpose}): wrong key or context, or corrupt") from None


def row_bytes(q: np.ndarray, label: int | np.ndarray) -> bytes:
    """The canonical bytes of one row: ``q`` as int64 LE, then the label as int64 LE (one value
    for a class index, c values for a quantized target vector)."""
    lab = np.asarray(label, dtype="<i8").reshape(-1)
    return np.ascontiguousarray(q, dtype="<i8").tobytes() + lab.tobytes()


def parse_row(raw: bytes, d: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`row_bytes`: (q (d,), label (width,)) as int64 (width 1 for a class index)."""
    if len(raw) != 8 * (d + width):
        raise SealError(f"a row of d={d} and label width {width} has {8 * (d + width)} bytes, got {len(raw)}")
    a = np.frombuffer(raw, dtype="<i8").astype(np.int64)
    return a[:d], a[d:]


def commitment(key: SampleKey, head_id: str, sample_id: str, row: bytes) -> bytes:
    """HMAC-SHA256 under the sample's commitment key over ``"unlearn-commit/v1\\0"``, head id,
    sample id (u16-length-prefixed UTF-8) and the canonical row bytes: 32 bytes, equal for an add
    and its delete, unforgeable and unlinkable to the row without the key. The commitment key is
    ``HMAC-SHA256(key, "unlearn-commit/v1\\0key")``: a separate MAC key derived from the data key
    (never the AES key itself). One-shot ``hmac.digest`` (OpenSSL, no HMAC objects): per row."""
    h, s = head_id.encode("utf-8"), sample_id.encode("utf-8")
    msg = b"".join((_COMMIT_TAG, _U16(len(h)), h, _U16(len(s)), s, row))
    return hmac.digest(hmac.digest(key.key, _COMMIT_KEY_MSG, "sha256"), msg, "sha256")


def encode_key_record(key: SampleKey) -> bytes:
    """A key-family record value: ``ULSK\\x01`` + key id (16 bytes) + key (32 bytes)."""
    return _KEY_RECORD_MAGIC + bytes.fromhex(key.key_id) + key.key


def decode_key_record(raw: bytes) -> SampleKey:
    """Inverse of :func:`encode_key_record`."""
    if len(raw) != len(_KEY_RECORD_MAGIC) + KEY_ID_BYTES + KEY_BYTES or not raw.startswith(_KEY_RECORD_MAGIC):
        raise SealError("not a sample-key record")
    at = len(_KEY_RECORD_MAGIC)
    return SampleKey(raw[at: at + KEY_ID_BYTES].hex(), bytes(raw[at + KEY_ID_BYTES:]))


#: ``lookup(head_id, sample_id, key_id)``: the sample's key if it still exists with that id, else None.
KeyLookup = Callable[[str, str, str], SampleKey | None]


@dataclass(frozen=True)
class ErasedRow:
    """A sealed row whose key no longer exists: only its identifiers, commitment, event time,
    client (a delete's: its tombstone scope) and (a delete's) ``by_subject`` are known."""

    sign: int
    event_id: str
    sample_id: str
    subject_id: str
    key_id: str
    commitment: bytes
    event_us: int = 0
    by_subject: bool = False
    client_id: str = ""

    def pair_key(self) -> tuple[str, str, bytes]:
        """What an erased add and its erased delete share (the head is the delta's)."""
        return self.sample_id, self.key_id, self.commitment


@dataclass
class Opened:
    """A delta with its sealed entries opened (entries with no readable row left are dropped),
    and the rows that could not be opened because their key is destroyed."""

    delta: Delta
    erased: list[ErasedRow] = field(default_factory=list)
    sealed_rows: int = 0


def is_sealed(delta: Delta) -> bool:
    return any(isinstance(e, SealedRowsEntry) for e in delta.entries)


def seal_entry(head_id: str, e: RowsEntry, keys: list[SampleKey]) -> SealedRowsEntry:
    """``e`` sealed, row i under ``keys[i]`` (the key of sample ``e.sample_ids[i]``)."""
    labels = np.asarray(e.labels)
    vector = labels.ndim == 2
    coms, cts = [], []
    for i, (sample, key) in enumerate(zip(e.sample_ids, keys, strict=True)):
        row = row_bytes(e.q[i], labels[i])
        coms.append(commitment(key, head_id, sample, row))
        cts.append(seal(key, PURPOSE_ROW, head_id, sample, row))
    return SealedRowsEntry(e.sign, e.event_ids, e.sample_ids, e.subject_ids, 1 if vector else 0,
                           int(labels.shape[1]) if vector else 0, tuple(k.key_id for k in keys), tuple(coms),
                           tuple(cts), e.event_us, e.by_subject, e.client_ids)


def seal_delta(delta: Delta, key_for: Callable[[str, str], SampleKey]) -> Delta:
    """Every ROWS entry of ``delta`` sealed with ``key_for(head_id, sample_id)``; other entries
    (PACKED: statistics of many rows, federated mode) are kept as they are."""
    entries: list[Entry] = []
    for e in delta.entries:
        if isinstance(e, RowsEntry):
            entries.append(seal_entry(delta.head_id, e, [key_for(delta.head_id, s) for s in e.sample_ids]))
        else:
            entries.append(e)
    return replace(delta, entries=tuple(entries))  # the contract block (n_classes, version) stays


def open_delta(delta: Delta, lookup: KeyLookup) -> Opened:
    """Open every sealed entry. SealError if a row's key exists but the row does not open under
    it or does not match its commitment (a corrupt or forged message: the ledger refuses it)."""
    if not is_sealed(delta):
        return Opened(delta)
    out = Opened(delta)
    entries: list[Entry] = []
    for e in delta.entries:
        if not isinstance(e, SealedRowsEntry):
            entries.append(e)
            continue
        out.sealed_rows += e.n
        width = e.label_width
        size = 8 * (delta.d + width)
        keep: list[int] = []
        rows: list[bytes] = []
        for i in range(e.n):
            sample, kid = e.sample_ids[i], e.key_ids[i]
            key = lookup(delta.head_id, sample, kid)
            if key is None:
                out.erased.append(ErasedRow(e.sign, e.event_ids[i], sample, e.subject_ids[i], kid, e.commitments[i],
                                            e.event_us[i], e.by_subject, e.client_ids[i]))
                continue
            row = unseal(key, PURPOSE_ROW, delta.head_id, sample, e.ciphertexts[i])
            if commitment(key, delta.head_id, sample, row) != e.commitments[i]:
                raise SealError(f"row of sample {sample!r} (head {delta.head_id!r}) does not match its commitment")
            if len(row) != size:
                parse_row(row, delta.d, width)  # raises SealError with the sizes
            keep.append(i)
            rows.append(row)
        if not keep:
            continue
        # parse_row of every kept row at once: one buffer, two copies (q, labels), both C-contiguous int64
        flat = np.frombuffer(b"".join(rows), dtype="<i8").reshape(len(rows), delta.d + width)
        q = flat[:, :delta.d].astype(np.int64)
        labels = flat[:, delta.d].astype(np.int64) if e.label_kind == 0 else flat[:, delta.d:].astype(np.int64)
        entries.append(RowsEntry(e.sign, tuple(e.event_ids[i] for i in keep), tuple(e.sample_ids[i] for i in keep),
                                 tuple(e.subject_ids[i] for i in keep), labels, q,
                                 tuple(e.event_us[i] for i in keep), e.by_subject,
                                 tuple(e.client_ids[i] for i in keep)))
    out.delta = replace(delta, entries=tuple(entries))  # the contract block (n_classes, version) stays
    return out


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
    :attr:`exhausted` or when the transit key changes (``services/client/sdk.py`` does).
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
    ``envelope.InvalidRequest``: the opened input is not a valid inner input). ``aead``: the
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
