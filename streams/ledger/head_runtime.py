"""One head inside the ledger processor: exact ledger + fast tracker + bookkeeping, no I/O.

The ledger worker hands each ``deltas`` message with its offset to ``HeadRuntime.apply``
(``DeltaFold``, worker.py), which applies it to the exact ledger and the retained rows' multiset hash (one version
per message); once per poll, before publishing the head, ``HeadRuntime.sync`` (``Outputs``, worker.py) brings
the fast head up to the ledger in one tracker update or a reset (``TrackedHead.sync``:
coalescing, docs/ledger-processor.md). Keeping the logic here makes every rule (skip redelivered
offsets, reject bad entries without touching state, receipts, reset policy) testable without a
broker.

**Snapshots**: a head's state as self-verifying snapshot pieces, each under a size limit.

Why this shape: the exact ledger of a d=768 head is ~7 MB, over a comfortable message size, and
writing it per delta would swamp the broker. So a head's state is snapshotted at checkpoints
(streams/ledger/worker.py) as *pieces*, each under ``max_piece_bytes``, written to the
``ledger-state`` changelog; the partition's checkpoint record names them (``state_store``). Every
piece carries the snapshot generation, the applied input offset, its index, the piece count and
the SHA-256 of the whole state, so a mixed or partial set can never be mistaken for a snapshot
(docs/ledger-processor.md has the byte layout).

The state blob is versioned (version 2); it holds the head's meta, the multiset hash of its
retained rows (docs/design.md section 6; empty when unknown, as after a packed entry without
one) and its exact ledger.

**RowOpener**: opening sealed ``deltas`` rows before the ledger applies them (docs/erasure.md).

A thin transform in front of ``HeadRuntime.apply``: a SEALED entry becomes the ROWS entry it
sealed (``schemas.sealed.open_delta``) with the keys of the ``subject-keys`` family
(``infra.between_stages.KeyRing``). A key not known yet makes the ring read its head's partition of
the family to its current end once (the featurizer that owns by-head partition P writes the keys
of P's heads into key partition P, having acknowledged each before producing a row under it),
and, if the key is not there either, the whole family; a key still unknown then is destroyed:
its rows are *erased* and left out. An erased add and its erased delete
carry the same (sample, key id, commitment) and contribute ``+x - x = 0``, so a ledger rebuilt
from scratch after an erasure ends at the digest of the retained set. A live ledger never meets a
destroyed key: the featurizer destroys a key only once this ledger's durable checkpoint floor is
past the delete (``streams/featurizer/erasure.py``).
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
import orjson
from numpy.typing import NDArray

from unlearn.infra.between_stages import KeyRing, Locate, head_partition, routed_topic_name
from unlearn.infra.settings import Settings
from unlearn.ledger import ExactLedger, LedgerError, MultisetHash, NonMemberDelete, TrackedHead
from unlearn.ledger.multiset_hash import STATE_BYTES
from unlearn.ledger.tracked_head import HeadMode
from unlearn.schemas.delta_codec import Delta, Entry, PackedEntry, RowsEntry, SealedRowsEntry
from unlearn.schemas.envelope import dedup_key
from unlearn.schemas.sealed import Opened, SampleKey, is_sealed, open_delta

__all__ = [
    "RowOpener",
]

log = logging.getLogger("unlearn.ledger")

class RowOpener:
    """Opens sealed deltas for one process (ledger worker or verifier).

    A key is looked for again only if the key family was not read to its end since the message
    was read: every key of a ciphertext was acknowledged before the ciphertext existed, so a
    refresh that started after the message was read sees the key unless it is destroyed.
    ``batch=True`` (the verifier, audits): every message was read before this opener was made,
    so one refresh of the whole family covers them all; otherwise (a live ledger) the message
    counts as read when :meth:`open` is called, and a key not known yet is looked for first in
    its head's key partition only: P = ``head_partition(head, partitions of the by-head topic)``
    from the same metadata listing, the partition whose featurizer sealed the head's rows. The
    whole family is read only when that cannot be told (no by-head topic, P not listed) or the
    key is not in P either (a destroyed key, or one written before the by-head partition count
    changed): a key is declared destroyed only after every partition was read to its end after
    the message was read (KeysUnavailable otherwise)."""

    def __init__(self, settings: Settings, ring: KeyRing | None = None, batch: bool = False,
                 role: str = "ledger") -> None:
        self.settings = settings
        self.role = role
        self.ring = ring
        self.batch = batch
        self.erased = 0
        self.by_head = routed_topic_name(settings.topic("requests"))
        self._read_at = time.monotonic()  # when the message being opened was read (at the latest)
        self._refreshed_at = float("-inf")  # when the last complete refresh started
        self._head_read_at: dict[str, float] = {}  # head -> when the last read of its partition started

    def lookup(self, head_id: str, sample_id: str, key_id: str) -> SampleKey | None:
        """The key, reading the family as the class describes; None: destroyed."""
        if self.ring is None:
            self.ring = KeyRing(self.settings, role=self.role)
        ref = (head_id, sample_id, key_id)
        key = self.ring.get(ref)
        if key is not None or self._refreshed_at >= self._read_at:
            return key
        if not self.batch and self._head_read_at.get(head_id, float("-inf")) < self._read_at:
            started = time.monotonic()
            if self.ring.refresh_partition(self.locate(head_id)) is not None:  # KeysUnavailable unless read
                self._head_read_at[head_id] = started
                key = self.ring.get(ref)
                if key is not None:
                    return key
        started = time.monotonic()
        self.ring.refresh()  # KeysUnavailable unless read to its end
        self._refreshed_at = started
        return self.ring.get(ref)

    def locate(self, head_id: str) -> Locate:
        """Where ``head_id``'s keys are, from a metadata listing (None: no usable by-head topic)."""
        def pick(topics: Mapping[str, Any]) -> int | None:
            md = topics.get(self.by_head)
            if md is None or md.error is not None or not md.partitions:
                return None
            return head_partition(head_id, len(md.partitions))
        return pick

    def open(self, delta: Delta) -> Opened:
        """``delta`` with its sealed rows opened (SealError: a row does not open or match its
        commitment); rows under destroyed keys are reported in ``erased``."""
        if not is_sealed(delta):
            return Opened(delta)
        if not self.batch:
            self._read_at = time.monotonic()
        opened = open_delta(delta, self.lookup)
        if opened.erased:
            self.erased += len(opened.erased)
            log.info("head %r: %d erased row(s) (key destroyed) left out", delta.head_id, len(opened.erased))
        return opened


