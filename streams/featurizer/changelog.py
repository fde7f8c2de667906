"""The feature cache's changelog (the ``featurizer-cache`` topic): its records, pure, and
:class:`ChangelogReader`, which reads them back.

Partition p of ``featurizer-cache`` holds the cache of partition p of the by-head topic (the
featurizer's input, ``model.Router``), so any featurizer on any host rebuilds a partition's cache
from Kafka (docs/featurizer.md, "The cache changelog"). Keys (compaction keeps the last value of
each):

- ``sample/<head>/<sample>`` -> :func:`encode_sample` (subject, client, add event id, label, q as
  int64 LE); a tombstone (value None) when a delete removes the sample;
- ``head/<head>`` -> the head's first-add facts (JSON);
- ``tomb/<head>/<kind>/<id>/<subject>/<client>`` -> a delete's tombstone (JSON: event time in us,
  the delete's event id; ``tombstones.py``); a tombstone (value None) when it expires;
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
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import numpy as np
import orjson

from unlearn.infra.log_position import watermarks
from unlearn.infra.settings import Settings, consumer_config
from unlearn.infra.topic_reader import TopicReadError, read_range
from unlearn.streams.featurizer.model import CachedSample, CacheMutations, HeadInfo, OutMessage
from unlearn.streams.featurizer.tombstones import Tombstone, TombstoneKey

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
]

PHASE_CHANGELOG = 0
"""Outbox phase of the txn pieces and the position record: acknowledged before anything else."""
PHASE_OUTPUT = 1
"""Outbox phase of the downstream messages and the sample/head records."""

_POSITION_FORMAT = "unlearn.featurizer-position/v2"
_SAMPLE_MAGIC = b"ULFS\x01"
_TXN_MAGIC = b"ULFT\x01"
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
    """The sample/head records of a batch's cache mutations (drops are tombstones); sample values
    sealed with ``seal_sample`` when given (docs/erasure.md)."""
    out: list[Record] = [(head_key(h.head_id), _encode_head(h)) for h in mutations.put_heads]
    out += [(tombstone_key(k), None) for k in mutations.drop_tombstones]
    out += [(tombstone_key(t.key), encode_tombstone(t)) for t in mutations.put_tombstones]
    out += [(sample_key(h, s), None) for h, s in mutations.drop_samples]
    for s in mutations.put_samples:
        value = encode_sample(s)
        out.append((sample_key(s.head_id, s.sample_id),
                    value if seal_sample is None else seal_sample(s.head_id, s.sample_id, value)))
    return out


def _frame(b: bytes | None) -> bytes:
    return struct.pack("<I", _NONE) if b is None else struct.pack("<I", len(b)) + b


def encode_txn(records: Sequence[Record], messages: Sequence[OutMessage]) -> bytes:
    """A batch: its state records and its downstream messages, length-prefixed."""
    parts = [_TXN_MAGIC, struct.pack("<II", len(records), len(messages))]
    for k, v in records:
        parts += [_frame(k), _frame(v)]
    for m in messages:
        parts += [_frame(m.topic.encode()), _frame(m.key), _frame(m.value)]
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
        if not raw.startswith(_TXN_MAGIC):
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
            messages.append(OutMessage(topic.decode(), key, value))
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
            out += [OutMessage(x.topic, x.key, x.value, None, PHASE_OUTPUT) for x in messages]
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
    position: Position | None = None
    pending: list[OutMessage] = field(default_factory=list)
    pending_records: list[Record] = field(default_factory=list)  # the latest batch's sample/head records

    @property
    def empty(self) -> bool:
        return self.position is None


def _apply(folded: FoldedChangelog, key: bytes, value: bytes | None, raw: dict[tuple[str, str], bytes]) -> None:
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
    pos_key, done_key = position_key(partition), delivered_key(partition)
    for key, value in records:
        if key.startswith((b"sample/", b"head/", b"tomb/")):
            _apply(folded, key, value, raw)
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
        _apply(folded, key, value, raw)
    for (head_id, sample_id), value in raw.items():
        plain = value if open_sample is None else open_sample(head_id, sample_id, value)
        folded.samples[(head_id, sample_id)] = decode_sample(head_id, sample_id, plain)
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
                       tombstones: Iterable[Tombstone] = ()) -> CacheMutations:
    """A whole cache as one batch of puts (the txn of a ``seed``)."""
    return CacheMutations(put_samples=tuple(samples), put_heads=tuple(heads), put_tombstones=tuple(tombstones))


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
