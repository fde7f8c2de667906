"""Event-id memory: one event id of a head means one request (docs/featurizer.md, "Event ids").

Receipts, dead letters and an at-least-once producer's retries name a request by its event id,
so the featurizer remembers, per head, the meaning of every request that took effect (an accepted
add, a delete applied or tombstoned) under its event id, as a :func:`request_fingerprint`:

- the same event id with the same meaning again is a **duplicate**: no effect, dead-lettered
  ``duplicate_event`` (an add of a sample still cached keeps its older reason, ``duplicate_add``);
- the same event id with another meaning is a **conflict**: refused, ``event_id_conflict``,
  whatever the partition, producer or time between.

The memory is cache state like tombstones: a ``events`` table next to them, the ``event/``
records of the ``featurizer-cache`` changelog, committed with its batch (so it survives restarts
and rebalances). A delete that removes a sample erases its add's fingerprint (``event_id_erased``
refuses the id for a retention from the delete). It is bounded: a mark is dropped once its event
time is older than the tombstone retention (``UNLEARN_TOMBSTONE_RETENTION_SECONDS``; 0 keeps marks
for ever); an
add's id stays taken while its sample is cached anyway, found through the samples' event ids
(:data:`CACHED`), so the verifier's rule on retained adds holds for ever. Nothing here touches
Kafka; :class:`EventTable` is the sqlite side, used by ``feature_cache.FeatureCache``.
"""

from __future__ import annotations

import hashlib
import sqlite3
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import orjson

from unlearn.features.contract import FeatureRejected
from unlearn.schemas.envelope import Request
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.request_inputs import FeaturesInput, ImageInput, SealedInput, TextInput

__all__ = [
    "CACHED",
    "ERASED",
    "EVENT_REASONS",
    "EVENTS_SCHEMA",
    "EventKey",
    "EventMark",
    "EventTable",
    "EventView",
    "decode_event",
    "encode_event",
    "event_key",
    "event_value",
    "expired_events",
    "judge_event",
    "legacy_fingerprint",
    "named_events",
    "open_event",
    "parse_event_key",
    "request_fingerprint",
]

#: (head, event id): the scope of an event id is its head (receipts name both).
EventKey = tuple[str, str]

ERASED = bytes(32)
"""The fingerprint of an add whose sample was deleted: the id stays taken, the hash of its input
does not outlive the sample (docs/erasure.md)."""
CACHED = b"\xff" * 32
"""The fingerprint of an add known only as a cached sample (its mark expired): the id is taken by
that add of that sample; any other request under it is a conflict."""

EVENT_REASONS: dict[str, str] = {
    "duplicate_event": "a request whose (head, event_id) already took effect with the same meaning (op, client, "
                       "subject, sample, label, input): a resend, without effect and without a receipt of its own",
    "event_id_conflict": "a request whose (head, event_id) already took effect with another meaning: an event id "
                         "names one request",
    "event_id_erased": "a request whose (head, event_id) named an add since deleted: the add's meaning was erased "
                       "with its sample, so the id is refused whatever the request says",
}
"""Reason codes of the event-id memory (part of ``FEATURIZER_REASONS``)."""


@dataclass(frozen=True, slots=True)
class EventMark:
    """What a head remembers of an event id: the meaning's fingerprint, the request's judged event
    time (for expiry) and, for an add, the sample whose caching keeps the mark."""

    head_id: str
    event_id: str
    fingerprint: bytes  # 32 bytes, request_fingerprint
    event_us: int
    sample_id: str = ""  # an add's sample ("" for deletes)

    @property
    def key(self) -> EventKey:
        return (self.head_id, self.event_id)


def _input_meaning(inp: object) -> list[object]:
    """An input as what it means to the head: features as float64 (a '<f4' vector and the JSON of
    the same values are one input; -0.0 is 0.0), text, image bytes."""
    if isinstance(inp, FeaturesInput):
        return ["features", _feature_bytes(inp).hex()]
    if isinstance(inp, TextInput):
        return ["text", inp.text]
    if isinstance(inp, ImageInput):
        return ["image", hashlib.sha256(inp.data).hexdigest()]
    if isinstance(inp, SealedInput):  # never judged sealed: opened first (transit_open.open_sealed)
        return ["sealed", inp.key_id, inp.ciphertext.hex()]
    return [None]


def _feature_bytes(inp: FeaturesInput) -> bytes:
    values = np.asarray(inp.values, dtype=np.float64) + 0.0  # -0.0 + 0.0 == +0.0
    return values.astype("<f8", copy=False).tobytes()


def _meaning(r: Request, version: str) -> list[object]:
    label: object = list(r.label) if isinstance(r.label, tuple) else r.label
    return [version, r.op, r.head_id, r.client_id, r.subject_id, r.sample_id, label]