_PIECE = struct.Struct("<4sHQqII32s")  # magic, version, generation, offset, index, count, sha256(state)
_PIECE_MAGIC = b"ULSP"
_STATE_MAGIC = b"ULST"
_VERSION = 1  # of the pieces
_STATE_VERSION = 2  # of the state blob: meta + multiset hash + ledger
_STATE_HEADER = struct.Struct("<HI")  # version, meta length
_U32 = struct.Struct("<I")


class SnapshotError(ValueError):
    """A snapshot that cannot be trusted (missing piece, checksum mismatch, unknown version)."""


@dataclass(frozen=True)
class HeadMeta:
    """Everything besides the ledger that a head carries across restarts."""

    head_id: str
    gamma: float
    version: int  # number of delta messages applied (deterministic from the deltas log)
    events_covered: int  # request events applied (adds + deletes, rows)
    applied_offset: int  # last input offset applied (the head's deltas are in one partition)
    input_partition: int
    last_reset_drift: float
    source_offsets: dict[str, int]  # requests partition -> last request offset covered
    contract_version: int | None = None  # named by the latest delta that names one (None: none did)

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def from_json(cls, raw: bytes) -> HeadMeta:
        return cls(**orjson.loads(raw))


@dataclass(frozen=True)
class HeadState:
    """What a snapshot holds: the meta, the exact ledger, and the multiset hash of the retained
    rows (None: unknown)."""

    meta: HeadMeta
    ledger: ExactLedger
    multiset: MultisetHash | None


