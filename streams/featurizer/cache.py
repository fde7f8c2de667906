"""The featurizer's feature cache: one sqlite file per partition, its tables and its outbox.

docs/design.md section 2: a delete must reuse the exact q of its add (GPU backbones are not
bit-reproducible), so every accepted add's q is cached, keyed by (head, sample), with a subject
index for ``delete_subject``; the entry is erased when the delete is emitted. Section 4: the cache,
not Kafka, is the source of truth about what was applied.

**The file.** One per partition of the featurizer's input, the by-head topic
(``<data_dir>/featurizer/<stream dir>/p<N>.sqlite``). It is the local copy: the
``featurizer-cache`` changelog topic (**The changelog** below) lets a featurizer on another host rebuild
it. WAL journal. ``synchronous=FULL`` (the default) makes a committed batch survive a process kill
and a power loss (re-judging a batch after losing it could re-quantize a GPU feature to other bits
than the ones the ledger already applied); ``NORMAL`` survives a process kill only, and is what
the service uses when the changelog backs the cache, which then covers a power cut
(docs/featurizer.md, "Durability"). Tables:

- ``samples``: (head_id, sample_id) -> subject, client, add event id, label, q (int64 LE blob);
  index ``samples_by_subject`` (subject_id, head_id) is the subject index;
- ``heads``: what each head fixed at its first add (backbone, input kind, d, label kind/width,
  frac bits);
- ``tombstones``: the deletes' marks (head, kind, sample or subject id, subject, client) ->
  event time (us) and the delete's event id; adds are judged against them (``core.py``,
  remove wins), expired ones are dropped batch by batch;
- ``outbox``: the transactional outbox: encoded messages (deltas, dead letters, receipts, and the
  batch's records for the ``featurizer-cache`` changelog, with their partition and delivery
  phase) written in the same transaction as the cache mutations, deleted once the broker
  acknowledged them;
- ``lineage``: this cache's lineage id and changelog generation (:func:`resume_plan`);
- ``progress``: the last input offset whose outcome is in this file;
- ``origins``: per requests partition, the last origin offset judged (drops the router's
  re-forwarded copies: ``core.admit_routed``);
- ``meta``: schema version and identity (topic, partition, client) checked on open, and the ids
  and partition count the routing state belongs to (``bind_topic_id``, ``bind_routing``).

**The code.** :func:`open_cache_db` sets the schema and pragmas and checks ``meta``;
:class:`SampleTable`, :class:`TombstoneTable` and :class:`Outbox` read and write their tables'
rows; :class:`FeatureCache`, what the service uses, keeps the rest (position, lineage, origins,
routing state) and the transactions that span tables.

**The changelog**: the feature cache's changelog (the ``featurizer-cache`` topic): its records, pure, and
:class:`ChangelogReader`, which reads them back.

Partition p of ``featurizer-cache`` holds the cache of partition p of the by-head topic (the
featurizer's input, ``model.Router``), so any featurizer on any host rebuilds a partition's cache
from Kafka (docs/featurizer.md, "The cache changelog"). Keys (compaction keeps the last value of
each):

- ``sample/<head>/<sample>`` -> :func:`encode_sample` (subject, client, add event id, label, q as
  int64 LE); a tombstone (value None) when a delete removes the sample;
- ``head/<head>`` -> the head's first-add facts (JSON);
- ``tomb/<head>/<kind>/<id>/<subject>/<client>`` -> a delete's tombstone (JSON: event time in us,
  the delete's event id; remove wins, ``core.py``); a tombstone (value None) when it expires;
- ``txn/<p>/<slot>/<i>`` -> piece i of the latest batch's *transaction*: its cache mutations and
  its outbox messages (deltas, dead letters, receipts), so a new owner can finish delivering it;
- ``position/<p>`` -> :class:`Position` (JSON): applied offset, input topic (name and id),
  lineage, generation, the txn pieces' count and SHA-256, and the routing state (last origin
  offset per requests partition, the requests topic id, the by-head partition count). It is
  the batch's commit point;
- ``delivered/<p>`` -> the last generation whose outbox was acknowledged (saves a re-send).

Per batch the featurizer produces, in two acknowledged phases: (0) the txn pieces, then the
position record; (1) the downstream messages plus the sample/head records. Its sqlite outbox keeps
phase 0 only: :func:`outputs_of_txn` rebuilds phase 1 from the txn for a re-send. State records are
written only after their batch's position is durable, so the log never holds a sample record of
an uncommitted batch (which could shadow a committed value under compaction); txn pieces of an
unfinished batch are harmless: they sit in the other slot and only a position record names them.

All but :class:`ChangelogReader` is pure: encoding, :func:`batch_records`, :func:`fold_changelog`
(records -> cache contents) and :func:`resume_plan` (local cache vs changelog: continue, rebuild
or seed). Writing needs nothing special: changelog records are outbox rows with a partition and a
phase, delivered by the service like every other outbox row.
"""

from __future__ import annotations

import hashlib
import sqlite3
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol
from urllib.parse import quote

import numpy as np
import orjson

from unlearn.infra.log_position import watermarks
from unlearn.infra.settings import Settings, consumer_config
from unlearn.infra.topic_reader import TopicReadError, read_range
from unlearn.streams.featurizer.batch_io import OutMessage
from unlearn.streams.featurizer.cache_view import CachedSample, CacheMutations, HeadInfo
from unlearn.streams.featurizer.events import (
    EVENTS_SCHEMA,
    EventKey,
    EventMark,
    EventTable,
    event_key,
    event_value,
    open_event,
)
from unlearn.streams.featurizer.tombstones import TombName, Tombstone, TombstoneKey

__all__ = [
    "PHASE_CHANGELOG",
    "PHASE_OUTPUT",
    "ChangelogError",
    "FoldedChangelog",
    "LocalPosition",
    "Position",
    "batch_records",
    "decode_sample",
    "delivered_key",
    "delivered_record",
    "encode_sample",
    "fold_changelog",
    "head_key",
    "outputs_of_txn",
    "position_key",
    "resume_plan",
    "sample_key",
    "snapshot_mutations",
    "decode_tombstone",
    "encode_tombstone",
    "state_records",
    "tombstone_key",
    "ChangelogReadError",
    "ChangelogReader",
    "CACHE_SCHEMA_VERSION",
    "PAGE_SIZE",
    "WAL_AUTOCHECKPOINT_PAGES",
    "CacheError",
    "Transaction",
    "check_meta",
    "open_cache_db",
    "read_meta",
    "SampleTable",
    "TombstoneTable",
    "Outbox",
    "OutboxRow",
    "FeatureCache",
    "cache_path",
]

PHASE_CHANGELOG = 0
"""Outbox phase of the txn pieces and the position record: acknowledged before anything else."""
PHASE_OUTPUT = 1
"""Outbox phase of the downstream messages and the sample/head records."""

_POSITION_FORMAT = "unlearn.featurizer-position/v2"
_SAMPLE_MAGIC = b"ULFS\x01"
_TXN_MAGIC = b"ULFT\x01"
_TXN_MAGIC_HEADERS = b"ULFT\x02"  # as v1, each message followed by its headers (only when one has some)
_NONE = 0xFFFFFFFF

