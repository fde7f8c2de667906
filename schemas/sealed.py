"""Sealing for crypto-shredding, pure: per-sample keys (:class:`SampleKey`), AES-256-GCM with
associated data binding purpose, head, sample and key id (:func:`seal`, :func:`aad`), the row
commitment an add and its delete share (:func:`commitment`, over the canonical int64 row whatever
the sealed layout), and sealed ``deltas`` rows (:func:`seal_delta`: SEALED32, q as i32;
:func:`open_delta` opens SEALED32 and the older SEALED, reporting rows under destroyed keys as
:class:`ErasedRow`). Why and when keys are destroyed: docs/erasure.md sections 2-4; byte layouts:
docs/formats.md. Raw inputs sealed for transit: ``schemas/transit.py``.
"""

from __future__ import annotations

import hmac
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from unlearn.schemas.delta_codec import Delta, Entry, RowsEntry, SealedRowsEntry

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
    "wire_row",
    "seal",
    "unseal",
    "ErasedRow",
    "KeyLookup",
    "Opened",
    "is_sealed",
    "open_delta",
    "seal_delta",
    "seal_entry",
    "TAG_BYTES",
]

KEY_BYTES = 32
KEY_ID_BYTES = 16
NONCE_BYTES = 12
TAG_BYTES = 16
OVERHEAD = NONCE_BYTES + TAG_BYTES
COMMITMENT_BYTES = 32
QMAX = 1 << 30  # ledger.quantization.QMAX (schemas does not import the ledger): |q| of every row

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
    """One sample's data key. ``key_id``: 32 lowercase hex characters (16 random bytes).
    ``commit_key`` is derived from it when it is made (:func:`commitment`): a ledger reads keys on
    its key follower's thread, so the derivation is off the thread that opens the rows."""

    key_id: str
    key: bytes = b""
    commit_key: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.key) != KEY_BYTES:
            raise SealError(f"a sample key has {KEY_BYTES} bytes, got {len(self.key)}")
        if _KEY_ID.fullmatch(self.key_id) is None:
            raise SealError(f"a key id is {2 * KEY_ID_BYTES} lowercase hex characters, got {self.key_id[:40]!r}")
        object.__setattr__(self, "commit_key", hmac.digest(self.key, _COMMIT_KEY_MSG, "sha256"))

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
    """The canonical bytes of one row, what its commitment covers: ``q`` as int64 LE, then the
    label as int64 LE (one value for a class index, c values for a quantized target vector)."""
    lab = np.asarray(label, dtype="<i8").reshape(-1)
    return np.ascontiguousarray(q, dtype="<i8").tobytes() + lab.tobytes()


def _q32(q: np.ndarray, what: str) -> np.ndarray:
    """``q`` as int32 LE; SealError unless every |q| <= 2^30 (never a silent wrap)."""
    a = np.asarray(q)
    if a.dtype.kind not in "iu":
        raise SealError(f"{what}: q must be integers, got dtype {a.dtype}")
    if a.size and (a.max() > QMAX or a.min() < -QMAX):
        raise SealError(f"{what}: |q| exceeds 2^30, not a value the quantizer produces")
    return np.ascontiguousarray(a, dtype="<i4")


def wire_row(q: np.ndarray, label: int | np.ndarray) -> bytes:
    """The sealed plaintext of one row (SEALED32): ``q`` as int32 LE (SealError unless |q| <= 2^30),
    then the label as int64 LE (a quantized target may exceed int32)."""
    return _q32(q, "row").tobytes() + np.asarray(label, dtype="<i8").reshape(-1).tobytes()


