"""Routing requests by head (the ``<requests>.by-head`` repartition topic; docs/featurizer.md,
"Routing"). The :class:`Router` forwards every ``requests`` record, value, key, headers and
timestamp unchanged, to the by-head partition its head id hashes to
(``common.by_head.head_partition``, which the ledger and the SDK use too), so a delete meets
its add in one partition's cache whatever partitions the producers chose. Each forward carries
headers naming its origin (:data:`ORIGIN_HEADER`) and the origin offset this router session
forwarded before it to the same partition (:data:`PREVIOUS_HEADER`). The router is at-least-once
(it commits after delivery); the featurizer drops the copies exactly (:func:`admit_routed`).
Pure but for :meth:`Router.forward`, which sends through the featurizer's producer
(``delivery.Delivery``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from unlearn.common.by_head import head_partition
from unlearn.schemas.envelope import ID_CHARS, ID_MAX_CHARS, is_valid_id
from unlearn.schemas.source_id import format_source_id, parse_source
from unlearn.streams.featurizer.batch_io import InMessage, Origin

if TYPE_CHECKING:
    from unlearn.runtime.delivery import Acks
    from unlearn.streams.featurizer.delivery import Delivery

__all__ = [
    "ORIGIN_HEADER",
    "PREVIOUS_HEADER",
    "Headers",
    "routing_head",
    "might_delete",
    "route_partition",
    "read_origin",
    "RouterSession",
    "Router",
    "Admitted",
    "admit_routed",
]


ORIGIN_HEADER = "unlearn.origin"
"""Header of a routed record: ``"<stream>/<partition>@<offset>"``, its place in ``requests``."""


PREVIOUS_HEADER = "unlearn.origin-previous"
"""Header of a routed record: the origin offset (decimal) of the record forwarded before it from
the same requests partition to the same by-head partition in this router session; absent for
the session's first."""


Headers = list[tuple[str, bytes | None]]


_WS = rb"[ \t\n\r]*"


_PREFIX = re.compile(  # "{" and members with scalar values, up to the head_id key
    _WS + rb"\{" + _WS + rb'(?:"[^"\\]*"' + _WS + rb":" + _WS
    + rb'(?:"[^"\\]*"|-?[0-9][0-9eE.+-]*|true|false|null)' + _WS + rb"," + _WS + rb")*")


_HEAD_VALUE = re.compile(_WS + rb':' + _WS + rb'"([' + ID_CHARS.encode() + rb"]{1," + str(ID_MAX_CHARS).encode()
                         + rb'})"' + _WS + rb"[,}]")


_HEAD_KEY = b'"head_id"'


_FAST_SCAN_BYTES = 1024
"""How far into a request the cheap head lookup looks (the SDK writes ``head_id`` fourth)."""


def _head_fast(value: bytes) -> str | None:
    """The head id without parsing the whole request, when that is certain: it is a member of
    the top-level object preceded only by members with scalar values, and neither a backslash
    (an escaped spelling of the key) nor a second ``"head_id"`` occurs anywhere. For any JSON
    document this is the head :func:`routing_head`'s full parse finds; None: not certain."""
    at = value.find(_HEAD_KEY, 0, _FAST_SCAN_BYTES)
    if at < 0 or _PREFIX.fullmatch(value, 0, at) is None:
        return None
    m = _HEAD_VALUE.match(value, at + len(_HEAD_KEY))
    if m is None or b"\\" in value or value.find(_HEAD_KEY, at + 1) >= 0:
        return None
    return m.group(1).decode("ascii")


def routing_head(value: bytes | None) -> str | None:
    """The head id a request names, if it names a usable one (an id string in a JSON object),
    else None. Only the head is read: validating the request is the featurizer's job, and it
    dead-letters what is invalid with the reason. Cheap for what producers send (the head id
    before the input: :func:`_head_fast`, no parse of the features); anything else is parsed in
    full. The one difference from a full parse: a record that is not valid JSON after such a
    head id is routed by it (and dead-lettered there, ``not_json``) instead of by its origin."""
    if value is None:
        return None
    if (fast := _head_fast(value)) is not None:
        return fast
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    head = d.get("head_id") if type(d) is dict else None
    return head if is_valid_id(head) else None


def might_delete(value: bytes | None) -> bool:
    """A cheap hint that a record is a delete or delete_subject: its bytes hold ``"delete``
    (the start of either op's JSON string). Only the batch window uses it (a delete closes it
    early, docs/featurizer.md, "The batch window"); a wrong answer costs a smaller batch or a
    longer wait, never a decision, so no parse (an add is ~100 us of JSON)."""
    return value is not None and b'"delete' in value


def route_partition(value: bytes | None, origin_partition: int, partitions: int) -> int:
    """Where a request goes: its head's partition; a record with no readable head (bad JSON, no
    head id) goes to ``origin_partition`` modulo the count, so that it still reaches the
    featurizer's dead-letter path, in order with its neighbours."""
    head = routing_head(value)
    if head is None:
        return origin_partition % partitions
    return head_partition(head, partitions)