Record = tuple[bytes, bytes | None]  # (key, value); value None is a tombstone
#: ``seal(head, sample, plain_record) -> sealed_record`` (streams/featurizer/erasure.py)
SealSample = Callable[[str, str, bytes], bytes]
#: ``open(head, sample, record) -> plain_record`` (plaintext records pass through)
OpenSample = Callable[[str, str, bytes], bytes]


class Keyed(Protocol):
    """A record with a key and a value (an ``OutMessage`` or an outbox row)."""

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...


class ChangelogError(RuntimeError):
    """A changelog record cannot be decoded, or a txn does not verify."""


# --------------------------------------------------------------------------- keys
def sample_key(head_id: str, sample_id: str) -> bytes:
    """Key of a cached sample (ids may contain '/': the head id is length-prefixed)."""
    return f"sample/{len(head_id)}:{head_id}/{sample_id}".encode()


def tombstone_key(key: TombstoneKey) -> bytes:
    """Key of a tombstone: every id length-prefixed but the last (ids may contain '/')."""
    head_id, kind, id_, subject_id, client_id = key
    return f"tomb/{len(head_id)}:{head_id}/{kind}/{len(id_)}:{id_}/{len(subject_id)}:{subject_id}/{client_id}".encode()


def _parse_tombstone_key(key: bytes) -> TombstoneKey:
    rest = key.decode()[len("tomb/"):]
    parts: list[str] = []
    for i in range(4):
        if i == 1:  # the kind: no length prefix
            kind, _, rest = rest.partition("/")
            parts.append(kind)
            continue
        n, _, tail = rest.partition(":")
        parts.append(tail[: int(n)])
        rest = tail[int(n) + 1:]
    if parts[1] not in ("sample", "subject"):
        raise ValueError(f"unknown tombstone kind {parts[1]!r}")
    return (parts[0], parts[1], parts[2], parts[3], rest)


def encode_tombstone(t: Tombstone) -> bytes:
    return orjson.dumps({"t": int(t.event_us), "event": t.event_id})


def decode_tombstone(key: bytes, raw: bytes) -> Tombstone:
    """A ``tomb/`` record back to its :class:`Tombstone`."""
    try:
        head_id, kind, id_, subject_id, client_id = _parse_tombstone_key(key)
        v = orjson.loads(raw)
        return Tombstone(head_id, "subject" if kind == "subject" else "sample", id_, subject_id, client_id,
                         int(v["t"]), str(v["event"]))
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise ChangelogError(f"bad tombstone record {key[:200]!r}: {exc}") from None


def head_key(head_id: str) -> bytes:
    return f"head/{head_id}".encode()


def position_key(partition: int) -> bytes:
    return f"position/{int(partition)}".encode()


def txn_key(partition: int, slot: int, index: int) -> bytes:
    return f"txn/{int(partition)}/{int(slot)}/{int(index)}".encode()


def delivered_key(partition: int) -> bytes:
    return f"delivered/{int(partition)}".encode()


def _parse_sample_key(key: bytes) -> tuple[str, str]:
    rest = key.decode()[len("sample/"):]
    n, _, tail = rest.partition(":")
    return tail[: int(n)], tail[int(n) + 1:]


# --------------------------------------------------------------------------- values
def encode_sample(s: CachedSample) -> bytes:
    """``ULFS\\x01`` + u32 header length + JSON header + q (int64 LE) [+ label vector (int64 LE)]."""
    vec = not isinstance(s.label, int)
    q = np.ascontiguousarray(s.q, dtype="<i8")
    fields = {"subject": s.subject_id, "client": s.client_id, "event": s.event_id,
              "label": None if vec else int(s.label), "d": int(q.shape[0]),
              "label_width": int(np.asarray(s.label).shape[0]) if vec else 0}
    if s.event_us:  # the add's event time (remove wins); absent in records written before it was kept
        fields["t"] = int(s.event_us)
    header = orjson.dumps(fields)
    out = _SAMPLE_MAGIC + struct.pack("<I", len(header)) + header + q.tobytes()
    if vec:
        out += np.ascontiguousarray(s.label, dtype="<i8").tobytes()
    return out


def decode_sample(head_id: str, sample_id: str, raw: bytes) -> CachedSample:
    """Inverse of :func:`encode_sample`."""
    try:
        if not raw.startswith(_SAMPLE_MAGIC):
            raise ValueError("not a cached-sample record")
        (n,) = struct.unpack_from("<I", raw, len(_SAMPLE_MAGIC))
        at = len(_SAMPLE_MAGIC) + 4
        h = orjson.loads(raw[at: at + n])
        at += n
        d, c = int(h["d"]), int(h["label_width"])
        if len(raw) != at + 8 * (d + c):
            raise ValueError("truncated cached-sample record")
        q = np.frombuffer(raw, dtype="<i8", count=d, offset=at).astype(np.int64)
        label: int | np.ndarray = (int(h["label"]) if h["label"] is not None else
                                   np.frombuffer(raw, dtype="<i8", count=c, offset=at + 8 * d).astype(np.int64))
        return CachedSample(head_id, sample_id, str(h["subject"]), str(h["client"]), str(h["event"]), label, q,
                            int(h.get("t", 0)))
    except (ValueError, KeyError, TypeError, struct.error, orjson.JSONDecodeError) as exc:
        raise ChangelogError(f"bad sample record for ({head_id!r}, {sample_id!r}): {exc}") from None


def _encode_head(h: HeadInfo) -> bytes:
    return orjson.dumps({"backbone": h.backbone, "input_kind": h.input_kind, "dim": h.dim,
                         "label_kind": h.label_kind, "label_width": h.label_width, "frac_bits": h.frac_bits,
                         "label_frac_bits": h.label_frac_bits})


def _decode_head(head_id: str, raw: bytes) -> HeadInfo:
    try:
        h = orjson.loads(raw)
        return HeadInfo(head_id, str(h["backbone"]), str(h["input_kind"]), int(h["dim"]), h["label_kind"],
                        int(h["label_width"]), int(h["frac_bits"]), int(h["label_frac_bits"]))
    except (KeyError, TypeError, ValueError, orjson.JSONDecodeError) as exc:
        raise ChangelogError(f"bad head record for {head_id!r}: {exc}") from None


@dataclass(frozen=True)
class Position:
    """The commit record of one batch (``position/<p>``): where the cache stands, which log it
    belongs to (``topic``: the by-head topic it reads, and its id), which lineage wrote it,
    the txn pieces that hold the batch itself, and the routing state that must move with the
    cache: the last origin offset judged per requests partition (``origins``, for
    ``core.admit_routed``), the id of the requests topic they are offsets of, and the by-head
    partition count the heads were routed by (0: unknown)."""

    partition: int
    applied_offset: int
    topic: str
    topic_id: str
    lineage: str
    generation: int
    pieces: int
    sha256: str
    origins: Mapping[int, int] = field(default_factory=dict)
    origin_topic_id: str = ""
    route_partitions: int = 0

    def encode(self) -> bytes:
        return orjson.dumps({"format": _POSITION_FORMAT, "partition": self.partition,
                             "applied_offset": self.applied_offset, "topic": self.topic,
                             "topic_id": self.topic_id, "lineage": self.lineage, "generation": self.generation,
                             "pieces": self.pieces, "sha256": self.sha256,
                             "origins": {str(p): int(o) for p, o in sorted(self.origins.items())},
                             "origin_topic_id": self.origin_topic_id, "route_partitions": self.route_partitions})

    @classmethod
    def decode(cls, raw: bytes) -> Position:
        """The record ``raw`` holds; ChangelogError if it is not one."""
        try:
            d = orjson.loads(raw)
            if d.get("format") != _POSITION_FORMAT:
                raise ValueError(f"unknown position format {d.get('format')!r}")
            return cls(int(d["partition"]), int(d["applied_offset"]), str(d["topic"]), str(d["topic_id"]),
                       str(d["lineage"]), int(d["generation"]), int(d["pieces"]), str(d["sha256"]),
                       {int(p): int(o) for p, o in d["origins"].items()}, str(d["origin_topic_id"]),
                       int(d["route_partitions"]))
        except (KeyError, TypeError, ValueError, AttributeError, orjson.JSONDecodeError) as exc:
            raise ChangelogError(f"unreadable position record: {exc}") from None


