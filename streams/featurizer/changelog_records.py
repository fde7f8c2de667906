"""The records of the feature cache's changelog (the ``featurizer-cache`` topic), pure: keys,
value codecs, the ``position`` record and the txn framing.

Partition p of ``featurizer-cache`` holds the cache of partition p of the by-head topic (the
featurizer's input, ``model.Router``), so any featurizer on any host rebuilds a partition's cache
from Kafka. Its keys and values (``sample/``, ``head/``, ``tomb/``, ``txn/``, ``position/``,
``delivered/``; compaction keeps the last value of each) are tabled in docs/featurizer.md, "The
cache changelog"; a batch's :class:`Position` record is its commit point.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson

from unlearn.ledger.quantization import QMAX
from unlearn.streams.featurizer.batch_io import OutMessage
from unlearn.streams.featurizer.cache_view import CachedSample, HeadInfo
from unlearn.streams.featurizer.tombstones import Tombstone, TombstoneKey

__all__ = [
    "PHASE_CHANGELOG",
    "PHASE_OUTPUT",
    "ChangelogError",
    "OpenSample",
    "Position",
    "Record",
    "SealSample",
    "decode_head",
    "decode_headers",
    "decode_sample",
    "decode_tombstone",
    "decode_txn",
    "delivered_key",
    "encode_head",
    "encode_headers",
    "encode_sample",
    "encode_tombstone",
    "encode_txn",
    "head_key",
    "parse_sample_key",
    "parse_tombstone_key",
    "position_key",
    "sample_key",
    "tombstone_key",
    "txn_key",
]

PHASE_CHANGELOG = 0
"""Outbox phase of the txn pieces and the position record: acknowledged before anything else."""
PHASE_OUTPUT = 1
"""Outbox phase of the downstream messages and the sample/head records."""

_POSITION_FORMAT = "unlearn.featurizer-position/v2"
_SAMPLE_MAGIC = b"ULFS\x02"  # q as i32 (|q| <= 2^30 always): what this writes
_SAMPLE_MAGIC_V1 = b"ULFS\x01"  # q as i64: records written before issue 29, still read
_TXN_MAGIC = b"ULFT\x01"
_TXN_MAGIC_HEADERS = b"ULFT\x02"  # as v1, each message followed by its headers (only when one has some)
_NONE = 0xFFFFFFFF

Record = tuple[bytes, bytes | None]  # (key, value); value None is a tombstone
#: ``seal(head, sample, plain_record) -> sealed_record`` (streams/featurizer/erasure.py)
SealSample = Callable[[str, str, bytes], bytes]
#: ``open(head, sample, record) -> plain_record`` (plaintext records pass through)
OpenSample = Callable[[str, str, bytes], bytes]


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


def parse_tombstone_key(key: bytes) -> TombstoneKey:
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
        head_id, kind, id_, subject_id, client_id = parse_tombstone_key(key)
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


def parse_sample_key(key: bytes) -> tuple[str, str]:
    rest = key.decode()[len("sample/"):]
    n, _, tail = rest.partition(":")
    return tail[: int(n)], tail[int(n) + 1:]


# --------------------------------------------------------------------------- values
def encode_sample(s: CachedSample) -> bytes:
    """``ULFS\\x02`` + u32 header length + JSON header + q (int32 LE) [+ label vector (int64 LE)];
    ChangelogError if a |q| exceeds 2^30 (never a silent wrap)."""
    vec = not isinstance(s.label, int)
    q64 = np.asarray(s.q)
    if q64.size and (q64.max() > QMAX or q64.min() < -QMAX):
        raise ChangelogError(f"sample ({s.head_id!r}, {s.sample_id!r}): |q| exceeds 2^30, not a quantizer's value")
    q = np.ascontiguousarray(q64, dtype="<i4")
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
    """Inverse of :func:`encode_sample`, and of the ``ULFS\\x01`` records of older changelogs (q as
    int64 LE); q is int64 either way. ChangelogError on a malformed record or |q| > 2^30."""
    try:
        if raw.startswith(_SAMPLE_MAGIC):
            qsize = 4
        elif raw.startswith(_SAMPLE_MAGIC_V1):
            qsize = 8
        else:
            raise ValueError("not a cached-sample record")
        (n,) = struct.unpack_from("<I", raw, len(_SAMPLE_MAGIC))
        at = len(_SAMPLE_MAGIC) + 4
        h = orjson.loads(raw[at: at + n])
        at += n
        d, c = int(h["d"]), int(h["label_width"])
        if d < 1 or c < 0 or len(raw) != at + qsize * d + 8 * c:
            raise ValueError("truncated cached-sample record")
        q = np.frombuffer(raw, dtype=f"<i{qsize}", count=d, offset=at).astype(np.int64)
        if q.max() > QMAX or q.min() < -QMAX:
            raise ValueError("|q| exceeds 2^30, not a value the quantizer produces")
        label: int | np.ndarray = (int(h["label"]) if h["label"] is not None else
                                   np.frombuffer(raw, dtype="<i8", count=c, offset=at + qsize * d).astype(np.int64))
        return CachedSample(head_id, sample_id, str(h["subject"]), str(h["client"]), str(h["event"]), label, q,
                            int(h.get("t", 0)))
    except (ValueError, KeyError, TypeError, struct.error, orjson.JSONDecodeError) as exc:
        raise ChangelogError(f"bad sample record for ({head_id!r}, {sample_id!r}): {exc}") from None


def encode_head(h: HeadInfo) -> bytes:
    return orjson.dumps({"backbone": h.backbone, "input_kind": h.input_kind, "dim": h.dim,
                         "label_kind": h.label_kind, "label_width": h.label_width, "frac_bits": h.frac_bits,
                         "label_frac_bits": h.label_frac_bits})


def decode_head(head_id: str, raw: bytes) -> HeadInfo:
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
    partition count the heads were routed by (0: unknown); ``ahead``: offsets past
    ``applied_offset`` already judged (the delete lane, ``delete_lane.py``; written only when
    there are some, so a position without them is the bytes it always was)."""

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
    ahead: tuple[int, ...] = ()

    def encode(self) -> bytes:
        fields = {"format": _POSITION_FORMAT, "partition": self.partition,
                  "applied_offset": self.applied_offset, "topic": self.topic,
                  "topic_id": self.topic_id, "lineage": self.lineage, "generation": self.generation,
                  "pieces": self.pieces, "sha256": self.sha256,
                  "origins": {str(p): int(o) for p, o in sorted(self.origins.items())},
                  "origin_topic_id": self.origin_topic_id, "route_partitions": self.route_partitions}
        if self.ahead:
            fields["ahead"] = sorted(int(o) for o in self.ahead)
        return orjson.dumps(fields)

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
                       int(d["route_partitions"]), tuple(sorted(int(o) for o in d.get("ahead", ()))))
        except (KeyError, TypeError, ValueError, AttributeError, orjson.JSONDecodeError) as exc:
            raise ChangelogError(f"unreadable position record: {exc}") from None


# --------------------------------------------------------------------------- txn framing
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