def read_origin(headers: Sequence[tuple[str, bytes | None]] | None, stream: str) -> Origin | None:
    """The origin a routed record's headers name (the last header of each name wins), or None if
    they name none, or one of another stream (then the record is its own origin)."""
    origin = previous = None
    for name, value in headers or ():
        if name == ORIGIN_HEADER:
            origin = value
        elif name == PREVIOUS_HEADER:
            previous = value
    try:
        parsed = parse_source(origin.decode()) if origin is not None else None
        prev = int(previous) if previous is not None else None
    except (UnicodeDecodeError, ValueError):
        return None
    if parsed is None or parsed[0] != stream or (prev is not None and not -1 < prev < parsed[2]):
        return None
    return Origin(parsed[1], parsed[2], prev)


class RouterSession:
    """What one router session forwarded: per (requests partition, by-head partition), the last
    origin offset, which becomes the next record's :data:`PREVIOUS_HEADER`.

    A session of a requests partition starts when it is assigned (:meth:`reset`): the router
    then resumes at the committed offset and knows nothing earlier.
    """

    def __init__(self, stream: str, partitions: int) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        self.stream = stream
        self.partitions = partitions
        self._last: dict[tuple[int, int], int] = {}

    def reset(self, origin_partition: int) -> None:
        """A new session for ``origin_partition`` (assigned, or assigned again)."""
        self._last = {k: v for k, v in self._last.items() if k[0] != origin_partition}

    def route(self, value: bytes | None, origin_partition: int, origin_offset: int,
              headers: Sequence[tuple[str, bytes | None]] | None = None) -> tuple[int, Headers]:
        """(by-head partition, headers) for one requests record, forwarded in offset order. The
        record's own headers are kept, except any that claim to be ours (an upstream app cannot
        forge an origin)."""
        target = route_partition(value, origin_partition, self.partitions)
        out: Headers = [(k, v) for k, v in headers or () if k not in (ORIGIN_HEADER, PREVIOUS_HEADER)]
        out.append((ORIGIN_HEADER, format_source_id(origin_partition, origin_offset, self.stream).encode()))
        previous = self._last.get((origin_partition, target))
        if previous is not None:
            out.append((PREVIOUS_HEADER, str(previous).encode()))
        self._last[(origin_partition, target)] = origin_offset
        return target, out


class Router:
    """The featurizer's router: forwards ``requests`` records to their heads' by-head partitions
    (value, key, headers and timestamp kept, origin headers added) through ``delivery``."""

    def __init__(self, origin_stream: str, by_head_topic: str, partitions: int, delivery: Delivery) -> None:
        self.session = RouterSession(origin_stream, partitions)
        self.by_head_topic = by_head_topic
        self.delivery = delivery

    def reset(self, origin_partition: int) -> None:
        """``origin_partition`` was assigned: a new router session for it."""
        self.session.reset(origin_partition)

    def forward(self, records: Sequence[Any]) -> tuple[dict[int, int], Acks | None]:
        """Forward consumed requests records in offset order; return requests partition -> last
        offset forwarded, and the forwards' acks to await before committing it (DeliveryError:
        the next session forwards them again)."""
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

        if not records:
            return {}, None
        sends: list[dict[str, Any]] = []
        last: dict[int, int] = {}
        for m in sorted(records, key=lambda r: (r.partition(), r.offset())):
            p, off = m.partition(), m.offset()
            target, headers = self.session.route(m.value(), p, off, m.headers())
            kind, ts = m.timestamp()
            send = {"topic": self.by_head_topic, "value": m.value(), "key": m.key(), "partition": target,
                    "headers": headers}
            if kind != TIMESTAMP_NOT_AVAILABLE and ts > 0:
                send["timestamp"] = ts
            sends.append(send)
            last[p] = off
        return last, self.delivery.send(sends)


@dataclass
class Admitted:
    """What :func:`admit_routed` lets through: the records to judge, the new last origin offset
    of each requests partition they came from, and how many were dropped as re-forwarded copies
    (``reforwarded``) or as arriving after a predecessor that never did (``gaps``)."""

    messages: list[InMessage]
    origin_offsets: dict[int, int] = field(default_factory=dict)
    reforwarded: int = 0
    gaps: int = 0


def admit_routed(messages: Sequence[InMessage], origins: Mapping[int, int]) -> Admitted:
    """Drop the router's re-forwarded copies, exactly. ``origins`` is the last origin offset
    judged per requests partition (durable with the cache).

    The router forwards each requests partition in offset order and commits after delivery, so
    a copy always carries an origin offset at or below the last one judged from its partition:
    it is dropped (``reforwarded``). A record whose ``previous`` (the record its router session
    forwarded before it to this partition) is beyond the last one judged arrives after a
    delivery that failed: its session died before committing, so the next session forwards it
    again after the missing one; it is dropped now (``gaps``). A record with no origin (nobody
    routed it) is its own origin and always judged."""
    last = dict(origins)
    out = Admitted([])
    for m in messages:
        o: Origin | None = m.origin
        if o is not None:
            seen = last.get(o.partition, -1)
            if o.offset <= seen:
                out.reforwarded += 1
                continue
            if o.previous is not None and o.previous > seen:
                out.gaps += 1
                continue
            last[o.partition] = out.origin_offsets[o.partition] = o.offset
        out.messages.append(m)
    return out