# --------------------------------------------------------------------------- records of a batch
def state_records(mutations: CacheMutations, seal_sample: SealSample | None = None) -> list[Record]:
    """The sample/head/tombstone/event records of a batch's cache mutations (drops are tombstones);
    sample values and adds' event marks sealed with ``seal_sample`` when given (docs/erasure.md)."""
    out: list[Record] = [(head_key(h.head_id), _encode_head(h)) for h in mutations.put_heads]
    out += [(tombstone_key(k), None) for k in mutations.drop_tombstones]
    out += [(tombstone_key(t.key), encode_tombstone(t)) for t in mutations.put_tombstones]
    out += [(event_key(k), None) for k in mutations.drop_events]
    out += [(event_key(m.key), event_value(m, seal_sample)) for m in mutations.put_events]
    out += [(sample_key(h, s), None) for h, s in mutations.drop_samples]
    for s in mutations.put_samples:
        value = encode_sample(s)
        out.append((sample_key(s.head_id, s.sample_id),
                    value if seal_sample is None else seal_sample(s.head_id, s.sample_id, value)))
    return out


def _frame(b: bytes | None) -> bytes:
    return struct.pack("<I", _NONE) if b is None else struct.pack("<I", len(b)) + b


def encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """Kafka headers as frames: a count, then name and value of each (None values kept)."""
    return b"".join([struct.pack("<I", len(headers))] + [_frame(n.encode()) + _frame(v) for n, v in headers])


def decode_headers(raw: bytes | None) -> tuple[tuple[str, bytes | None], ...]:
    """Inverse of :func:`encode_headers` (None or b"": no headers); ValueError when malformed."""
    if not raw:
        return ()
    (n,), at = struct.unpack_from("<I", raw, 0), 4
    out: list[tuple[str, bytes | None]] = []
    for _ in range(n):
        pair: list[bytes | None] = []
        for _ in range(2):
            (size,) = struct.unpack_from("<I", raw, at)
            at += 4
            if size == _NONE:
                pair.append(None)
                continue
            if at + size > len(raw):
                raise ValueError("truncated headers")
            pair.append(raw[at: at + size])
            at += size
        if pair[0] is None:
            raise ValueError("null header name")
        out.append((pair[0].decode(), pair[1]))
    if at != len(raw):
        raise ValueError("trailing header bytes")
    return tuple(out)


def encode_txn(records: Sequence[Record], messages: Sequence[OutMessage]) -> bytes:
    """A batch: its state records and its downstream messages, length-prefixed. When a message
    has headers (trace context), the v2 magic says each message is followed by its headers; a
    batch without any is written as v1, byte for byte as before."""
    headed = any(m.headers for m in messages)
    parts = [_TXN_MAGIC_HEADERS if headed else _TXN_MAGIC, struct.pack("<II", len(records), len(messages))]
    for k, v in records:
        parts += [_frame(k), _frame(v)]
    for m in messages:
        parts += [_frame(m.topic.encode()), _frame(m.key), _frame(m.value)]
        if headed:
            parts.append(_frame(encode_headers(m.headers)))
    return b"".join(parts)


def decode_txn(raw: bytes) -> tuple[list[Record], list[OutMessage]]:
    """Inverse of :func:`encode_txn`."""
    at = 0

    def take() -> bytes | None:
        nonlocal at
        (n,) = struct.unpack_from("<I", raw, at)
        at += 4
        if n == _NONE:
            return None
        if at + n > len(raw):
            raise ValueError("truncated")
        b = raw[at: at + n]
        at += n
        return b

    try:
        headed = raw.startswith(_TXN_MAGIC_HEADERS)
        if not (headed or raw.startswith(_TXN_MAGIC)):
            raise ValueError("not a txn")
        at = len(_TXN_MAGIC)
        n_rec, n_msg = struct.unpack_from("<II", raw, at)
        at += 8
        records: list[Record] = []
        for _ in range(n_rec):
            k = take()
            if k is None:
                raise ValueError("null key")
            records.append((k, take()))
        messages = []
        for _ in range(n_msg):
            topic, key, value = take(), take(), take()
            if topic is None or value is None:
                raise ValueError("null topic or value")
            messages.append(OutMessage(topic.decode(), key, value, headers=decode_headers(take()) if headed else ()))
        if at != len(raw):
            raise ValueError("trailing bytes")
        return records, messages
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ChangelogError(f"bad txn: {exc}") from None


def batch_records(partition: int, topic: str, mutations: CacheMutations, messages: Sequence[OutMessage],
                  position: Position, piece_bytes: int, seal_sample: SealSample | None = None) -> list[OutMessage]:
    """The changelog messages of one committed batch, in outbox order: phase 0 (txn pieces, then
    the position record), then phase 1 (the sample/head records). ``position.pieces`` and
    ``sha256`` are filled in here; ``piece_bytes`` bounds a piece; ``seal_sample`` seals sample values."""
    records = state_records(mutations, seal_sample)
    txn = encode_txn(records, messages)
    step = max(1, int(piece_bytes))
    pieces = [txn[i: i + step] for i in range(0, len(txn), step)] or [b""]
    pos = replace(position, partition=partition, pieces=len(pieces), sha256=hashlib.sha256(txn).hexdigest())
    slot = pos.generation % 2
    out = [OutMessage(topic, txn_key(partition, slot, i), piece, partition, PHASE_CHANGELOG)
           for i, piece in enumerate(pieces)]
    out.append(OutMessage(topic, position_key(partition), pos.encode(), partition, PHASE_CHANGELOG))
    out += [OutMessage(topic, k, v, partition, PHASE_OUTPUT) for k, v in records]
    return out


def outputs_of_txn(topic: str, partition: int, phase0: Sequence[Keyed]) -> list[OutMessage]:
    """Phase 1 of the batches whose phase 0 is ``phase0`` (their txn pieces and position records,
    in outbox order): the sample/head records, then the downstream messages, byte for byte what
    :func:`batch_records` and the batch's outcome gave when it was committed (sealed values
    included: the txn holds the sealed bytes). Why: the sqlite outbox keeps phase 0 only, so an
    add's q is stored there once (in the txn), not twice (docs/featurizer.md, "Crash
    consistency"). ChangelogError when a txn does not verify against its position."""
    out: list[OutMessage] = []
    pieces: list[bytes] = []
    pos_key = position_key(partition)
    for m in phase0:
        if m.key == pos_key and m.value is not None:
            pos = Position.decode(m.value)
            txn = b"".join(pieces)
            if len(pieces) != pos.pieces or hashlib.sha256(txn).hexdigest() != pos.sha256:
                raise ChangelogError(f"outbox txn of partition {partition} (generation {pos.generation}) does not "
                                     "verify against its position")
            records, messages = decode_txn(txn)
            out += [OutMessage(topic, k, v, partition, PHASE_OUTPUT) for k, v in records]
            out += [OutMessage(x.topic, x.key, x.value, None, PHASE_OUTPUT, x.headers) for x in messages]
            pieces = []
        elif m.key is not None and m.key.startswith(b"txn/") and m.value is not None:
            pieces.append(m.value)
        else:
            raise ChangelogError(f"not a phase-0 record of partition {partition}: {m.key!r}")
    if pieces:
        raise ChangelogError(f"outbox of partition {partition}: txn pieces without their position record")
    return out