def encode_state(state: HeadState) -> bytes:
    """One blob (version 2): magic, version, meta length + JSON meta, multiset hash length (0 =
    unknown, or 4096) + state, ledger blob (itself checksummed)."""
    m = state.meta.to_json()
    mset = b"" if state.multiset is None else state.multiset.to_bytes()
    return (_STATE_MAGIC + _STATE_HEADER.pack(_STATE_VERSION, len(m)) + m + _U32.pack(len(mset)) + mset
            + state.ledger.to_bytes())


def decode_state(blob: bytes) -> HeadState:
    """The head state ``blob`` holds (version 2); SnapshotError if it is not one."""
    if blob[:4] != _STATE_MAGIC:
        raise SnapshotError("not a head state blob")
    version, mlen = _STATE_HEADER.unpack_from(blob, 4)
    if version != _STATE_VERSION:
        raise SnapshotError(f"unknown head state version {version}")
    pos = 4 + _STATE_HEADER.size
    meta = HeadMeta.from_json(blob[pos:pos + mlen])
    pos += mlen
    (size,) = _U32.unpack_from(blob, pos)
    if size not in (0, STATE_BYTES):
        raise SnapshotError(f"multiset hash of {size} bytes (0 or {STATE_BYTES})")
    raw_mset = blob[pos + _U32.size:pos + _U32.size + size]
    pos += _U32.size + size
    ledger = ExactLedger.from_bytes(blob[pos:])
    mset = (MultisetHash.from_bytes(raw_mset, ledger.dim, ledger.frac_bits, ledger.label_frac_bits)
            if raw_mset else None)
    return HeadState(meta, ledger, mset)


