"""Remove wins, in event time: the tombstones deletes leave and the rule adds meet, without I/O.

Producers are not ordered with each other (the app that adds and the service that erases are
different producers, and the router reads ``requests`` partitions independently), so a delete can
be judged before an add it was produced after. Every delete and delete_subject that is not refused
leaves a :class:`Tombstone` at its event time, and an add not later than a matching one is refused
(``deleted_before_arrival``). Event times, matching, clock bounds and retention: docs/featurizer.md,
"Remove wins, in event time". The rule is a pure function of (request, record timestamp,
tombstones, now), so a replay decides the same (``tests/streams/featurizer/test_tombstones.py``
checks it against a from-scratch reference), and the verifier re-runs it
(``services/verifier/remove_wins.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from unlearn.features.contract import FeatureRejected
from unlearn.schemas.envelope import Request

__all__ = [
    "TombstoneKind",
    "TombstoneKey",
    "DEFAULT_MAX_SKEW_SECONDS",
    "DEFAULT_RETENTION_SECONDS",
    "TOMBSTONE_REASONS",
    "TombstonePolicy",
    "AddName",
    "Tombstone",
    "seconds_to_us",
    "event_time_us",
    "add_event_time",
    "delete_event_time",
    "tombstones_of",
    "add_keys",
    "blocking_tombstone",
    "EXPIRE_PER_BATCH",
    "expired_tombstones",
    "TombName",
]


TombstoneKind = Literal["sample", "subject"]


#: (head, kind, id, subject, client): ``id`` is the sample id (kind "sample") or the subject id.
TombstoneKey = tuple[str, str, str, str, str]


DEFAULT_MAX_SKEW_SECONDS = 300.0
"""UNLEARN_MAX_CLOCK_SKEW_SECONDS: how far ahead of the featurizer an add may be dated."""


DEFAULT_RETENTION_SECONDS = 7 * 86_400.0
"""UNLEARN_TOMBSTONE_RETENTION_SECONDS: how long (in event time) a tombstone is kept."""


TOMBSTONE_REASONS: dict[str, str] = {
    "deleted_before_arrival": "an add whose event time is not later than a delete of its (head, sample) or a "
                              "delete_subject of its (head, subject) judged before it (remove wins, in event time)",
    "ts_in_future": "an add dated (ts, else the record timestamp) more than UNLEARN_MAX_CLOCK_SKEW_SECONDS ahead "
                    "of the featurizer's clock: it could outlive honest deletes",
    "event_too_old": "an add dated more than UNLEARN_TOMBSTONE_RETENTION_SECONDS in the past: a tombstone that "
                     "would refuse it may have expired",
}


@dataclass(frozen=True, slots=True)
class TombstonePolicy:
    """The clock bounds (seconds): ``max_skew`` ahead of the featurizer's clock, ``retention``
    (0: tombstones kept for ever)."""

    max_skew: float = DEFAULT_MAX_SKEW_SECONDS
    retention: float = DEFAULT_RETENTION_SECONDS

    def __post_init__(self) -> None:
        if not self.max_skew >= 0 or not self.retention >= 0:
            raise ValueError(f"max_skew and retention must be >= 0, got {self.max_skew}, {self.retention}")

    def horizon_us(self, now_us: int) -> int | None:
        """Event times below this are expired (None: nothing expires)."""
        return None if self.retention == 0 else now_us - seconds_to_us(self.retention)


class AddName(Protocol):
    """What names an add for the rule: a request, or a retained row the verifier re-judges."""

    @property
    def head_id(self) -> str: ...
    @property
    def sample_id(self) -> str | None: ...
    @property
    def subject_id(self) -> str: ...
    @property
    def client_id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A delete's (``kind`` "sample") or delete_subject's (``kind`` "subject") durable mark."""

    head_id: str
    kind: TombstoneKind
    id: str  # the sample id, or the subject id
    subject_id: str
    client_id: str  # "" matches every client
    event_us: int  # event time, microseconds since the epoch
    event_id: str  # the delete's event id

    @property
    def key(self) -> TombstoneKey:
        return (self.head_id, self.kind, self.id, self.subject_id, self.client_id)


def seconds_to_us(seconds: float) -> int:
    """Unix seconds -> integer microseconds (event times are compared exactly)."""
    return round(seconds * 1_000_000)