def delivered_record(topic: str, partition: int, generation: int) -> OutMessage:
    """"Generation g's outbox was acknowledged": a new owner need not re-send it."""
    return OutMessage(topic, delivered_key(partition), str(int(generation)).encode(), partition, PHASE_OUTPUT)


# --------------------------------------------------------------------------- folding
@dataclass
class FoldedChangelog:
    """What a changelog partition says: the cache contents, the latest position and the latest
    batch's outbox messages and state records still to deliver (empty if a ``delivered`` record
    covers it)."""

    samples: dict[tuple[str, str], CachedSample] = field(default_factory=dict)
    heads: dict[str, HeadInfo] = field(default_factory=dict)
    tombstones: dict[TombstoneKey, Tombstone] = field(default_factory=dict)
    events: dict[EventKey, EventMark] = field(default_factory=dict)  # event-id marks (events.py)
    position: Position | None = None
    pending: list[OutMessage] = field(default_factory=list)
    pending_records: list[Record] = field(default_factory=list)  # the latest batch's sample/head records

    @property
    def empty(self) -> bool:
        return self.position is None


def _apply(folded: FoldedChangelog, key: bytes, value: bytes | None, raw: dict[tuple[str, str], bytes],
           raw_events: dict[bytes, bytes]) -> None:
    if key.startswith(b"sample/"):
        head_id, sample_id = _parse_sample_key(key)
        if value is None:
            raw.pop((head_id, sample_id), None)
        else:  # decoded once folding is done: an erased sample's old record is never opened
            raw[(head_id, sample_id)] = value
    elif key.startswith(b"head/") and value is not None:
        head_id = key.decode()[len("head/"):]
        folded.heads[head_id] = _decode_head(head_id, value)
    elif key.startswith(b"tomb/"):
        if value is None:
            try:
                folded.tombstones.pop(_parse_tombstone_key(key), None)
            except (ValueError, UnicodeDecodeError) as exc:
                raise ChangelogError(f"bad tombstone key {key[:200]!r}: {exc}") from None
        else:
            t = decode_tombstone(key, value)
            folded.tombstones[t.key] = t
    elif key.startswith(b"event/"):  # opened once folding is done, as samples
        if value is None:
            raw_events.pop(key, None)
        else:
            raw_events[key] = value


def fold_changelog(records: Iterable[Record], partition: int, open_sample: OpenSample | None = None) -> FoldedChangelog:
    """Records of one changelog partition, in log order -> the cache they describe.

    Last value per key wins and tombstones delete. Sample/head records are only ever written after
    their batch's position record, so everything before the last position is committed; the last
    position's txn is applied again on top (its sample/head records may be partly missing after
    a crash) and its outbox is returned as ``pending`` unless a ``delivered`` record covers it.
    Records with no position record at all describe nothing (an upload that never committed).
    Sample values are opened with ``open_sample`` (sealed records, docs/erasure.md) only if they
    are the last value of their key.
    """
    folded = FoldedChangelog()
    latest: dict[bytes, bytes | None] = {}
    raw: dict[tuple[str, str], bytes] = {}
    raw_events: dict[bytes, bytes] = {}
    pos_key, done_key = position_key(partition), delivered_key(partition)
    for key, value in records:
        if key.startswith((b"sample/", b"head/", b"tomb/", b"event/")):
            _apply(folded, key, value, raw, raw_events)
        else:
            latest[key] = value
    raw_pos = latest.get(pos_key)
    if raw_pos is None:
        return FoldedChangelog()
    pos = Position.decode(raw_pos)
    slot = pos.generation % 2
    pieces = [latest.get(txn_key(partition, slot, i)) for i in range(pos.pieces)]
    if any(p is None for p in pieces):
        raise ChangelogError(f"position of partition {partition} names {pos.pieces} txn pieces, some are missing")
    txn = b"".join(p for p in pieces if p is not None)
    if hashlib.sha256(txn).hexdigest() != pos.sha256:
        raise ChangelogError(f"txn of partition {partition} (generation {pos.generation}) does not verify")
    recs, messages = decode_txn(txn)
    for key, value in recs:
        _apply(folded, key, value, raw, raw_events)
    for (head_id, sample_id), value in raw.items():
        plain = value if open_sample is None else open_sample(head_id, sample_id, value)
        folded.samples[(head_id, sample_id)] = decode_sample(head_id, sample_id, plain)
    for key, value in raw_events.items():
        try:
            m = open_event(key, value, open_sample)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, struct.error) as exc:
            raise ChangelogError(f"bad event record {key[:200]!r}: {exc}") from None
        folded.events[m.key] = m
    folded.position = pos
    done = latest.get(done_key)
    if done is None or int(done) < pos.generation:
        folded.pending, folded.pending_records = messages, recs
    return folded


# --------------------------------------------------------------------------- resuming
@dataclass(frozen=True)
class LocalPosition:
    """What the local sqlite cache says about itself."""

    applied_offset: int  # -1: empty
    lineage: str
    generation: int


ResumePlan = Literal["continue", "rebuild", "seed", "fresh"]


def resume_plan(local: LocalPosition, changelog: Position | None) -> ResumePlan:
    """How a newly assigned partition starts.

    - ``continue``: the changelog's latest batch was written by this cache's lineage and is not
      ahead of it: the local cache is that history (possibly ahead: its outbox re-send brings
      the changelog up to date);
    - ``rebuild``: the changelog was written by another lineage (another host took the
      partition meanwhile), or the local cache is empty: load the cache from the changelog and
      drop the local one (an unsent local batch was never delivered: phase 0 comes first);
    - ``seed``: no position in the changelog but a local cache (a recreated ``featurizer-cache``
      topic, or a crash before the first batch reached it): upload it;
    - ``fresh``: both empty.
    """
    if changelog is None:
        return "fresh" if local.applied_offset < 0 else "seed"
    if (local.applied_offset >= 0 and local.lineage == changelog.lineage
            and changelog.generation <= local.generation and changelog.applied_offset <= local.applied_offset):
        return "continue"
    return "rebuild"


def snapshot_mutations(samples: Iterable[CachedSample], heads: Iterable[HeadInfo],
                       tombstones: Iterable[Tombstone] = (), events: Iterable[EventMark] = ()) -> CacheMutations:
    """A whole cache as one batch of puts (the txn of a ``seed``)."""
    return CacheMutations(put_samples=tuple(samples), put_heads=tuple(heads), put_tombstones=tuple(tombstones),
                          put_events=tuple(events))


_SCAN_WINDOW = 512  # records of the first backward window when looking for the last position


class ChangelogReadError(RuntimeError):
    """A changelog partition could not be read in time."""