def split_pieces(state: bytes, generation: int, offset: int, max_piece_bytes: int) -> list[bytes]:
    """Cut a state blob into self-describing pieces of at most ``max_piece_bytes`` each."""
    payload = max_piece_bytes - _PIECE.size
    if payload < 1024:
        raise ValueError("max_piece_bytes too small")
    sha = hashlib.sha256(state).digest()
    count = max(1, -(-len(state) // payload))
    header = [_PIECE.pack(_PIECE_MAGIC, _VERSION, generation, offset, i, count, sha) for i in range(count)]
    return [header[i] + state[i * payload:(i + 1) * payload] for i in range(count)]


def join_pieces(generation: int, offset: int, sha256_hex: str, pieces: list[bytes | None]) -> bytes:
    """Reassemble and verify the state of snapshot ``generation`` at ``offset`` whose SHA-256 is
    ``sha256_hex``; raises SnapshotError if a piece is missing, foreign or the checksum is off."""
    parts = []
    for i, p in enumerate(pieces):
        if p is None or len(p) < _PIECE.size:
            raise SnapshotError(f"piece {i} missing")
        magic, version, gen, off, idx, count, sha = _PIECE.unpack_from(p, 0)
        if magic != _PIECE_MAGIC or version != _VERSION:
            raise SnapshotError(f"piece {i}: bad magic/version")
        if (gen, off, idx, count) != (generation, offset, i, len(pieces)) or sha.hex() != sha256_hex:
            raise SnapshotError(f"piece {i} belongs to another snapshot (generation {gen})")
        parts.append(p[_PIECE.size:])
    state = b"".join(parts)
    if hashlib.sha256(state).hexdigest() != sha256_hex:
        raise SnapshotError("snapshot checksum mismatch")
    return state


def state_sha(state: bytes) -> bytes:
    return hashlib.sha256(state).digest()


#: Why a deltas message is skipped whole ("" = it applies).
SkipReason = Literal["", "redelivered", "duplicate_source"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class Rejection:
    """An entry the ledger refused; it goes to deadletter and (for deletes) a rejected receipt."""

    entry_index: int
    sign: int
    reason: str  # machine-readable code
    detail: str
    event_ids: tuple[str, ...]
    sample_ids: tuple[str, ...]
    subject_ids: tuple[str, ...]


@dataclass(frozen=True)
class AppliedDelete:
    """A delete event whose rows left the ledger: the receipt's content."""

    event_id: str
    subject_id: str
    sample_ids: tuple[str, ...]


@dataclass
class ApplyOutcome:
    """What one deltas message did. ``version`` is the version it made and ``retained_hash`` that
    version's fingerprint (computed only when it applied deletes: their receipts carry it), so a
    receipt names the same pair whatever the poll boundaries of the run that issued it."""

    skipped: str = ""  # why nothing was done: "redelivered" | "duplicate_source" ("" = applied)
    rejections: list[Rejection] = field(default_factory=list)
    deletes: list[AppliedDelete] = field(default_factory=list)
    rows_applied: int = 0
    version: int = 0
    retained_hash: str | None = None


@dataclass(frozen=True)
class HeadConfig:
    gamma: float
    reset_every: int
    drift_threshold: float


class HeadRuntime:
    """Live state of one head. ``version`` counts applied delta messages, so the same deltas log
    always yields the same (version, digest, retained hash) triples, also after a crash and replay.

    ``multiset`` is the multiset hash of the retained rows (docs/design.md section 6), kept next
    to the ledger; None once it is unknown (a packed entry without one, or a version 1 snapshot).
    The ledger and the hash take each message in ``apply``; the fast head lags until ``sync``."""

    def __init__(self, head_id: str, ledger: ExactLedger, config: HeadConfig, *,
                 multiset: MultisetHash | None = None, version: int = 0,
                 events_covered: int = 0, applied_offset: int = -1, input_partition: int = -1,
                 last_reset_drift: float = 0.0, source_offsets: dict[str, int] | None = None,
                 contract_version: int | None = None) -> None:
        self.head_id = head_id
        self.config = config
        self.multiset = multiset
        self.tracked = TrackedHead(ledger, config.gamma, reset_every=config.reset_every,
                                   drift_threshold=config.drift_threshold)
        self.fast_drift = float(last_reset_drift)
        self.version = version
        self.events_covered = events_covered
        self.applied_offset = applied_offset
        self.input_partition = input_partition
        self.source_offsets: dict[str, int] = dict(source_offsets or {})
        self.contract_version = contract_version
        self.last_reset_at = time.monotonic()
        self.dirty_since_snapshot = 0
        self._digest: tuple[int, str] | None = None
        self._retained_hash: tuple[int, str | None] | None = None

    # ---------------------------------------------------------------- construction
    @classmethod
    def new(cls, head_id: str, delta: Delta, config: HeadConfig) -> HeadRuntime:
        """A head is created by its first add; its dimension and grids come from that delta, its
        label columns from the contract the delta names (``apply`` sizes them: ``declare_outputs``)."""
        return cls(head_id, ExactLedger(delta.d, 0, delta.frac_bits, delta.label_frac_bits), config,
                   multiset=MultisetHash(delta.d, delta.frac_bits, delta.label_frac_bits))

    @classmethod
    def from_snapshot(cls, state: HeadState, config: HeadConfig) -> HeadRuntime:
        meta = state.meta
        cfg = HeadConfig(meta.gamma, config.reset_every, config.drift_threshold)
        return cls(meta.head_id, state.ledger, cfg, multiset=state.multiset, version=meta.version,
                   events_covered=meta.events_covered, applied_offset=meta.applied_offset,
                   input_partition=meta.input_partition, last_reset_drift=meta.last_reset_drift,
                   source_offsets=meta.source_offsets, contract_version=meta.contract_version)

    def meta(self) -> HeadMeta:
        return HeadMeta(self.head_id, self.config.gamma, self.version, self.events_covered, self.applied_offset,
                        self.input_partition, self.last_reset_drift, dict(self.source_offsets),
                        self.contract_version)

    def state(self) -> HeadState:
        """What a snapshot keeps (the ledger and the hash are the live objects, not copies)."""
        return HeadState(self.meta(), self.ledger, self.multiset)

    # ---------------------------------------------------------------- views
    @property
    def ledger(self) -> ExactLedger:
        return self.tracked.ledger

    @property
    def mode(self) -> HeadMode:
        return self.tracked.mode

    @property
    def weights(self) -> np.ndarray:
        return self.tracked.weights

    @property
    def posterior(self) -> NDArray[np.float64]:
        """(F^T F + gamma I)^-1 as the fast head holds it (what an exact head update may carry)."""
        return self.tracked.posterior

    @property
    def last_reset_drift(self) -> float:
        """The fast path's error as last measured (snapshots keep it under this name): ``fast_drift``."""
        return self.fast_drift

    def retained_classes(self) -> np.ndarray | None:
        """bool (c,) over the served head's columns: True where the ledger's exact per-class count
        is > 0. None when some retained row has a target-vector label (the class counts then do
        not describe every row: every column is an output)."""
        counts = self.ledger.class_counts
        if int(counts.sum()) != self.ledger.count:
            return None
        c = int(self.weights.shape[1])
        mask = np.zeros(c, dtype=bool)
        k = min(c, counts.shape[0])
        mask[:k] = counts[:k] > 0
        return mask

    def digest(self) -> str:
        """Ledger digest, cached per version (it costs O(d^2): exact head updates only carry it)."""
        if self._digest is None or self._digest[0] != self.version:
            self._digest = (self.version, self.ledger.digest())
        return self._digest[1]

    def retained_hash(self) -> str | None:
        """Fingerprint of the retained rows' multiset hash (None: unknown), cached per version."""
        if self._retained_hash is None or self._retained_hash[0] != self.version:
            self._retained_hash = (self.version, None if self.multiset is None else self.multiset.fingerprint())
        return self._retained_hash[1]

    # ---------------------------------------------------------------- updates
    def apply(self, delta: Delta, offset: int, partition: int) -> ApplyOutcome:
        """Apply one deltas message at input ``offset`` to the exact ledger and the multiset hash:
        one version. Entries apply atomically one by one; a bad entry is rejected (state
        untouched) and the others proceed. The fast head takes the rows at the next ``sync``."""
        skipped = admit(self, delta, offset)
        if skipped:
            return ApplyOutcome(skipped=skipped)
        out = ApplyOutcome()
        self.contract_version = declare_outputs(self.ledger, delta, self.contract_version)
        for _, entry, rep in apply_entries(self.head_id, delta, self.ledger, self._apply_entry):
            if isinstance(rep, Rejection):
                out.rejections.append(rep)
                continue
            out.rows_applied += entry.n
            self.events_covered += len(set(entry.event_ids))
            if entry.sign < 0:
                out.deletes.extend(_group_deletes(entry))
        record_applied(self, delta, offset)
        self.input_partition = partition
        self.version += 1
        self.dirty_since_snapshot += 1
        out.version = self.version
        if out.deletes:
            out.retained_hash = self.retained_hash()
        return out

    def _apply_entry(self, entry: RowsEntry | PackedEntry) -> None:
        if isinstance(entry, RowsEntry):
            self.tracked.apply(entry.q, entry.labels, entry.sign)
        else:
            self.tracked.apply_packed(ExactLedger.from_bytes(entry.ledger_blob), entry.sign)
        self.multiset = fold_multiset(self.multiset, entry)  # only after the ledger took the entry

    def sync(self) -> str:
        """Bring the fast head up to the ledger, once per poll (``TrackedHead.sync``: one tracker
        update for every message applied since, or a reset). Returns why a reset ran ("" when
        none)."""
        rep = self.tracked.sync()
        if rep.reset_reason:
            self.last_reset_at = time.monotonic()
            if rep.measured:
                self.fast_drift = rep.drift
        return rep.reset_reason

    def timed_reset_due(self, every_seconds: float, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.mode == "fast" and now - self.last_reset_at >= every_seconds

    def reset(self, reason: str) -> None:
        """Canonical head now, from the ledger (which also covers any rows the fast head has not
        taken). The version is unchanged: same ledger. ``fast_drift`` takes the replaced head's
        deviation only when that was a fast head that had taken every row (a timer, a rotation):
        a head rebuilt instead of tracked (coalesced rows, packed statistics) measured nothing."""
        rep = self.tracked.reset(reason, measured=self.mode == "fast")
        if rep.measured:
            self.fast_drift = rep.drift
        self.last_reset_at = time.monotonic()


# --------------------------------------------------------------------------- admission rules
# Module functions, not methods, so the replay verifier (services/verifier/replay.py) applies the
# very same rules to a bare ExactLedger instead of re-coding them.
class InputPosition(Protocol):
    """Where a head is in its deltas input (HeadRuntime, or the verifier's replay)."""

    applied_offset: int
    source_offsets: dict[str, int]


def creates_head(delta: Delta) -> bool:
    """A head is created by its first delta with an add; a delete-only delta before that is
    rejected as ``unknown_head`` (there is nothing to delete from). Ask it of the message as sent
    (sealed entries included): an add whose rows are erased since still created the head, and its
    grid (d, frac_bits, label_frac_bits) is in the delta's header (docs/erasure.md)."""
    return any(e.sign > 0 for e in delta.entries)


def admit(pos: InputPosition, delta: Delta, offset: int) -> SkipReason:
    """"" when the deltas message at ``offset`` applies, else why it is skipped whole: an offset at or
    below the last applied one is ``redelivered``; a source offset not beyond what was applied from
    that source is a ``duplicate_source`` (a featurizer's outbox replay), which still moves
    ``pos.applied_offset`` past the message so it is not looked at again."""
    if offset <= pos.applied_offset:
        return "redelivered"
    src = dedup_key(delta.source_id)
    if src is not None and src[1] <= pos.source_offsets.get(src[0], -1):
        # the same requests were already applied from an earlier copy of this delta
        pos.applied_offset = offset
        return "duplicate_source"
    return ""


def record_applied(pos: InputPosition, delta: Delta, offset: int) -> None:
    """After ``delta`` at ``offset`` applied: later redeliveries and copies of its source are skipped."""
    pos.applied_offset = offset
    src = dedup_key(delta.source_id)
    if src is not None:
        pos.source_offsets[src[0]] = src[1]


def declare_outputs(ledger: ExactLedger, delta: Delta, contract_version: int | None) -> int | None:
    """Size ``ledger``'s label columns from the contract ``delta`` names, before its entries
    apply: a head's columns are its contract's class count (label width for vectors), so its shape
    never reveals which labels were seen, and they grow only when a later delta names a larger
    contract (``unlearn heads extend``: class-incremental learning; new columns are zero). Returns
    the head's contract version after ``delta``: the highest one its deltas named (a delta judged
    by a featurizer whose registry view lagged never moves it back, as it never shrinks the
    columns), ``contract_version`` when ``delta`` names none. A
    delta that names none (the old format) keeps the old rule: the largest class index seen plus
    one; so does a delta off ``ledger``'s grid (its entries are all rejected)."""
    if delta.n_classes is None or delta.contract_version is None:
        return contract_version
    if (delta.d, delta.frac_bits, delta.label_frac_bits) != (ledger.dim, ledger.frac_bits, ledger.label_frac_bits):
        return contract_version
    if delta.n_classes > ledger.n_outputs:
        ledger.grow_outputs(delta.n_classes)
    return max(delta.contract_version, contract_version or 0)


def apply_entries(head_id: str, delta: Delta, ledger: ExactLedger,
                  apply_entry: Callable[[RowsEntry | PackedEntry], _T]
                  ) -> Iterator[tuple[int, Entry, _T | Rejection]]:
    """The per-entry rules: yields (index, entry, what ``apply_entry`` returned, or a Rejection).
    An entry off ``ledger``'s grid is rejected unapplied; an entry ``apply_entry`` refuses
    (NonMemberDelete, LedgerError; it must leave state untouched then) is rejected and the next
    one proceeds. Lazy: each entry applies when its result is taken."""
    grid = (delta.d, delta.frac_bits, delta.label_frac_bits)
    mine = (ledger.dim, ledger.frac_bits, ledger.label_frac_bits)
    for i, entry in enumerate(delta.entries):
        if grid != mine:
            reason = "dimension_mismatch" if delta.d != ledger.dim else "grid_mismatch"
            yield i, entry, _reject(i, entry, reason,
                                    f"delta has (d, frac_bits, label_frac_bits) = {grid}, head {head_id!r} has {mine}")
            continue
        if isinstance(entry, SealedRowsEntry):  # the shell opens sealed rows first (schemas.sealed)
            yield i, entry, _reject(i, entry, "sealed_entry", "sealed rows reached the ledger unopened")
            continue
        if isinstance(entry, RowsEntry) and entry.sign > 0 and len(entry.q) and not entry.q.any(axis=1).all():
            # The featurizer refuses a vector of no information (zero_norm_feature): a zero add row
            # would count in n and the class counts while carrying nothing, so the ledger (and the
            # verifier's replay, which runs this) refuses one too. Deletes of old zero rows still apply.
            yield i, entry, _reject(i, entry, "zero_norm_feature", "an add row whose q is all zeros")
            continue
        try:
            result: _T | Rejection = apply_entry(entry)
        except NonMemberDelete as exc:
            result = _reject(i, entry, "non_member_delete", str(exc))
        except LedgerError as exc:
            result = _reject(i, entry, "invalid_entry", str(exc))
        yield i, entry, result


def fold_multiset(h: MultisetHash | None, entry: Entry) -> MultisetHash | None:
    """The retained rows' multiset hash after the ledger applied ``entry`` (``h`` is updated in
    place): a rows entry's rows join (add) or leave (delete); a packed entry joins with the hash
    of its rows it carries. One without makes the hash unknown (None) from then on, never wrong."""
    if h is None:
        return None
    if isinstance(entry, RowsEntry):
        (h.add if entry.sign > 0 else h.delete)(entry.q, entry.labels)
        return h
    if not isinstance(entry, PackedEntry) or entry.multiset_hash is None:
        return None
    h.absorb(MultisetHash.from_bytes(entry.multiset_hash, *h.grid), entry.sign)
    return h


def _reject(i: int, entry: Entry, reason: str, detail: str) -> Rejection:
    return Rejection(i, entry.sign, reason, detail, entry.event_ids, entry.sample_ids, entry.subject_ids)


def group_by_event(event_ids: Iterable[str], sample_ids: Iterable[str],
                   subject_ids: Iterable[str]) -> list[AppliedDelete]:
    """Rows of one delete event (delete_subject expands to many) make one receipt, applied or
    rejected: the one grouping the ledger uses for both."""
    groups: dict[str, tuple[str, list[str]]] = {}
    for ev, sample, subject in zip(event_ids, sample_ids, subject_ids):
        groups.setdefault(ev, (subject, []))[1].append(sample)
    return [AppliedDelete(ev, subj, tuple(samples)) for ev, (subj, samples) in groups.items()]


def _group_deletes(entry: Entry) -> list[AppliedDelete]:
    return group_by_event(entry.event_ids, entry.sample_ids, entry.subject_ids)