def event_time_us(r: Request, record_ms: int | None, now: float) -> int:
    """A request's event time: its ``ts``, else the record's timestamp (ms; None or < 0: none),
    else ``now`` (seconds), in integer microseconds. A record timestamp is a whole millisecond:
    an add takes its start, a delete its end (the last microsecond), so a delete produced right
    after an add dated with ``ts`` in the same millisecond is never taken for an older one."""
    if r.ts is not None:
        return seconds_to_us(r.ts)
    if record_ms is not None and record_ms >= 0:
        return int(record_ms) * 1000 + (999 if r.op != "add" else 0)
    return seconds_to_us(now)


def add_event_time(r: Request, record_ms: int | None, now: float, policy: TombstonePolicy) -> int:
    """An add's event time; raises ``FeatureRejected`` (``ts_in_future``, ``event_too_old``)
    outside the clock bounds."""
    t = event_time_us(r, record_ms, now)
    now_us = seconds_to_us(now)
    if t > now_us + seconds_to_us(policy.max_skew):
        raise FeatureRejected("ts_in_future", f"add {r.event_id!r} is dated {t / 1e6:.3f}, more than "
                                              f"{policy.max_skew:g} s after the featurizer's clock {now:.3f}")
    horizon = policy.horizon_us(now_us)
    if horizon is not None and t < horizon:
        raise FeatureRejected("event_too_old", f"add {r.event_id!r} is dated {t / 1e6:.3f}, more than "
                                               f"{policy.retention:g} s (the tombstone retention) before {now:.3f}")
    return t


def delete_event_time(r: Request, record_ms: int | None, now: float, policy: TombstonePolicy) -> int:
    """A delete's tombstone time: its event time, at most ``now + max_skew``."""
    return min(event_time_us(r, record_ms, now), seconds_to_us(now) + seconds_to_us(policy.max_skew))


def tombstones_of(r: Request, client_id: str, event_us: int) -> list[Tombstone]:
    """The tombstone a delete (its sample) or delete_subject (its subject) leaves;
    ``client_id`` "" when it may remove any client's samples."""
    if r.op == "delete":
        assert r.sample_id is not None
        return [Tombstone(r.head_id, "sample", r.sample_id, r.subject_id, client_id, event_us, r.event_id)]
    if r.op == "delete_subject":
        return [Tombstone(r.head_id, "subject", r.subject_id, r.subject_id, client_id, event_us, r.event_id)]
    return []


def add_keys(r: Request) -> list[tuple[str, str, str, str]]:
    """(head, kind, id, subject) of the tombstones that can refuse an add (any client)."""
    assert r.sample_id is not None
    return [(r.head_id, "sample", r.sample_id, r.subject_id), (r.head_id, "subject", r.subject_id, r.subject_id)]


def blocking_tombstone(r: AddName, add_us: int, found: Iterable[Tombstone]) -> Tombstone | None:
    """The latest tombstone among ``found`` that refuses the add ``r`` dated ``add_us`` (same
    head, subject, sample or subject kind, client or "", event time >= ``add_us``), or None."""
    best: Tombstone | None = None
    for t in found:
        if t.head_id != r.head_id or t.subject_id != r.subject_id or t.client_id not in ("", r.client_id):
            continue
        if t.kind == "sample" and t.id != r.sample_id:
            continue
        if t.event_us >= add_us and (best is None or t.event_us > best.event_us):
            best = t
    return best


EXPIRE_PER_BATCH = 256
"""Most expired tombstones one batch drops (retention is a storage bound, not a deadline)."""


def expired_tombstones(cache: object, policy: TombstonePolicy, now: float) -> tuple[TombstoneKey, ...]:
    """Keys of tombstones past the retention (at most :data:`EXPIRE_PER_BATCH`), from a cache
    that lists them (``FeatureCache.expired_tombstones``); none when nothing expires."""
    horizon = policy.horizon_us(seconds_to_us(now))
    lister = getattr(cache, "expired_tombstones", None)
    if horizon is None or lister is None:
        return ()
    return tuple(lister(horizon, EXPIRE_PER_BATCH))


#: (head, kind, id, subject): the tombstones of every client under one name.
TombName = tuple[str, str, str, str]