def request_fingerprint(r: Request) -> bytes:
    """SHA-256 of a request's meaning: op, head, client, subject, sample, label and (opened) input;
    not its ``ts``, signature headers or transport, so a producer's resend has the same one.
    Features are hashed as their float64 bytes after the meaning's JSON, which names their length
    (v2); every other input as in :func:`legacy_fingerprint`. Why: the v1 hex of a d = 768 vector
    doubled the bytes hashed and cost ~30 µs per add (bench/results/pipeline_bench.md)."""
    if not isinstance(r.input, FeaturesInput):
        return legacy_fingerprint(r)
    raw = _feature_bytes(r.input)
    h = hashlib.sha256(orjson.dumps([*_meaning(r, "unlearn.event/v2"), ["features", len(raw)]]))
    h.update(raw)
    return h.digest()


def legacy_fingerprint(r: Request) -> bytes:
    """The v1 fingerprint, SHA-256 of the meaning's JSON with features as float64 hex: what marks
    written before v2 hold, so a resend of an event judged then is still known as one."""
    return hashlib.sha256(orjson.dumps([*_meaning(r, "unlearn.event/v1"),
                                        _input_meaning(r.input) if r.input is not None else None])).digest()


# --------------------------------------------------------------------------- judging
class EventView(Protocol):
    """What judging an event id asks of the batch's view of the cache (``cache_view.Overlay``)."""

    def get_event(self, head_id: str, event_id: str) -> EventMark | None: ...

    def get_sample(self, head_id: str, sample_id: str) -> object | None: ...


def named_events(reqs: Iterable[Request | InvalidRequest]) -> list[EventKey]:
    """The (head, event id) pairs of a batch's valid requests (the marks they look up)."""
    return [(r.head_id, r.event_id) for r in reqs if isinstance(r, Request)]


def expired_events(cache: object, horizon_us: int | None, limit: int) -> tuple[EventKey, ...]:
    """Up to ``limit`` marks dated before ``horizon_us`` (the tombstone retention's; None: none
    expire), from a cache that lists them."""
    lister = getattr(cache, "expired_events", None)
    if horizon_us is None or lister is None:
        return ()
    return tuple(lister(horizon_us, limit))


def judge_event(r: Request, view: EventView) -> bytes:
    """The request's meaning fingerprint, once checked against what its event id already meant in
    its head: raises :class:`FeatureRejected` ``event_id_erased``, ``event_id_conflict`` (another
    meaning) or ``duplicate_event`` (the same: a resend). An add of a sample still cached goes on
    to be refused ``duplicate_add``, as every add of a cached sample is (also when only the cached
    sample still says which add took the id: a :data:`CACHED` mark)."""
    fp = request_fingerprint(r)
    seen = view.get_event(r.head_id, r.event_id)
    if seen is None:
        return fp
    if seen.fingerprint == ERASED:
        raise FeatureRejected("event_id_erased",
                              f"event {r.event_id!r} of head {r.head_id!r} named an add whose sample was deleted "
                              "since: its meaning was erased with it, so no request may reuse the id")
    same = (seen.fingerprint == fp or (seen.fingerprint == CACHED and r.op == "add" and r.sample_id == seen.sample_id)
            or (isinstance(r.input, FeaturesInput) and seen.fingerprint == legacy_fingerprint(r)))
    if not same:
        raise FeatureRejected("event_id_conflict",
                              f"event {r.event_id!r} of head {r.head_id!r} already took effect as another request "
                              f"(dated {seen.event_us / 1e6:.6f}): an event id names one request")
    if r.op == "add" and r.sample_id is not None and view.get_sample(r.head_id, r.sample_id) is not None:
        return fp
    raise FeatureRejected("duplicate_event",
                          f"event {r.event_id!r} of head {r.head_id!r} already took effect with this meaning "
                          f"(dated {seen.event_us / 1e6:.6f}): a resend, without effect")


# --------------------------------------------------------------------------- changelog records
def event_key(key: EventKey) -> bytes:
    """Changelog key of a mark: ``event/<len(head)>:<head>/<event id>``."""
    head_id, event_id = key
    return f"event/{len(head_id)}:{head_id}/{event_id}".encode()


def parse_event_key(key: bytes) -> EventKey:
    """Inverse of :func:`event_key`; ValueError when it is not one."""
    rest = key.decode()[len("event/"):]
    n, _, rest = rest.partition(":")
    size = int(n)
    head_id, sep, event_id = rest[:size], rest[size:size + 1], rest[size + 1:]
    if sep != "/" or not head_id or not event_id:
        raise ValueError("bad event key")
    return head_id, event_id


def encode_event(m: EventMark) -> bytes:
    """The JSON value of a mark's record."""
    return orjson.dumps({"fp": m.fingerprint.hex(), "t": int(m.event_us), "sample": m.sample_id})


def decode_event(key: bytes, raw: bytes) -> EventMark:
    """An ``event/`` record back to its mark; ValueError when it does not decode."""
    head_id, event_id = parse_event_key(key)
    d = orjson.loads(raw)
    fp = bytes.fromhex(d["fp"])
    if len(fp) != 32:
        raise ValueError("fingerprint is not 32 bytes")
    return EventMark(head_id, event_id, fp, int(d["t"]), str(d.get("sample", "")))


