"""What one committed batch writes to the feature cache's changelog, pure: its state records,
txn pieces and position record (:func:`batch_records`), and its phase 1 rebuilt from the
outbox's phase 0 (:func:`outputs_of_txn`).

Per batch the featurizer produces, in two acknowledged phases: (0) the txn pieces, then the
position record; (1) the downstream messages plus the sample/head records. Its sqlite outbox keeps
phase 0 only: :func:`outputs_of_txn` rebuilds phase 1 from the txn for a re-send. State records are
written only after their batch's position is durable, so the log never holds a sample record of
an uncommitted batch (which could shadow a committed value under compaction); txn pieces of an
unfinished batch are harmless: they sit in the other slot and only a position record names them.
Changelog records are outbox rows with a partition and a phase, delivered by the service like
every other outbox row (docs/featurizer.md, "Crash consistency" and "The cache changelog").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from unlearn.streams.featurizer.batch_io import OutMessage
from unlearn.streams.featurizer.cache_view import CachedSample, CacheMutations, HeadInfo
from unlearn.streams.featurizer.changelog_records import (
    PHASE_CHANGELOG,
    PHASE_OUTPUT,
    ChangelogError,
    Position,
    Record,
    SealSample,
    decode_txn,
    delivered_key,
    encode_head,
    encode_sample,
    encode_tombstone,
    encode_txn,
    head_key,
    position_key,
    sample_key,
    tombstone_key,
    txn_key,
)
from unlearn.streams.featurizer.events import EventMark, event_key, event_value
from unlearn.streams.featurizer.tombstones import Tombstone

__all__ = [
    "Keyed",
    "BatchTxn",
    "batch_records",
    "batch_txn",
    "framed_records",
    "delivered_record",
    "outputs_of_txn",
    "snapshot_mutations",
    "state_records",
]


class Keyed(Protocol):
    """A record with a key and a value (an ``OutMessage`` or an outbox row)."""

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...


def state_records(mutations: CacheMutations, seal_sample: SealSample | None = None) -> list[Record]:
    """The sample/head/tombstone/event records of a batch's cache mutations (drops are tombstones);
    sample values and adds' event marks sealed with ``seal_sample`` when given (docs/erasure.md)."""
    out: list[Record] = [(head_key(h.head_id), encode_head(h)) for h in mutations.put_heads]
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


@dataclass(frozen=True)
class BatchTxn:
    """A batch's changelog records (samples sealed) and its txn: the costly part of
    :func:`batch_records`, made before the batch's position is known (issue 29: a delete fetched
    meanwhile may commit first and move it, ``streams/featurizer/batch.py``)."""

    records: list[Record]
    txn: bytes


def batch_txn(mutations: CacheMutations, messages: Sequence[OutMessage],
              seal_sample: SealSample | None = None) -> BatchTxn:
    """The records and txn of :func:`batch_records`; ``seal_sample`` seals sample values."""
    records = state_records(mutations, seal_sample)
    return BatchTxn(records, encode_txn(records, messages))


def framed_records(partition: int, topic: str, batch: BatchTxn, position: Position,
                   piece_bytes: int) -> list[OutMessage]:
    """:func:`batch_records` of a :func:`batch_txn`: its pieces keyed by the position's generation,
    then the position record, then the sample/head records."""
    txn = batch.txn
    step = max(1, int(piece_bytes))
    pieces = [txn[i: i + step] for i in range(0, len(txn), step)] or [b""]
    pos = replace(position, partition=partition, pieces=len(pieces), sha256=hashlib.sha256(txn).hexdigest())
    slot = pos.generation % 2
    out = [OutMessage(topic, txn_key(partition, slot, i), piece, partition, PHASE_CHANGELOG)
           for i, piece in enumerate(pieces)]
    out.append(OutMessage(topic, position_key(partition), pos.encode(), partition, PHASE_CHANGELOG))
    out += [OutMessage(topic, k, v, partition, PHASE_OUTPUT) for k, v in batch.records]
    return out


def batch_records(partition: int, topic: str, mutations: CacheMutations, messages: Sequence[OutMessage],
                  position: Position, piece_bytes: int, seal_sample: SealSample | None = None) -> list[OutMessage]:
    """The changelog messages of one committed batch, in outbox order: phase 0 (txn pieces, then
    the position record), then phase 1 (the sample/head records). ``position.pieces`` and
    ``sha256`` are filled in here; ``piece_bytes`` bounds a piece; ``seal_sample`` seals sample values."""
    return framed_records(partition, topic, batch_txn(mutations, messages, seal_sample), position, piece_bytes)


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


def snapshot_mutations(samples: Iterable[CachedSample], heads: Iterable[HeadInfo],
                       tombstones: Iterable[Tombstone] = (), events: Iterable[EventMark] = ()) -> CacheMutations:
    """A whole cache as one batch of puts (the txn of a ``seed``)."""
    return CacheMutations(put_samples=tuple(samples), put_heads=tuple(heads), put_tombstones=tuple(tombstones),
                          put_events=tuple(events))