def parse_row(raw: bytes, d: int, width: int, q_itemsize: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`wire_row` (``q_itemsize`` 4) or of :func:`row_bytes` (8, rows sealed
    before SEALED32): (q (d,), label (width,)) as int64 (width 1 for a class index). SealError on
    a wrong size or |q| > 2^30 in either layout."""
    size = q_itemsize * d + 8 * width
    if q_itemsize not in (4, 8) or len(raw) != size:
        raise SealError(f"a row of d={d}, label width {width} and q as i{8 * q_itemsize} has {size} bytes, "
                        f"got {len(raw)}")
    q = np.frombuffer(raw, dtype=f"<i{q_itemsize}", count=d).astype(np.int64)
    if d and (q.max() > QMAX or q.min() < -QMAX):
        raise SealError("a sealed row holds |q| > 2^30, not a value the quantizer produces")
    return q, np.frombuffer(raw, dtype="<i8", offset=q_itemsize * d).astype(np.int64)


def commitment(key: SampleKey, head_id: str, sample_id: str, row: bytes) -> bytes:
    """HMAC-SHA256 under the sample's commitment key over ``"unlearn-commit/v1\\0"``, head id,
    sample id (u16-length-prefixed UTF-8) and the canonical row bytes: 32 bytes, equal for an add
    and its delete, unforgeable and unlinkable to the row without the key. The commitment key is
    ``HMAC-SHA256(key, "unlearn-commit/v1\\0key")``: a separate MAC key derived from the data key
    (never the AES key itself). One-shot ``hmac.digest`` (OpenSSL, no HMAC objects): per row."""
    h, s = head_id.encode("utf-8"), sample_id.encode("utf-8")
    msg = b"".join((_COMMIT_TAG, _U16(len(h)), h, _U16(len(s)), s, row))
    return hmac.digest(key.commit_key, msg, "sha256")


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
    """``e`` sealed as SEALED32, row i under ``keys[i]`` (the key of sample ``e.sample_ids[i]``):
    the plaintext is :func:`wire_row`, the commitment covers :func:`row_bytes`. SealError if a
    |q| exceeds 2^30."""
    labels = np.asarray(e.labels)
    vector = labels.ndim == 2
    q32 = _q32(e.q, f"head {head_id!r}")
    lab = np.ascontiguousarray(labels, dtype="<i8").reshape(len(e.sample_ids), -1)
    q64 = q32.astype("<i8")
    coms, cts = [], []
    for i, (sample, key) in enumerate(zip(e.sample_ids, keys, strict=True)):
        label = lab[i].tobytes()
        coms.append(commitment(key, head_id, sample, q64[i].tobytes() + label))
        cts.append(seal(key, PURPOSE_ROW, head_id, sample, q32[i].tobytes() + label))
    return SealedRowsEntry(e.sign, e.event_ids, e.sample_ids, e.subject_ids, 1 if vector else 0,
                           int(labels.shape[1]) if vector else 0, tuple(k.key_id for k in keys), tuple(coms),
                           tuple(cts), e.event_us, e.by_subject, e.client_ids, q_itemsize=4)


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
    """Open every sealed entry (q as i32 or, sealed before SEALED32, as i64; int64 either way once
    opened). SealError if a row's key exists but the row does not open under it, does not match
    its commitment or holds |q| > 2^30 (a corrupt or forged message: the ledger refuses it)."""
    if not is_sealed(delta):
        return Opened(delta)
    out = Opened(delta)
    entries: list[Entry] = []
    for e in delta.entries:
        if not isinstance(e, SealedRowsEntry):
            entries.append(e)
            continue
        out.sealed_rows += e.n
        width, qsize = e.label_width, e.q_itemsize
        qbytes = qsize * delta.d
        size = qbytes + 8 * width  # the plaintext: q (qsize bytes each), then the label (i64)
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
            if len(row) != size:
                parse_row(row, delta.d, width, qsize)  # raises SealError with the sizes
            canonical = row if qsize == 8 else \
                np.frombuffer(row, dtype="<i4", count=delta.d).astype("<i8").tobytes() + row[qbytes:]
            if commitment(key, delta.head_id, sample, canonical) != e.commitments[i]:
                raise SealError(f"row of sample {sample!r} (head {delta.head_id!r}) does not match its commitment")
            keep.append(i)
            rows.append(row)
        if not keep:
            continue
        # parse_row of every kept row at once: one buffer, two copies (q, labels), both C-contiguous int64
        flat = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), size)
        q = flat[:, :qbytes].copy().view(f"<i{qsize}").astype(np.int64)
        lab = flat[:, qbytes:].copy().view("<i8")
        labels = lab[:, 0].astype(np.int64) if e.label_kind == 0 else lab.astype(np.int64)
        if q.size and (q.max() > QMAX or q.min() < -QMAX):
            bad = e.sample_ids[keep[int(np.argmax((np.abs(q) > QMAX).any(axis=1)))]]
            raise SealError(f"row of sample {bad!r} (head {delta.head_id!r}) holds |q| > 2^30, "
                            "not a value the quantizer produces")
        entries.append(RowsEntry(e.sign, tuple(e.event_ids[i] for i in keep), tuple(e.sample_ids[i] for i in keep),
                                 tuple(e.subject_ids[i] for i in keep), labels, q,
                                 tuple(e.event_us[i] for i in keep), e.by_subject,
                                 tuple(e.client_ids[i] for i in keep)))
    out.delta = replace(delta, entries=tuple(entries))  # the contract block (n_classes, version) stays
    return out