SEALED_EVENT_MAGIC = b"ULEV\x01"
"""An add's mark on the changelog, sealed: magic, i64 event time, u16 length + the sample id
(UTF-8), then the JSON value sealed as the sample's own record (its per-sample key)."""


def event_value(m: EventMark, seal: Callable[[str, str, bytes], bytes] | None) -> bytes:
    """A mark's changelog value: an add's fingerprint (a hash of its input) is sealed under its
    sample's key when rows are sealed, so a destroyed key leaves nothing of the input in a log that
    is never compacted (tansu); delete marks and erased ones are plain."""
    plain = encode_event(m)
    if seal is None or not m.sample_id or m.fingerprint == ERASED:
        return plain
    sid = m.sample_id.encode()
    return SEALED_EVENT_MAGIC + struct.pack("<qH", m.event_us, len(sid)) + sid + seal(m.head_id, m.sample_id, plain)


def open_event(key: bytes, raw: bytes, open_sample: Callable[[str, str, bytes], bytes] | None) -> EventMark:
    """A mark back from its changelog value (:func:`event_value`); ValueError when it does not
    decode. A sealed mark whose key is gone is an erased one: the id stays taken."""
    if not raw.startswith(SEALED_EVENT_MAGIC):
        return decode_event(key, raw)
    head_id, event_id = parse_event_key(key)
    at = len(SEALED_EVENT_MAGIC)
    t, n = struct.unpack_from("<qH", raw, at)
    sample_id = raw[at + 10: at + 10 + n].decode()
    if open_sample is None:
        raise ValueError(f"sealed event record {key[:200]!r} and no key store to open it")
    try:
        plain = open_sample(head_id, sample_id, raw[at + 10 + n:])
    except Exception:
        return EventMark(head_id, event_id, ERASED, t)
    return decode_event(key, plain)


# --------------------------------------------------------------------------- sqlite
EVENTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    head_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    fingerprint BLOB NOT NULL,
    event_us INTEGER NOT NULL,
    sample_id TEXT NOT NULL,
    PRIMARY KEY (head_id, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_by_time ON events (event_us);
CREATE INDEX IF NOT EXISTS samples_by_event ON samples (head_id, event_id);
"""


class EventTable:
    """Reads and writes of ``events`` on one connection (writes inside the caller's transaction)."""

    _COLUMNS = "head_id, event_id, fingerprint, event_us, sample_id"

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def get_many(self, keys: Iterable[EventKey]) -> dict[EventKey, EventMark]:
        """The marks of many (head, event id) keys, and for an id without one the cached sample
        whose add carries it (a :data:`CACHED` mark): two queries per head and 500 ids, each id a
        seek (the index named: sqlite chose to walk every sample of the head instead)."""
        by_head: dict[str, list[str]] = {}
        for head_id, event_id in set(keys):
            by_head.setdefault(head_id, []).append(event_id)
        out: dict[EventKey, EventMark] = {}
        for head_id, ids in by_head.items():
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                rows = self._db.execute(
                    f"SELECT {self._COLUMNS} FROM events WHERE head_id = ? AND event_id IN "
                    f"({','.join('?' * len(chunk))})", (head_id, *chunk)).fetchall()
                for row in rows:
                    m = _mark(row)
                    out[m.key] = m
                cached = self._db.execute(
                    f"SELECT event_id, event_us, sample_id FROM samples INDEXED BY samples_by_event "
                    f"WHERE head_id = ? AND event_id IN "
                    f"({','.join('?' * len(chunk))})", (head_id, *chunk)).fetchall()
                for event_id, event_us, sample_id in cached:
                    out.setdefault((head_id, str(event_id)),
                                   EventMark(head_id, str(event_id), CACHED, int(event_us), str(sample_id)))
        return out

    def expired(self, before_us: int, limit: int) -> list[EventKey]:
        """Up to ``limit`` marks dated before ``before_us``, oldest first (an index range)."""
        rows = self._db.execute("SELECT head_id, event_id FROM events WHERE event_us < ? ORDER BY event_us LIMIT ?",
                                (int(before_us), int(limit))).fetchall()
        return [(str(h), str(e)) for h, e in rows]

    def all(self) -> list[EventMark]:
        rows = self._db.execute(f"SELECT {self._COLUMNS} FROM events ORDER BY head_id, event_id").fetchall()
        return [_mark(r) for r in rows]

    def put(self, marks: Iterable[EventMark]) -> None:
        self._db.executemany(
            f"INSERT OR REPLACE INTO events ({self._COLUMNS}) VALUES (?, ?, ?, ?, ?)",
            [(m.head_id, m.event_id, m.fingerprint, int(m.event_us), m.sample_id) for m in marks])

    def drop(self, keys: Iterable[EventKey]) -> None:
        self._db.executemany("DELETE FROM events WHERE head_id = ? AND event_id = ?", list(keys))


def _mark(row: Mapping[int, object] | tuple[object, ...]) -> EventMark:
    head_id, event_id, fp, event_us, sample_id = row
    return EventMark(str(head_id), str(event_id), bytes(fp), int(event_us), str(sample_id))  # type: ignore[call-overload]