class ChangelogReader:
    """Reads one changelog topic with a group-less consumer (never joins a group)."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.settings = settings
        self.topic = topic

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        group = f"{self.settings.topic_prefix}featurizer-restore-{uuid.uuid4().hex}"
        return Consumer(consumer_config(self.settings, group, **{"enable.partition.eof": True}))

    def latest_position(self, partition: int) -> tuple[Position | None, int]:
        """The last ``position/<p>`` record and the highest generation a ``delivered`` record after
        it names (0: none), scanning back from the end in growing windows (cheap: both are within
        the last batch's records)."""
        want, done_key = position_key(partition), delivered_key(partition)
        delivered = 0
        c = self._consumer()
        try:
            low, high = watermarks(c, self.topic, partition, self.settings.admin_timeout)
            low, high = max(0, int(low)), max(0, int(high))
            stop: int | None = None  # None: to the partition's true end (EOF), whatever ListOffsets said
            window = _SCAN_WINDOW
            start = max(low, high - window)
            while True:
                for _, k, v in reversed(self._read(c, partition, start, stop)):
                    if k == done_key and v is not None:
                        delivered = max(delivered, int(v))
                    elif k == want and v is not None:
                        return Position.decode(v), delivered
                if start <= low:
                    return None, 0
                stop, window = start, window * 4
                start = max(low, start - window)
        finally:
            c.close()

    def restore(self, partition: int, open_sample: OpenSample | None = None) -> FoldedChangelog:
        """Read the whole partition and fold it (last value per key, tombstones delete; sealed
        sample records opened with ``open_sample``)."""
        c = self._consumer()
        try:
            records = self._read(c, partition, 0, None)
        finally:
            c.close()
        return fold_changelog(((k, v) for _, k, v in records if k is not None), partition, open_sample)

    def _read(self, c: Any, partition: int, start: int, stop: int | None) -> list[tuple[int, bytes | None,
                                                                                    bytes | None]]:
        """(offset, key, value) of offsets [start, stop) (``stop`` None: to the partition's end)."""
        try:  # a large cache takes long: time out on no progress only
            return read_range(c, self.topic, partition, start, stop, max(30.0, self.settings.admin_timeout))
        except TopicReadError as exc:
            raise ChangelogReadError(str(exc)) from None


CACHE_SCHEMA_VERSION = 1
"""Written into a new cache file and checked on every open: a file of another version is refused
(CacheError; start over with an empty data dir), never read with another meaning."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS heads (
    head_id TEXT PRIMARY KEY,
    backbone TEXT NOT NULL,
    input_kind TEXT NOT NULL,
    dim INTEGER NOT NULL,
    label_kind TEXT NOT NULL,
    label_width INTEGER NOT NULL,
    frac_bits INTEGER NOT NULL,
    label_frac_bits INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS samples (
    head_id TEXT NOT NULL,
    sample_id TEXT NOT NULL,
    subject_id TEXT NOT NULL,
    client_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    label_class INTEGER,
    label_vec BLOB,
    q BLOB NOT NULL,
    event_us INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (head_id, sample_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS samples_by_subject ON samples (subject_id, head_id, sample_id);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    key BLOB,
    value BLOB,
    partition INTEGER,
    phase INTEGER NOT NULL DEFAULT 1,
    headers BLOB,  -- Kafka headers (encode_headers; the trace context), NULL: none
    CHECK (value IS NOT NULL OR partition IS NOT NULL)  -- only a changelog tombstone has no value
);
CREATE TABLE IF NOT EXISTS progress (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    applied_offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS lineage (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    lineage TEXT NOT NULL,
    generation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS origins (
    partition INTEGER PRIMARY KEY,
    offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tombstones (
    head_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    subject_id TEXT NOT NULL,
    client_id TEXT NOT NULL,
    event_us INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    PRIMARY KEY (head_id, kind, id, subject_id, client_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tombstones_by_time ON tombstones (event_us);
"""

PAGE_SIZE = 65536
"""sqlite page size of a new cache file. A batch writes megabytes (q is in the samples and twice in
the changelog txn, its sample record and delta), mostly as overflow pages: 64 KiB pages make a
batch's commit and its outbox delete several times cheaper than 4 KiB pages
(bench/results/pipeline_bench.md). Existing files keep theirs."""
WAL_AUTOCHECKPOINT_PAGES = 256
"""Checkpoint the WAL at 16 MiB (256 pages of 64 KiB): a few batches per checkpoint, so outbox
pages rewritten batch after batch are copied into the database file once, and the WAL stays small."""


class CacheError(RuntimeError):
    """The cache file is not usable as asked (other identity, newer schema, offset going back)."""


class Transaction:
    """``with Transaction(db):`` one ``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.db.execute("COMMIT" if et is None else "ROLLBACK")


def open_cache_db(path: Path, synchronous: str, identity: Mapping[str, str]) -> sqlite3.Connection:
    """Open (or create) a cache file: pragmas, schema, and the schema version and ``identity``
    checked against (or written into) ``meta``. CacheError if the file belongs to something else."""
    if synchronous not in ("FULL", "NORMAL"):
        raise ValueError(f"synchronous must be FULL or NORMAL, got {synchronous!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), isolation_level=None, timeout=30.0)
    try:
        db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect in a new file only
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("PRAGMA busy_timeout=30000")
        db.execute("PRAGMA secure_delete=ON")  # deleted rows are zeroed in the file (docs/erasure.md)
        db.executescript(_SCHEMA + EVENTS_SCHEMA)
        _add_outbox_headers(db)
        check_meta(db, path, {"schema_version": str(CACHE_SCHEMA_VERSION), **dict(identity)})
    except Exception:
        db.close()
        raise
    return db


def _add_outbox_headers(db: sqlite3.Connection) -> None:
    """A cache file made before the outbox kept headers gains the column (NULL: no headers, what
    its rows had); schema version 1 either way: an older featurizer ignores the column."""
    if "headers" not in {str(r[1]) for r in db.execute("PRAGMA table_info(outbox)").fetchall()}:
        db.execute("ALTER TABLE outbox ADD COLUMN headers BLOB")


def check_meta(db: sqlite3.Connection, path: Path, wanted: Mapping[str, str]) -> None:
    """Write the ``wanted`` meta values not yet there; CacheError if one there differs."""
    with Transaction(db):
        have = dict(db.execute("SELECT key, value FROM meta").fetchall())
        for key, value in wanted.items():
            if key in have and have[key] != value:
                raise CacheError(f"{path}: cache has {key}={have[key]!r}, opened as {value!r}")
            if key not in have:
                db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))


def read_meta(db: sqlite3.Connection, key: str) -> str:
    """A ``meta`` value ("" if absent)."""
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return "" if row is None else str(row[0])


_SAMPLE_COLUMNS = "head_id, sample_id, subject_id, client_id, event_id, label_class, label_vec, q, event_us"
_HEAD_COLUMNS = "head_id, backbone, input_kind, dim, label_kind, label_width, frac_bits, label_frac_bits"
_CHUNK = 500  # ids per IN (...) query


def _i64(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<i8").tobytes()


def _from_i64(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype="<i8").astype(np.int64)


def _sample(row: Sequence[object]) -> CachedSample:
    head_id, sample_id, subject_id, client_id, event_id, label_class, label_vec, q, event_us = row
    label = int(label_class) if label_class is not None else _from_i64(label_vec)  # type: ignore[arg-type,call-overload]
    return CachedSample(str(head_id), str(sample_id), str(subject_id), str(client_id), str(event_id),
                        label, _from_i64(q), int(event_us))  # type: ignore[arg-type,call-overload]


class SampleTable:
    """Reads and writes of ``samples`` and ``heads`` on one connection (writes inside the
    caller's transaction)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def get(self, head_id: str, sample_id: str) -> CachedSample | None:
        row = self._db.execute(f"SELECT {_SAMPLE_COLUMNS} FROM samples WHERE head_id = ? AND sample_id = ?",
                               (head_id, sample_id)).fetchone()
        return None if row is None else _sample(row)

    def get_many(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], CachedSample]:
        """The cached ones of many (head, sample) keys: one query per head and 500 samples."""
        by_head: dict[str, list[str]] = {}
        for head_id, sample_id in set(keys):
            by_head.setdefault(head_id, []).append(sample_id)
        found: dict[tuple[str, str], CachedSample] = {}
        for head_id, ids in by_head.items():
            for i in range(0, len(ids), _CHUNK):
                chunk = ids[i:i + _CHUNK]
                rows = self._db.execute(
                    f"SELECT {_SAMPLE_COLUMNS} FROM samples "
                    f"WHERE head_id = ? AND sample_id IN ({','.join('?' * len(chunk))})",
                    (head_id, *chunk)).fetchall()
                for row in rows:
                    s = _sample(row)
                    found[(s.head_id, s.sample_id)] = s
        return found

    def of_subject(self, head_id: str, subject_id: str) -> list[CachedSample]:
        """The subject's cached samples in one head, ordered by sample id."""
        rows = self._db.execute(
            f"SELECT {_SAMPLE_COLUMNS} FROM samples WHERE subject_id = ? AND head_id = ? ORDER BY sample_id",
            (subject_id, head_id)).fetchall()
        return [_sample(r) for r in rows]

    def of_head(self, head_id: str) -> list[CachedSample]:
        """Every cached sample of a head, ordered by sample id."""
        rows = self._db.execute(
            f"SELECT {_SAMPLE_COLUMNS} FROM samples WHERE head_id = ? ORDER BY sample_id", (head_id,)).fetchall()
        return [_sample(r) for r in rows]

    def all(self) -> list[CachedSample]:
        """Every cached sample, by (head, sample)."""
        rows = self._db.execute(f"SELECT {_SAMPLE_COLUMNS} FROM samples ORDER BY head_id, sample_id").fetchall()
        return [_sample(r) for r in rows]

    def count(self, head_id: str | None = None) -> int:
        if head_id is None:
            return int(self._db.execute("SELECT COUNT(*) FROM samples").fetchone()[0])
        return int(self._db.execute("SELECT COUNT(*) FROM samples WHERE head_id = ?", (head_id,)).fetchone()[0])

    def put(self, samples: Iterable[CachedSample], replace: bool) -> None:
        self._db.executemany(
            f"INSERT {'OR REPLACE ' if replace else ''}INTO samples ({_SAMPLE_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(s.head_id, s.sample_id, s.subject_id, s.client_id, s.event_id,
              s.label if isinstance(s.label, int) else None,
              None if isinstance(s.label, int) else _i64(s.label), _i64(s.q), int(s.event_us))
             for s in samples])

    def drop(self, keys: Iterable[tuple[str, str]]) -> None:
        """Delete (head, sample) keys."""
        self._db.executemany("DELETE FROM samples WHERE head_id = ? AND sample_id = ?", list(keys))

    def head(self, head_id: str) -> HeadInfo | None:
        row = self._db.execute(f"SELECT {_HEAD_COLUMNS} FROM heads WHERE head_id = ?", (head_id,)).fetchone()
        return None if row is None else HeadInfo(*row)

    def heads(self) -> list[HeadInfo]:
        return [HeadInfo(*r) for r in self._db.execute(f"SELECT {_HEAD_COLUMNS} FROM heads ORDER BY head_id")]

    def put_heads(self, heads: Iterable[HeadInfo], replace: bool) -> None:
        for h in heads:
            self._db.execute(
                f"INSERT {'OR REPLACE ' if replace else ''}INTO heads ({_HEAD_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (h.head_id, h.backbone, h.input_kind, h.dim, h.label_kind, h.label_width, h.frac_bits,
                 h.label_frac_bits))


