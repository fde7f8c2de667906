"""How a partition's feature cache comes back from its changelog, pure: the fold of the
changelog's records into cache contents (:func:`fold_changelog`) and the plan that decides
between the local file and the changelog (:func:`resume_plan`: continue, rebuild, seed or fresh).

docs/featurizer.md, "The cache changelog" (folding, and the plan's table).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from unlearn.streams.featurizer.batch_io import OutMessage
from unlearn.streams.featurizer.cache_view import CachedSample, HeadInfo
from unlearn.streams.featurizer.changelog_records import (
    ChangelogError,
    OpenSample,
    Position,
    Record,
    decode_head,
    decode_sample,
    decode_tombstone,
    decode_txn,
    delivered_key,
    parse_sample_key,
    parse_tombstone_key,
    position_key,
    txn_key,
)
from unlearn.streams.featurizer.events import EventKey, EventMark, open_event
from unlearn.streams.featurizer.tombstones import Tombstone, TombstoneKey

__all__ = [
    "FoldedChangelog",
    "LocalPosition",
    "ResumePlan",
    "fold_changelog",
    "resume_plan",
]


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
        head_id, sample_id = parse_sample_key(key)
        if value is None:
            raw.pop((head_id, sample_id), None)
        else:  # decoded once folding is done: an erased sample's old record is never opened
            raw[(head_id, sample_id)] = value
    elif key.startswith(b"head/") and value is not None:
        head_id = key.decode()[len("head/"):]
        folded.heads[head_id] = decode_head(head_id, value)
    elif key.startswith(b"tomb/"):
        if value is None:
            try:
                folded.tombstones.pop(parse_tombstone_key(key), None)
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
