"""Sealing a featurizer batch's outputs under per-sample keys (docs/erasure.md, section 3).

The core decides in plaintext (``core.featurize_batch``); before its outputs enter the outbox
:func:`seal_outcome` gives every add row a fresh key from the partition's :class:`KeyStore` and
turns every ROWS entry of a ``deltas`` message into a SEALED entry (``schemas.sealed``); a delete
is sealed under the key its add used, so both carry the same commitment. :func:`sample_sealer`
seals the changelog's sample records (``cache.encode_sample``) under the same key, and
:func:`seal_deadletter` a refused request about a keyed sample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import orjson

from unlearn.schemas.deadletter import DeadLetter
from unlearn.schemas.delta_codec import RowsEntry
from unlearn.schemas.sealed import (
    PURPOSE_CHANGELOG,
    PURPOSE_DEADLETTER,
    SampleKey,
    SealError,
    seal,
    seal_delta,
    unseal,
)
from unlearn.streams.featurizer.batch_io import BatchOutcome
from unlearn.streams.featurizer.key_store import KeyStore

__all__ = [
    "SEALED_SAMPLE_MAGIC",
    "open_sample_record",
    "sample_sealer",
    "seal_deadletter",
    "seal_outcome",
    "sealed_sample_record",
]


SEALED_SAMPLE_MAGIC = b"ULFZ\x01"


def seal_outcome(keys: KeyStore, partition: int, outcome: BatchOutcome,
                 cached: Callable[[str, str], bool] | None = None) -> BatchOutcome:
    """``outcome`` with its deltas' rows sealed; creates (stages) a key per added row. A delete
    uses the key of the sample cached before the batch (``cached(head, sample)``: the cache as
    it was before the batch) or else the key its add got in this batch: a sample deleted earlier
    whose key awaits destruction is not the one a re-add-then-delete in this batch removes."""
    if not outcome.deltas:
        return replace(outcome, deadletters=[seal_deadletter(keys, dl) for dl in outcome.deadletters])
    before: dict[tuple[str, str], SampleKey] = {}
    for d in outcome.deltas:  # deletes first: they use the keys of samples cached before this batch
        for e in d.entries:
            if isinstance(e, RowsEntry) and e.sign < 0:
                for s in e.sample_ids:
                    k = keys.key_of(d.head_id, s)
                    if k is not None and (cached is None or cached(d.head_id, s)):
                        before[(d.head_id, s)] = k
    created: dict[tuple[str, str], list[SampleKey]] = {}
    for d in outcome.deltas:
        for e in d.entries:
            if isinstance(e, RowsEntry) and e.sign > 0:
                for s in e.sample_ids:
                    created.setdefault((d.head_id, s), []).append(keys.create(partition, d.head_id, s))
    adds_used: dict[tuple[str, str], int] = {}

    def key_for(sign: int) -> Callable[[str, str], SampleKey]:
        def pick(head_id: str, sample_id: str) -> SampleKey:
            ref = (head_id, sample_id)
            if sign > 0:
                i = adds_used.get(ref, 0)
                adds_used[ref] = i + 1
                return created[ref][i]
            k = before.get(ref) or next(iter(created.get(ref, [])), None)
            if k is None:  # added before sealing existed: give it a key now (its add was plaintext)
                k = keys.create(partition, head_id, sample_id)
                created.setdefault(ref, []).append(k)
            return k
        return pick

    sealed = []
    deadletters = [seal_deadletter(keys, dl) for dl in outcome.deadletters]
    for d in outcome.deltas:
        if not any(isinstance(e, RowsEntry) for e in d.entries):
            sealed.append(d)
            continue
        # seal entry by entry so adds and deletes pick their keys by sign
        parts = [seal_delta(replace(d, entries=(e,)), key_for(e.sign)).entries[0] if isinstance(e, RowsEntry) else e
                 for e in d.entries]
        sealed.append(replace(d, entries=tuple(parts)))
    for head_id, sample_id in before:  # deleted and not re-added: its key now only awaits destruction
        if (head_id, sample_id) not in created:
            keys.forget_current(head_id, sample_id, before[(head_id, sample_id)].key_id)
    return replace(outcome, deltas=sealed, deadletters=deadletters)


def seal_deadletter(keys: KeyStore, dl: DeadLetter) -> DeadLetter:
    """A refused request about a sample that has a key (e.g. a duplicate add of a cached sample)
    keeps its original bytes sealed under that key (purpose ``deadletter-original``), so the
    sample's erasure covers it; other dead letters are unchanged (docs/erasure.md)."""
    try:
        req = orjson.loads(dl.original)
        head_id, sample_id = req["head_id"], req["sample_id"]
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return dl
    if not (isinstance(head_id, str) and isinstance(sample_id, str)):
        return dl
    key = keys.key_of(head_id, sample_id)
    if key is None:
        return dl
    sealed = seal(key, PURPOSE_DEADLETTER, head_id, sample_id, dl.original)
    return replace(dl, original=SEALED_SAMPLE_MAGIC + bytes.fromhex(key.key_id) + sealed)


def sealed_sample_record(key: SampleKey, head_id: str, sample_id: str, plain: bytes) -> bytes:
    """``ULFZ\\x01`` + key id (16 bytes) + ``seal(cache-sample)`` of the plaintext sample record."""
    return SEALED_SAMPLE_MAGIC + bytes.fromhex(key.key_id) + seal(key, PURPOSE_CHANGELOG, head_id, sample_id, plain)


def open_sample_record(lookup: Callable[[str, str, str], SampleKey | None], head_id: str, sample_id: str,
                       raw: bytes) -> bytes:
    """The plaintext sample record of a sealed one (a plaintext record passes through); SealError
    when its key is gone or it does not open."""
    if not raw.startswith(SEALED_SAMPLE_MAGIC):
        return raw
    at = len(SEALED_SAMPLE_MAGIC)
    if len(raw) < at + 16:
        raise SealError("truncated sealed sample record")
    kid = raw[at: at + 16].hex()
    key = lookup(head_id, sample_id, kid)
    if key is None:
        raise SealError(f"the key {kid} of sample {sample_id!r} (head {head_id!r}) is destroyed or unknown")
    return unseal(key, PURPOSE_CHANGELOG, head_id, sample_id, raw[at + 16:])


def sample_sealer(keys: KeyStore, partition: int) -> Callable[[str, str, bytes], bytes]:
    """``seal(head, sample, plain_record)`` with the sample's current key (the one its add used);
    a sample cached before sealing existed gets a key now (staged: flush before producing)."""
    def do(head_id: str, sample_id: str, plain: bytes) -> bytes:
        k = keys.key_of(head_id, sample_id) or keys.create(partition, head_id, sample_id)
        return sealed_sample_record(k, head_id, sample_id, plain)
    return do