_COLUMNS = "head_id, kind, id, subject_id, client_id, event_us, event_id"


def _tomb(row: Sequence[object]) -> Tombstone:
    head_id, kind, id_, subject_id, client_id, event_us, event_id = row
    return Tombstone(str(head_id), "subject" if kind == "subject" else "sample", str(id_), str(subject_id),
                     str(client_id), int(event_us), str(event_id))  # type: ignore[call-overload]


class TombstoneTable:
    """Reads and writes of ``tombstones`` on one connection (writes inside the caller's transaction)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def of(self, head_id: str, kind: str, id_: str, subject_id: str) -> list[Tombstone]:
        """The tombstones of (head, kind, id, subject), one per client ("" first)."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM tombstones WHERE head_id = ? AND kind = ? AND id = ? AND subject_id = ? "
            "ORDER BY client_id", (head_id, kind, id_, subject_id)).fetchall()
        return [_tomb(r) for r in rows]

    def of_many(self, names: Iterable[TombName]) -> dict[TombName, list[Tombstone]]:
        """The tombstones of many names: one query per head and 500 ids."""
        wanted = set(names)
        by_head: dict[str, set[str]] = {}
        for head_id, _kind, id_, _subject in wanted:
            by_head.setdefault(head_id, set()).add(id_)
        found: dict[TombName, list[Tombstone]] = {n: [] for n in wanted}
        for head_id, id_set in by_head.items():
            ids = sorted(id_set)
            for i in range(0, len(ids), _CHUNK):
                chunk = ids[i:i + _CHUNK]
                rows = self._db.execute(
                    f"SELECT {_COLUMNS} FROM tombstones WHERE head_id = ? AND id IN ({','.join('?' * len(chunk))})"
                    " ORDER BY client_id", (head_id, *chunk)).fetchall()
                for row in rows:
                    t = _tomb(row)
                    name = (t.head_id, t.kind, t.id, t.subject_id)
                    if name in found:
                        found[name].append(t)
        return found

    def expired(self, before_us: int, limit: int) -> list[TombstoneKey]:
        """Keys of up to ``limit`` tombstones dated before ``before_us`` (oldest first)."""
        rows = self._db.execute(
            "SELECT head_id, kind, id, subject_id, client_id FROM tombstones WHERE event_us < ? "
            "ORDER BY event_us LIMIT ?", (int(before_us), int(limit))).fetchall()
        return [(str(h), str(k), str(i), str(s), str(c)) for h, k, i, s, c in rows]

    def all(self) -> list[Tombstone]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM tombstones "
                                "ORDER BY head_id, kind, id, subject_id, client_id").fetchall()
        return [_tomb(r) for r in rows]

    def put(self, tombs: Iterable[Tombstone]) -> None:
        """Insert, or move a tombstone's time forward (never back)."""
        self._db.executemany(
            f"INSERT INTO tombstones ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (head_id, kind, id, subject_id, client_id) DO UPDATE SET "
            "event_us = excluded.event_us, event_id = excluded.event_id WHERE excluded.event_us > event_us",
            [(t.head_id, t.kind, t.id, t.subject_id, t.client_id, int(t.event_us), t.event_id) for t in tombs])

    def drop(self, keys: Iterable[TombstoneKey]) -> None:
        self._db.executemany(
            "DELETE FROM tombstones WHERE head_id = ? AND kind = ? AND id = ? AND subject_id = ? AND client_id = ?",
            list(keys))


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A message waiting for its broker acknowledgement."""

    seq: int
    topic: str
    key: bytes | None
    value: bytes | None  # None: a changelog tombstone
    partition: int | None = None
    phase: int = 1
    headers: tuple[tuple[str, bytes | None], ...] = ()


class Outbox:
    """The ``outbox`` table of one connection whose default ``synchronous`` is ``synchronous``."""

    def __init__(self, db: sqlite3.Connection, synchronous: str) -> None:
        self._db = db
        self.synchronous = synchronous

    def append(self, messages: Iterable[OutMessage]) -> list[int]:
        """Append in one ``executemany`` (inside the caller's transaction) with explicit sequence
        numbers after the highest ever used (AUTOINCREMENT's rule: never reused)."""
        row = self._db.execute("SELECT MAX(s) FROM (SELECT seq AS s FROM sqlite_sequence WHERE name = 'outbox' "
                               "UNION ALL SELECT MAX(seq) FROM outbox)").fetchone()
        base = int(row[0] or 0)
        rows = [(base + i, m.topic, m.key, m.value, m.partition, int(m.phase),
                 encode_headers(m.headers) if m.headers else None) for i, m in enumerate(messages, 1)]
        self._db.executemany("INSERT INTO outbox (seq, topic, key, value, partition, phase, headers) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        return [r[0] for r in rows]

    def clear(self) -> None:
        """Delete every row (inside the caller's transaction)."""
        self._db.execute("DELETE FROM outbox")

    def pending(self) -> list[OutboxRow]:
        """Messages written but not yet acknowledged, in write order."""
        rows = self._db.execute("SELECT seq, topic, key, value, partition, phase, headers FROM outbox "
                                "ORDER BY seq").fetchall()
        return [OutboxRow(int(s), str(t), None if k is None else bytes(k), None if v is None else bytes(v),
                          None if p is None else int(p), int(ph), decode_headers(None if h is None else bytes(h)))
                for s, t, k, v, p, ph, h in rows]

    def ack(self, seqs: Iterable[int]) -> None:
        """Forget rows the broker acknowledged: one range DELETE per run of consecutive sequence
        numbers (a batch's rows are one run). Not synced to disk on its own (WAL,
        ``synchronous=NORMAL`` for this transaction): the next batch's commit syncs it, and
        losing it to a power cut only re-sends messages the ledger deduplicates
        (docs/featurizer.md, "The feature cache")."""
        runs: list[list[int]] = []
        for s in sorted({int(s) for s in seqs}):
            if runs and s == runs[-1][1] + 1:
                runs[-1][1] = s
            else:
                runs.append([s, s])
        if not runs:
            return
        self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            with Transaction(self._db):
                self._db.executemany("DELETE FROM outbox WHERE seq BETWEEN ? AND ?", runs)
        finally:
            self._db.execute(f"PRAGMA synchronous={self.synchronous}")


def cache_path(data_dir: str | Path, stream_dir: str, partition: int) -> Path:
    """``<data_dir>/featurizer/<stream_dir>/p<partition>.sqlite`` (``stream_dir`` is percent-quoted
    so any topic / client id makes one safe directory name)."""
    return Path(data_dir) / "featurizer" / quote(stream_dir, safe="._-[]") / f"p{int(partition)}.sqlite"


class FeatureCache:
    """One partition's cache; implements ``model.CacheView`` (and ``core.BulkCacheView``).
    Single-threaded use.

    ``identity`` (e.g. topic, partition, client) is written on first open and must match on
    every later open: a cache file never silently serves another partition or site.
    """

    def __init__(self, path: str | Path, identity: Mapping[str, str] | None = None, *,
                 synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self.synchronous = synchronous
        self._db = open_cache_db(self.path, synchronous, identity or {})
        self._samples = SampleTable(self._db)
        self._tombstones = TombstoneTable(self._db)
        self._events = EventTable(self._db)
        self._outbox = Outbox(self._db, synchronous)

    @classmethod
    def open_partition(cls, data_dir: str | Path, stream_dir: str, partition: int,
                       identity: Mapping[str, str] | None = None, *, synchronous: str = "FULL") -> FeatureCache:
        """The cache file of one by-head partition (created empty if absent)."""
        ident = {"stream_dir": stream_dir, "partition": str(int(partition)), **dict(identity or {})}
        return cls(cache_path(data_dir, stream_dir, partition), ident, synchronous=synchronous)

    # ------------------------------------------------------------------ CacheView: what the core reads
    def get_sample(self, head_id: str, sample_id: str) -> CachedSample | None:
        return self._samples.get(head_id, sample_id)

    def get_samples(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], CachedSample]:
        """The cached ones of many (head, sample) keys in few queries (``core.BatchView``)."""
        return self._samples.get_many(keys)

    def subject_samples(self, head_id: str, subject_id: str) -> list[CachedSample]:
        """The subject's cached samples in one head, ordered by sample id."""
        return self._samples.of_subject(head_id, subject_id)

    def get_head(self, head_id: str) -> HeadInfo | None:
        return self._samples.head(head_id)

    def tombstones(self, head_id: str, kind: str, id_: str, subject_id: str) -> list[Tombstone]:
        """The tombstones of (head, kind, id, subject), one per client ("" first)."""
        return self._tombstones.of(head_id, kind, id_, subject_id)

    def get_tombstones(self, names: Iterable[TombName]) -> dict[TombName, list[Tombstone]]:
        """The tombstones of many (head, kind, id, subject) names in few queries (``core.BatchView``)."""
        return self._tombstones.of_many(names)

    def expired_tombstones(self, before_us: int, limit: int) -> list[TombstoneKey]:
        """Keys of up to ``limit`` tombstones dated before ``before_us`` (oldest first)."""
        return self._tombstones.expired(before_us, limit)

    def get_events(self, keys: Iterable[EventKey]) -> dict[EventKey, EventMark]:
        """The event-id marks of many (head, event id) keys (``core.BatchView``)."""
        return self._events.get_many(keys)

    def get_event(self, head_id: str, event_id: str) -> EventMark | None:
        return self._events.get_many([(head_id, event_id)]).get((head_id, event_id))

    def expired_events(self, before_us: int, limit: int) -> list[EventKey]:
        """Up to ``limit`` marks dated before ``before_us`` whose sample is not cached (:class:`EventTable`)."""
        return self._events.expired(before_us, limit)

    def all_events(self) -> list[EventMark]:
        """Every event-id mark (a seed of the changelog; tests)."""
        return self._events.all()

    # ------------------------------------------------------------------ whole contents (seeds, audits, tests)
    def all_samples(self) -> list[CachedSample]:
        """Every cached sample, by (head, sample) (a seed of the changelog)."""
        return self._samples.all()

    def samples(self, head_id: str) -> list[CachedSample]:
        """Every cached sample of a head, ordered by sample id (audits, retrain references)."""
        return self._samples.of_head(head_id)

    def all_tombstones(self) -> list[Tombstone]:
        """Every tombstone (a seed of the changelog; tests)."""
        return self._tombstones.all()

    def heads(self) -> list[HeadInfo]:
        return self._samples.heads()

    def count(self, head_id: str | None = None) -> int:
        """Cached samples (in one head, or all)."""
        return self._samples.count(head_id)

    def pending_outbox(self) -> list[OutboxRow]:
        """Messages written but not yet acknowledged, in write order."""
        return self._outbox.pending()

    def ack_outbox(self, seqs: Iterable[int]) -> None:
        """Forget outbox rows the broker acknowledged (:meth:`Outbox.ack`)."""
        self._outbox.ack(seqs)

    # ------------------------------------------------------------------ position and routing state
    @property
    def applied_offset(self) -> int:
        """Last by-head offset whose outcome is in this file; -1 for a fresh cache."""
        row = self._db.execute("SELECT applied_offset FROM progress WHERE id = 0").fetchone()
        return -1 if row is None else int(row[0])

    @property
    def topic_id(self) -> str:
        """Id of the input (by-head) topic this cache was built from ("" if never recorded)."""
        return read_meta(self._db, "topic_id")

    def bind_topic_id(self, topic_id: str) -> None:
        """Record the topic incarnation this cache follows (once; a different id is an error)."""
        if topic_id and self.topic_id != topic_id:
            check_meta(self._db, self.path, {"topic_id": topic_id})

    @property
    def origin_topic_id(self) -> str:
        """Id of the requests topic the origin offsets belong to ("" if never recorded)."""
        return read_meta(self._db, "origin_topic_id")

    @property
    def route_partitions(self) -> int:
        """The by-head partition count this cache's heads were routed by (0: unknown)."""
        return int(read_meta(self._db, "route_partitions") or 0)

    def bind_routing(self, origin_topic_id: str, route_partitions: int) -> None:
        """Record the requests topic incarnation and the by-head partition count the routing
        state belongs to (once; a different value is an error: check before binding)."""
        wanted = {"route_partitions": str(int(route_partitions))}
        if origin_topic_id:
            wanted["origin_topic_id"] = origin_topic_id
        check_meta(self._db, self.path, wanted)

    def origin_offsets(self) -> dict[int, int]:
        """Requests partition -> the last origin offset judged from it."""
        return {int(p): int(o) for p, o in self._db.execute("SELECT partition, offset FROM origins").fetchall()}

    @property
    def lineage(self) -> str:
        """This cache's lineage id: the changelog batches it wrote carry it (created on first use)."""
        return self.local_position().lineage

    @property
    def generation(self) -> int:
        """Changelog generation of the last batch written into the outbox (0: none)."""
        return self.local_position().generation

    def local_position(self) -> LocalPosition:
        """(applied offset, lineage, generation), for :func:`resume_plan`."""
        row = self._db.execute("SELECT lineage, generation FROM lineage WHERE id = 0").fetchone()
        if row is None:
            with Transaction(self._db):
                self._db.execute("INSERT OR IGNORE INTO lineage (id, lineage, generation) VALUES (0, ?, 0)",
                                 (uuid.uuid4().hex,))
            row = self._db.execute("SELECT lineage, generation FROM lineage WHERE id = 0").fetchone()
        return LocalPosition(self.applied_offset, str(row[0]), int(row[1]))

    # ------------------------------------------------------------------ transactions
    def commit_batch(self, mutations: CacheMutations, messages: Iterable[OutMessage], last_offset: int,
                     generation: int | None = None, origins: Mapping[int, int] | None = None) -> list[int]:
        """ONE transaction: apply the cache mutations, append ``messages`` to the outbox, record
        ``last_offset``, the new last ``origins`` offsets (requests partition -> offset) and the
        changelog ``generation`` the messages carry, if any. Returns the outbox sequence numbers
        (for :meth:`ack_outbox`)."""
        last_offset = int(last_offset)
        self.local_position()  # the lineage row exists
        with Transaction(self._db):
            current = self.applied_offset
            if last_offset <= current:
                raise CacheError(f"{self.path}: batch ends at offset {last_offset}, cache already at {current}")
            self._samples.put_heads(mutations.put_heads, replace=True)
            self._samples.drop(mutations.drop_samples)
            self._samples.put(mutations.put_samples, replace=True)
            self._tombstones.drop(mutations.drop_tombstones)
            self._tombstones.put(mutations.put_tombstones)
            self._events.drop(mutations.drop_events)
            self._events.put(mutations.put_events)
            seqs = self._outbox.append(messages)
            self._db.execute(
                "INSERT INTO progress (id, applied_offset) VALUES (0, ?) "
                "ON CONFLICT (id) DO UPDATE SET applied_offset = excluded.applied_offset", (last_offset,))
            self._put_origins(origins or {})
            if generation is not None:
                self._db.execute("UPDATE lineage SET generation = ? WHERE id = 0", (int(generation),))
        return seqs

    def replace_outbox(self, messages: Iterable[OutMessage], generation: int) -> list[int]:
        """ONE transaction: the outbox becomes ``messages`` (a changelog seed that includes what was
        pending) and the changelog generation ``generation``."""
        self.local_position()
        with Transaction(self._db):
            self._outbox.clear()
            seqs = self._outbox.append(messages)
            self._db.execute("UPDATE lineage SET generation = ? WHERE id = 0", (int(generation),))
        return seqs

    def _put_origins(self, origins: Mapping[int, int]) -> None:
        self._db.executemany(
            "INSERT INTO origins (partition, offset) VALUES (?, ?) "
            "ON CONFLICT (partition) DO UPDATE SET offset = excluded.offset",
            [(int(p), int(o)) for p, o in origins.items()])

    def replace_all(self, samples: Iterable[CachedSample], heads: Iterable[HeadInfo], position: Position,
                    tombstones: Iterable[Tombstone] = (), events: Iterable[EventMark] = ()) -> None:
        """ONE transaction: the cache becomes a copy rebuilt from the changelog (contents and tombstones, and the
        ``position``'s offset, topic id, generation and routing state) with a NEW lineage and an
        empty outbox: whatever this file held is superseded (its unsent batch, if any, never
        reached Kafka)."""
        applied_offset, generation = position.applied_offset, position.generation
        with Transaction(self._db):
            for table in ("samples", "heads", "outbox", "progress", "lineage", "origins", "tombstones", "events"):
                self._db.execute(f"DELETE FROM {table}")
            self._db.execute("DELETE FROM meta WHERE key IN ('topic_id', 'origin_topic_id', 'route_partitions')")
            for key, value in (("topic_id", position.topic_id), ("origin_topic_id", position.origin_topic_id),
                               ("route_partitions", str(position.route_partitions or ""))):
                if value:
                    self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
            self._put_origins(position.origins)
            self._samples.put_heads(heads, replace=False)
            self._samples.put(samples, replace=False)
            self._tombstones.put(tombstones)
            self._events.put(events)
            if applied_offset >= 0:
                self._db.execute("INSERT INTO progress (id, applied_offset) VALUES (0, ?)", (int(applied_offset),))
            self._db.execute("INSERT INTO lineage (id, lineage, generation) VALUES (0, ?, ?)",
                             (uuid.uuid4().hex, int(generation)))

    # ------------------------------------------------------------------ lifecycle
    def purge_deleted(self) -> None:
        """Erasure: checkpoint the WAL into the database file and truncate it, so the pages of
        deleted rows (zeroed by ``secure_delete``) replace the old ones on disk and no copy stays
        in the WAL (docs/erasure.md)."""
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> FeatureCache:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<FeatureCache {self.path}>"
