"""Binary ``deltas`` messages: exact integer rows, a packed ledger or sealed rows, featurizer to
ledger, in the frame of ``schemas/binary_frame.py``. Byte layout, entry kinds (ROWS, PACKED, SEALED;
ROWS32 and SEALED32, q as i32), the per-row client and event time, the contract block: docs/formats.md.

Binary because a batch of int64 rows as JSON number lists would be several times larger and far
slower to parse; columns are 8-aligned, so decoding is a zero-copy numpy view. Key the message by
``head_id``: one head's deltas are then totally ordered, which is what lets the ledger skip
redelivered offsets (docs/design.md section 4).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from unlearn.schemas.binary_frame import CodecError, Reader, Writer, check_frame
from unlearn.schemas.envelope import ID_CHARS, is_valid_id

__all__ = [
    "DELTA_MAGIC",
    "DELTA_VERSION",
    "MULTISET_HASH_BYTES",
    "Delta",
    "PackedEntry",
    "RowsEntry",
    "SealedRowsEntry",
    "decode_delta",
    "encode_delta",
]

DELTA_MAGIC = b"ULDT"
DELTA_VERSION = 1  # the one version this codec writes and reads
_KIND_ROWS = 1
_KIND_PACKED = 2
_KIND_SEALED = 3  # sealed rows of q as i64 (written before issue 29; still read)
_KIND_SEALED32 = 4  # sealed rows of q as i32 (|q| <= 2^30 always): what the featurizer writes
_KIND_ROWS32 = 5  # plaintext rows of q as i32: what a featurizer without row sealing writes
_KEY_ID_BYTES = 16  # schemas.sealed.KEY_ID_BYTES
_COMMITMENT_BYTES = 32  # schemas.sealed.COMMITMENT_BYTES
_SEAL_OVERHEAD = 28  # schemas.sealed.OVERHEAD: nonce (12) + tag (16)
_QMAX = 1 << 30  # ledger.quantization.QMAX: |q| of every row, so q fits i32
_LABEL_CLASS = 0
_LABEL_VECTOR = 1
_MAX_FRAC_BITS = 62  # q = rint(f * 2^k) must fit int64 for |f| <= 1
_MAX_EVENT_US = 2**63 - 1
_ENTRY_MULTISET = 0x0001  # entry flag: a PACKED entry's rows' multiset hash follows its blob
_ENTRY_SUBJECT = 0x0002  # entry flag: a delete entry whose rows delete_subject requests removed
#: Size of a multiset hash state (``ledger.multiset_hash.STATE_BYTES``; this module does not import the ledger).
MULTISET_HASH_BYTES = 4096

_HEADER = struct.Struct("<IBBHI")  # d, frac_bits, label_frac_bits, reserved, n_entries
_ENTRY = struct.Struct("<BbHI")  # kind, sign, flags, n
_ROWS = struct.Struct("<BBHI")  # label_kind, reserved, reserved, c
_BLOB = struct.Struct("<Q")
_FLAG_CONTRACT = 0x0001  # frame flag: a _CONTRACT block follows the fixed header
_CONTRACT = struct.Struct("<IIQ")  # n_classes, reserved, contract_version
_ID_COLUMNS = ("event_ids", "sample_ids", "subject_ids")


def _ids(v: Sequence[str]) -> tuple[str, ...]:
    return v if isinstance(v, tuple) else tuple(v)


def _normalize(entry: Entry) -> None:
    """Ids as tuples; ``event_us`` as a tuple of ints, 0 per row when left out; ``client_ids``
    "" per row when left out."""
    for name in _ID_COLUMNS:
        object.__setattr__(entry, name, _ids(getattr(entry, name)))
    times = entry.event_us
    if isinstance(times, np.ndarray):
        times = tuple(times.tolist())
    n = len(entry.event_ids)
    object.__setattr__(entry, "event_us", tuple(times) if len(times) else (0,) * n)
    clients = _ids(entry.client_ids)
    object.__setattr__(entry, "client_ids", clients if clients else ("",) * n)


@dataclass(frozen=True, eq=False, slots=True)
class RowsEntry:
    """n signed rows. ``labels``: (n,) class indices, or (n, c) quantized targets; ``q``: (n, d);
    ``event_us``: each row's event time in microseconds (left out: 0, dated before any delete);
    ``by_subject``: a delete entry whose rows delete_subject requests removed; ``client_ids``:
    an add row's client, a delete row's tombstone scope ("": every client; left out: "" per row,
    an add of no named client, which the verifier judges against every tombstone). ``q_itemsize``:
    q on the wire, 8 (ROWS, i64) or 4 (ROWS32, i32); int64 in memory either way, ignored by ==.

    Decoded arrays are read-only (views into the message bytes, or for ROWS32 a widened copy).
    """

    sign: int
    event_ids: tuple[str, ...]
    sample_ids: tuple[str, ...]
    subject_ids: tuple[str, ...]
    labels: np.ndarray
    q: np.ndarray
    event_us: tuple[int, ...] = ()
    by_subject: bool = False
    client_ids: tuple[str, ...] = ()
    q_itemsize: int = 8

    def __post_init__(self) -> None:
        _normalize(self)

    @property
    def n(self) -> int:
        return len(self.event_ids)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RowsEntry):
            return NotImplemented
        return (
            self.sign == other.sign
            and self.event_ids == other.event_ids
            and self.sample_ids == other.sample_ids
            and self.subject_ids == other.subject_ids
            and self.event_us == other.event_us
            and self.by_subject == other.by_subject
            and self.client_ids == other.client_ids
            and self.labels.shape == other.labels.shape
            and np.array_equal(self.labels, other.labels)
            and self.q.shape == other.q.shape
            and np.array_equal(self.q, other.q)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class PackedEntry:
    """A signed batch whose exact ledger was serialized by the ledger module (opaque here).
    ``multiset_hash``: the 4096-byte multiset hash state of the batch's rows, or None when the
    producer did not compute it (the head's hash of its retained rows then becomes unknown);
    ``event_us``, ``by_subject``, ``client_ids``: as in :class:`RowsEntry`."""

    sign: int
    event_ids: tuple[str, ...]
    sample_ids: tuple[str, ...]
    subject_ids: tuple[str, ...]
    ledger_blob: bytes
    multiset_hash: bytes | None = None
    event_us: tuple[int, ...] = ()
    by_subject: bool = False
    client_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _normalize(self)
        if not isinstance(self.ledger_blob, bytes):
            object.__setattr__(self, "ledger_blob", bytes(self.ledger_blob))
        if self.multiset_hash is not None and not isinstance(self.multiset_hash, bytes):
            object.__setattr__(self, "multiset_hash", bytes(self.multiset_hash))

    @property
    def n(self) -> int:
        return len(self.event_ids)


@dataclass(frozen=True, slots=True)
class SealedRowsEntry:
    """n signed rows sealed per sample (``schemas.sealed``): ``label_kind`` 0 (class index) or 1
    (vector of width ``c``); per row a key id (32 hex characters), a 32-byte commitment, the
    sealed row (``nonce || ciphertext || tag`` of the row's wire bytes) and its event time
    (``event_us``, ``by_subject``, ``client_ids``: as in :class:`RowsEntry`). ``q_itemsize``: bytes
    per q value in the rows, 4 (SEALED32, written) or 8 (SEALED, read): the entry kind on the wire."""

    sign: int
    event_ids: tuple[str, ...]
    sample_ids: tuple[str, ...]
    subject_ids: tuple[str, ...]
    label_kind: int
    c: int
    key_ids: tuple[str, ...]
    commitments: tuple[bytes, ...]
    ciphertexts: tuple[bytes, ...]
    event_us: tuple[int, ...] = ()
    by_subject: bool = False
    client_ids: tuple[str, ...] = ()
    q_itemsize: int = 4

    def __post_init__(self) -> None:
        _normalize(self)
        for name in ("key_ids", "commitments", "ciphertexts"):
            object.__setattr__(self, name, _ids(getattr(self, name)))

    @property
    def n(self) -> int:
        return len(self.event_ids)

    @property
    def label_width(self) -> int:
        return 1 if self.label_kind == _LABEL_CLASS else self.c


Entry = RowsEntry | PackedEntry | SealedRowsEntry


@dataclass(frozen=True, slots=True)
class Delta:
    """One ``deltas`` message: entries for one head, quantized with (frac_bits, label_frac_bits)."""

    head_id: str
    source_id: str
    d: int
    frac_bits: int
    label_frac_bits: int
    entries: tuple[Entry, ...]
    #: The head contract's label columns and version the delta was judged under (both or neither;
    #: None: the head has no contract, its class columns follow the largest class index seen).
    n_classes: int | None = None
    contract_version: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.entries, tuple):
            object.__setattr__(self, "entries", tuple(self.entries))

    @property
    def event_ids(self) -> tuple[str, ...]:
        """Every event id covered, in entry order."""
        return tuple(e for entry in self.entries for e in entry.event_ids)


# --------------------------------------------------------------------------- encode
def encode_delta(delta: Delta) -> bytes:
    """Serialize; raises CodecError if the delta is inconsistent (shapes, signs, ids, times)."""
    _check_params(delta.d, delta.frac_bits, delta.label_frac_bits, CodecError)
    has_contract = _check_contract(delta.n_classes, delta.contract_version, CodecError)
    w = Writer()
    w.str16(delta.head_id, "head_id")
    w.str16(delta.source_id, "source_id")
    w.pack(_HEADER, delta.d, delta.frac_bits, delta.label_frac_bits, 0, len(delta.entries))
    if has_contract:
        w.pack(_CONTRACT, delta.n_classes, 0, delta.contract_version)
    for i, e in enumerate(delta.entries):
        _put_entry(w, e, delta.d, f"entry {i}")
    return w.finish(DELTA_MAGIC, DELTA_VERSION, _FLAG_CONTRACT if has_contract else 0)


def _put_entry(w: Writer, e: Entry, d: int, where: str) -> None:
    """One entry: its header, the id and event-time columns, then its kind's body."""
    if not isinstance(e, (RowsEntry, PackedEntry, SealedRowsEntry)):
        raise CodecError(f"{where}: expected RowsEntry, PackedEntry or SealedRowsEntry, got {type(e).__name__}")
    if e.sign not in (1, -1):
        raise CodecError(f"{where}: sign must be +1 or -1, got {e.sign!r}")
    if e.by_subject and e.sign != -1:
        raise CodecError(f"{where}: only a delete entry (sign -1) can be by_subject")
    flags = _ENTRY_SUBJECT if e.by_subject else 0
    n = len(e.event_ids)
    lengths = (n, len(e.sample_ids), len(e.subject_ids), len(e.client_ids), len(e.event_us))
    if n < 1 or len(set(lengths)) != 1:
        raise CodecError(f"{where}: event_ids/sample_ids/subject_ids/client_ids/event_us must have the same "
                         f"length >= 1, got {'/'.join(map(str, lengths))}")
    if isinstance(e, RowsEntry):
        labels, label_kind, c = _rows_labels(e, d, where)
        q = _int64(e.q, f"{where}: q")
        if e.q_itemsize == 4:
            if q.size and (q.max() > _QMAX or q.min() < -_QMAX):
                raise CodecError(f"{where}: |q| exceeds 2^30, not a value the quantizer produces (ROWS32)")
            q = q.astype("<i4")
        w.pack(_ENTRY, _kind(_KIND_ROWS, e.q_itemsize, where), e.sign, flags, n)
        _put_columns(w, e, where)
        w.pack(_ROWS, label_kind, 0, 0, c)
        w.array(labels)
        w.array(q)
    elif isinstance(e, PackedEntry):
        mset = e.multiset_hash
        if mset is not None and len(mset) != MULTISET_HASH_BYTES:
            raise CodecError(f"{where}: multiset_hash must be {MULTISET_HASH_BYTES} bytes, got {len(mset)}")
        w.pack(_ENTRY, _KIND_PACKED, e.sign, flags | (0 if mset is None else _ENTRY_MULTISET), n)
        _put_columns(w, e, where)
        w.pack(_BLOB, len(e.ledger_blob))
        w.put(e.ledger_blob)
        if mset is not None:
            w.put(mset)
    else:
        _put_sealed(w, e, d, flags, where)


def _rows_labels(e: RowsEntry, d: int, where: str) -> tuple[np.ndarray, int, int]:
    """(labels as int64, label kind, c) of a rows entry whose q has shape (n, d)."""
    n = e.n
    q = _int64(e.q, f"{where}: q")
    if q.shape != (n, d):
        raise CodecError(f"{where}: q must have shape ({n}, {d}), got {q.shape}")
    labels = _int64(e.labels, f"{where}: labels")
    if labels.ndim == 1 and labels.shape == (n,):
        if n and labels.min() < 0:
            raise CodecError(f"{where}: class indices must be >= 0")
        return labels, _LABEL_CLASS, 0
    if labels.ndim == 2 and labels.shape[0] == n and labels.shape[1] >= 1:
        return labels, _LABEL_VECTOR, labels.shape[1]
    raise CodecError(f"{where}: labels must have shape ({n},) or ({n}, c>=1), got {labels.shape}")


def _check_contract(n_classes: int | None, version: int | None, err: Callable[[str], Exception]) -> bool:
    """Whether the delta names its contract; raises ``err`` when only one of the two is given or
    either is out of range."""
    if n_classes is None and version is None:
        return False
    if not isinstance(n_classes, int) or not 1 <= n_classes <= 0xFFFFFFFF:
        raise err(f"n_classes must be an int in 1..2^32-1 (with contract_version), got {n_classes!r}")
    if not isinstance(version, int) or not 1 <= version <= 2**63 - 1:
        raise err(f"contract_version must be an int in 1..2^63-1 (with n_classes), got {version!r}")
    return True


def _check_sealed_labels(label_kind: int, c: int, err: Callable[[str], Exception], where: str) -> None:
    if (label_kind == _LABEL_CLASS and c != 0) or (label_kind == _LABEL_VECTOR and c < 1) \
            or label_kind not in (_LABEL_CLASS, _LABEL_VECTOR):
        raise err(f"{where}: sealed label kind {label_kind} with c={c}")


def _put_sealed(w: Writer, e: SealedRowsEntry, d: int, flags: int, where: str) -> None:
    n = e.n
    _check_sealed_labels(e.label_kind, e.c, CodecError, where)
    if not (len(e.key_ids) == len(e.commitments) == len(e.ciphertexts) == n):
        raise CodecError(f"{where}: a sealed entry needs one key id, commitment and ciphertext per row")
    kind, size = _kind(_KIND_SEALED, e.q_itemsize, where), _SEAL_OVERHEAD + e.q_itemsize * d + 8 * e.label_width
    try:
        kids = b"".join(bytes.fromhex(k) for k in e.key_ids)
    except (ValueError, TypeError):
        raise CodecError(f"{where}: key ids must be hex") from None
    if len(kids) != n * _KEY_ID_BYTES or any(len(k) != 2 * _KEY_ID_BYTES for k in e.key_ids):
        raise CodecError(f"{where}: key ids must be {2 * _KEY_ID_BYTES} hex characters")
    if any(len(c) != _COMMITMENT_BYTES for c in e.commitments):
        raise CodecError(f"{where}: commitments must be {_COMMITMENT_BYTES} bytes")
    if any(len(c) != size for c in e.ciphertexts):
        raise CodecError(f"{where}: each sealed row must be {size} bytes (d={d}, label width {e.label_width}, "
                         f"q as i{8 * e.q_itemsize})")
    w.pack(_ENTRY, kind, e.sign, flags, n)
    _put_columns(w, e, where)
    w.pack(_ROWS, e.label_kind, 0, 0, e.c)
    w.put(kids)
    w.put(b"".join(e.commitments))
    w.put(b"".join(e.ciphertexts))


def _kind(i64_kind: int, q_itemsize: int, where: str) -> int:
    """The kind of a ROWS or SEALED entry (``i64_kind``) that carries q with ``q_itemsize`` bytes."""
    if q_itemsize not in (4, 8):
        raise CodecError(f"{where}: q_itemsize must be 4 (i32) or 8 (i64), got {q_itemsize!r}")
    return i64_kind if q_itemsize == 8 else {_KIND_ROWS: _KIND_ROWS32, _KIND_SEALED: _KIND_SEALED32}[i64_kind]


def _put_columns(w: Writer, e: Entry, where: str) -> None:
    """The three id columns, the client column (ids or ""), then the event times (8-aligned i64
    per row, 0..2^63-1)."""
    w.str_column(e.event_ids, f"{where}: event_ids")
    w.str_column(e.sample_ids, f"{where}: sample_ids")
    w.str_column(e.subject_ids, f"{where}: subject_ids")
    bad = _bad_client(e.client_ids)
    if bad is not None:
        raise CodecError(f"{where}: {bad}")
    w.str_column(e.client_ids, f"{where}: client_ids", allow_empty=True)
    if any(not isinstance(t, (int, np.integer)) or not 0 <= t <= _MAX_EVENT_US for t in e.event_us):
        raise CodecError(f"{where}: event_us must be ints in 0..2^63-1 (microseconds since the epoch)")
    w.array(np.asarray(e.event_us, dtype="<i8"))


def _bad_client(clients: Sequence[str]) -> str | None:
    """What is wrong with a client column (each an id, or "" for no client), or None."""
    bad = next((c for c in clients if c != "" and not is_valid_id(c)), None)
    return None if bad is None else f"client_ids holds {str(bad)[:80]!r}, neither an id nor \"\""


def _int64(a: object, what: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.kind not in "iu":
        raise CodecError(f"{what} must be an integer array (exact ledger), got dtype {arr.dtype}")
    if arr.dtype != np.dtype("<i8"):
        if arr.size and arr.dtype.kind == "u" and arr.max() > np.iinfo(np.int64).max:
            raise CodecError(f"{what} has values beyond int64")
        arr = arr.astype("<i8")
    return arr


def _check_params(d: int, k: int, k_y: int, err: Callable[[str], Exception]) -> None:
    if not 1 <= d <= 0xFFFFFFFF:
        raise err(f"d must be in 1..2^32-1, got {d}")
    if not 0 <= k <= _MAX_FRAC_BITS or not 0 <= k_y <= _MAX_FRAC_BITS:
        raise err(f"frac_bits and label_frac_bits must be in 0..{_MAX_FRAC_BITS}, got {k}, {k_y}")


# --------------------------------------------------------------------------- decode
def decode_delta(buf: bytes | bytearray | memoryview) -> Delta:
    """Parse and validate one ``deltas`` message; CodecError on anything wrong."""
    body, version, flags = check_frame(buf, DELTA_MAGIC, "delta")
    if version != DELTA_VERSION:
        raise CodecError(f"delta: unknown version {version} (this decoder knows {DELTA_VERSION})")
    if flags & ~_FLAG_CONTRACT:
        raise CodecError(f"delta: unknown flags {flags:#06x}")
    r = Reader(body, "delta")
    head_id = r.str16("head_id")
    if not is_valid_id(head_id):
        raise r.fail(f"head_id {head_id[:80]!r} is not an id (1..128 characters of [{ID_CHARS}])")
    source_id = r.str16("source_id")
    d, k, k_y, reserved, n_entries = r.unpack(_HEADER, "header")
    if reserved:
        raise r.fail("reserved header field is not 0")
    _check_params(d, k, k_y, r.fail)
    n_classes = contract_version = None
    if flags & _FLAG_CONTRACT:
        n_classes, res, contract_version = r.unpack(_CONTRACT, "contract")
        if res:
            raise r.fail("reserved contract field is not 0")
        _check_contract(n_classes, contract_version, r.fail)
    entries = tuple(_read_entry(r, d, f"entry {i}") for i in range(n_entries))
    r.done()
    return Delta(head_id, source_id, d, k, k_y, entries, n_classes, contract_version)


_Columns = tuple[int, tuple[str, ...], tuple[str, ...], tuple[str, ...]]  # sign, event, sample, subject ids
_Tail = tuple[tuple[int, ...], bool, tuple[str, ...]]  # event_us, by_subject, client_ids


def _read_entry(r: Reader, d: int, where: str) -> Entry:
    """One entry: header, id and event-time columns, then its kind's body."""
    kind, sign, entry_flags, n = r.unpack(_ENTRY, f"{where} header")
    if sign not in (1, -1):
        raise r.fail(f"{where}: sign must be +1 or -1, got {sign}")
    known = (_ENTRY_MULTISET if kind == _KIND_PACKED else 0) | (_ENTRY_SUBJECT if sign == -1 else 0)
    if entry_flags & ~known:
        raise r.fail(f"{where}: unknown entry flags {entry_flags:#06x}")
    by_subject = bool(entry_flags & _ENTRY_SUBJECT)
    if n < 1:
        raise r.fail(f"{where}: no events")
    ids = [r.str_column(n, f"{where}: {name}") for name in _ID_COLUMNS]
    for name, column in zip(_ID_COLUMNS, ids):
        bad = next((i for i in column if not is_valid_id(i)), None)
        if bad is not None:
            raise r.fail(f"{where}: {name} holds {bad[:80]!r}, not an id (1..128 characters of [{ID_CHARS}])")
    clients = r.str_column(n, f"{where}: client_ids", allow_empty=True)
    bad = _bad_client(clients)
    if bad is not None:
        raise r.fail(f"{where}: {bad}")
    times = r.array("<i8", n, f"{where}: event_us")
    if times.min() < 0:
        raise r.fail(f"{where}: negative event time")
    cols: _Columns = (sign, ids[0], ids[1], ids[2])
    tail: _Tail = (tuple(times.tolist()), by_subject, clients)
    q_itemsize = 8 if kind in (_KIND_ROWS, _KIND_SEALED) else 4
    if kind in (_KIND_ROWS, _KIND_ROWS32):
        labels, q = _read_rows(r, n, d, q_itemsize, where)
        return RowsEntry(*cols, labels, q, *tail, q_itemsize)
    if kind == _KIND_PACKED:
        (size,) = r.unpack(_BLOB, f"{where} blob length")
        blob = bytes(r.raw(size, f"{where}: ledger_blob"))
        mset = bytes(r.raw(MULTISET_HASH_BYTES, f"{where}: multiset_hash")) if entry_flags & _ENTRY_MULTISET else None
        return PackedEntry(*cols, blob, mset, *tail)
    if kind in (_KIND_SEALED, _KIND_SEALED32):
        return _read_sealed(r, cols, d, tail, q_itemsize, where)
    raise r.fail(f"{where}: unknown entry kind {kind}")


def _read_rows(r: Reader, n: int, d: int, q_itemsize: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(labels, q as int64) of a ROWS (``q_itemsize`` 8) or ROWS32 (4) entry of ``n`` rows."""
    label_kind, res1, res2, c = r.unpack(_ROWS, f"{where} rows header")
    if res1 or res2:
        raise r.fail(f"{where}: reserved rows field is not 0")
    if label_kind == _LABEL_CLASS:
        if c != 0:
            raise r.fail(f"{where}: class-index labels with c={c} (must be 0)")
        labels = r.array("<i8", n, f"{where}: labels")
        if labels.min() < 0:
            raise r.fail(f"{where}: negative class index")
    elif label_kind == _LABEL_VECTOR:
        if c < 1:
            raise r.fail(f"{where}: vector labels with c=0")
        labels = r.array("<i8", n * c, f"{where}: labels").reshape(n, c)
    else:
        raise r.fail(f"{where}: unknown label kind {label_kind}")
    if q_itemsize == 8:
        return labels, r.array("<i8", n * d, f"{where}: q").reshape(n, d)
    q32 = r.array("<i4", n * d, f"{where}: q")
    if q32.max() > _QMAX or q32.min() < -_QMAX:
        raise r.fail(f"{where}: |q| exceeds 2^30 in a ROWS32 entry")
    q = q32.astype(np.int64).reshape(n, d)
    q.setflags(write=False)
    return labels, q


def _read_sealed(r: Reader, cols: _Columns, d: int, tail: _Tail, q_itemsize: int, where: str) -> SealedRowsEntry:
    """A SEALED or SEALED32 entry's body: key ids, commitments and sealed rows, one each per row
    (``tail``: the entry's event times, by_subject and client ids, read before)."""
    n = len(cols[1])
    label_kind, res1, res2, c = r.unpack(_ROWS, f"{where} sealed header")
    if res1 or res2:
        raise r.fail(f"{where}: reserved sealed field is not 0")
    _check_sealed_labels(label_kind, c, r.fail, where)
    size = _SEAL_OVERHEAD + q_itemsize * d + 8 * (1 if label_kind == _LABEL_CLASS else c)
    kids = bytes(r.raw(n * _KEY_ID_BYTES, f"{where}: key ids"))
    coms = bytes(r.raw(n * _COMMITMENT_BYTES, f"{where}: commitments"))
    cts = bytes(r.raw(n * size, f"{where}: sealed rows"))
    return SealedRowsEntry(
        *cols, label_kind, c,
        tuple(kids[i * _KEY_ID_BYTES:(i + 1) * _KEY_ID_BYTES].hex() for i in range(n)),
        tuple(coms[i * _COMMITMENT_BYTES:(i + 1) * _COMMITMENT_BYTES] for i in range(n)),
        tuple(cts[i * size:(i + 1) * size] for i in range(n)), *tail, q_itemsize)
