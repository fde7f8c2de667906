"""Sealing a featurizer batch (streams/featurizer/sealing.py) and the sealed changelog, without a broker."""

from __future__ import annotations

import numpy as np
import pytest

from unlearn.schemas.deadletter import DeadLetter
from unlearn.schemas.delta_codec import Delta, RowsEntry, SealedRowsEntry
from unlearn.schemas.sealed import SampleKey, SealError, new_key, open_delta
from unlearn.streams.featurizer.batch_io import BatchOutcome
from unlearn.streams.featurizer.cache_view import CachedSample, CacheMutations
from unlearn.streams.featurizer.changelog_batches import batch_records, state_records
from unlearn.streams.featurizer.changelog_records import Position, encode_sample
from unlearn.streams.featurizer.changelog_restore import fold_changelog
from unlearn.streams.featurizer.sealing import open_sample_record, sample_sealer, seal_outcome


class FakeKeys:
    """The KeyStore surface sealing uses."""

    def __init__(self) -> None:
        self.current: dict[tuple[str, str], SampleKey] = {}
        self.all: dict[tuple[str, str, str], SampleKey] = {}

    def key_of(self, h: str, s: str) -> SampleKey | None:
        return self.current.get((h, s))

    def create(self, p: int, h: str, s: str) -> SampleKey:
        k = new_key()
        self.current[(h, s)] = k
        self.all[(h, s, k.key_id)] = k
        return k

    def forget_current(self, h: str, s: str, kid: str) -> None:
        if (h, s) in self.current and self.current[(h, s)].key_id == kid:
            del self.current[(h, s)]

    def lookup(self, h: str, s: str, kid: str) -> SampleKey | None:
        return self.all.get((h, s, kid))


def _rows(sign: int, samples: list[str], seed: int) -> RowsEntry:
    rng = np.random.default_rng(seed)
    n = len(samples)
    return RowsEntry(sign, [f"ev-{sign}-{s}" for s in samples], samples, ["u"] * n, rng.integers(0, 3, n),
                     rng.integers(-(2**30), 2**30, size=(n, 4)))


def _outcome(*entries: RowsEntry, deadletters: list[DeadLetter] | None = None) -> BatchOutcome:
    return BatchOutcome(0, 10, [Delta("h", "requests.by-head/0@10", 4, 30, 0, entries)], deadletters or [], [],
                        CacheMutations())


def test_delete_of_a_cached_sample_then_its_re_add_in_one_batch_use_their_own_keys() -> None:
    keys = FakeKeys()
    old = keys.create(0, "h", "x")
    rm, add = _rows(-1, ["x"], 1), _rows(+1, ["x", "y"], 2)
    out = seal_outcome(keys, 0, _outcome(add, rm), lambda h, s: s == "x")  # type: ignore[arg-type]
    sealed_add, sealed_rm = out.deltas[0].entries
    assert isinstance(sealed_add, SealedRowsEntry) and isinstance(sealed_rm, SealedRowsEntry)
    assert sealed_rm.key_ids == (old.key_id,)
    assert sealed_add.key_ids[0] != old.key_id and keys.key_of("h", "x").key_id == sealed_add.key_ids[0]  # type: ignore[union-attr]
    opened = open_delta(out.deltas[0], keys.lookup)
    assert opened.delta.entries == (add, rm) and not opened.erased


def test_a_re_add_then_delete_in_one_batch_uses_the_new_key_not_the_one_awaiting_destruction() -> None:
    keys = FakeKeys()
    old = keys.create(0, "h", "x")  # x was deleted in an earlier batch: its key awaits destruction
    add = _rows(+1, ["x"], 5)
    rm = RowsEntry(-1, ["ev-del"], ["x"], ["u"], add.labels, add.q)
    out = seal_outcome(keys, 0, _outcome(add, rm), lambda h, s: False)  # type: ignore[arg-type]
    a, r = out.deltas[0].entries
    assert isinstance(a, SealedRowsEntry) and isinstance(r, SealedRowsEntry)
    assert a.key_ids == r.key_ids != (old.key_id,) and a.commitments == r.commitments
    # and a delete of a cached sample forgets its key as the sample's current one
    keys2 = FakeKeys()
    k = keys2.create(0, "h", "y")
    seal_outcome(keys2, 0, _outcome(_rows(-1, ["y"], 6)), lambda h, s: True)  # type: ignore[arg-type]
    assert keys2.key_of("h", "y") is None and ("h", "y", k.key_id) in keys2.all


def test_add_and_delete_in_one_batch_share_key_and_commitment() -> None:
    keys = FakeKeys()
    add = _rows(+1, ["z"], 3)
    rm = RowsEntry(-1, ["ev-del"], ["z"], ["u"], add.labels, add.q)
    out = seal_outcome(keys, 0, _outcome(add, rm))  # type: ignore[arg-type]
    a, r = out.deltas[0].entries
    assert isinstance(a, SealedRowsEntry) and isinstance(r, SealedRowsEntry)
    assert a.key_ids == r.key_ids and a.commitments == r.commitments
    # once the key is destroyed both rows are erased, with matching pair keys
    erased = open_delta(out.deltas[0], lambda h, s, k: None).erased
    assert [e.sign for e in erased] == [1, -1] and erased[0].pair_key() == erased[1].pair_key()


def test_dead_letter_of_a_keyed_sample_is_sealed() -> None:
    keys = FakeKeys()
    keys.create(0, "h", "x")
    orig = b'{"op":"add","head_id":"h","sample_id":"x","input":{"kind":"features","values":[0.123456789]}}'
    other = b'{"op":"add","head_id":"h","sample_id":"new","input":{"kind":"features","values":[0.5]}}'
    dls = [DeadLetter(orig, "duplicate_add", "", "featurizer"), DeadLetter(other, "dimension_mismatch", "", "f")]
    out = seal_outcome(keys, 0, _outcome(_rows(+1, ["w"], 4), deadletters=dls))  # type: ignore[arg-type]
    assert out.deadletters[0].original.startswith(b"ULFZ") and b"0.123456789" not in out.deadletters[0].original
    assert out.deadletters[1].original == other


def test_sealed_changelog_folds_without_opening_erased_samples() -> None:
    keys = FakeKeys()
    a = CachedSample("h", "a", "u", "c", "e1", 1, np.arange(4, dtype=np.int64))
    b = CachedSample("h", "b", "u", "c", "e2", 2, np.arange(4, dtype=np.int64) * 7)
    keys.create(0, "h", "a")
    keys.create(0, "h", "b")
    recs = state_records(CacheMutations(put_samples=(a, b)), sample_sealer(keys, 0))  # type: ignore[arg-type]
    assert all(v is not None and v.startswith(b"ULFZ") and encode_sample(a) not in v for _, v in recs)
    # b is deleted, then its key destroyed: its old sealed records are never opened again
    def opener(h: str, s: str, raw: bytes) -> bytes:
        return open_sample_record(keys.lookup, h, s, raw)

    def batch(gen: int, muts: CacheMutations) -> list[tuple[bytes, bytes | None]]:
        pos = Position(0, gen, "by-head", "", "lin", gen, 0, "")
        msgs = batch_records(0, "cl", muts, [], pos, 100_000, sample_sealer(keys, 0))  # type: ignore[arg-type]
        return [(m.key, m.value) for m in msgs if m.key is not None]

    log = batch(1, CacheMutations(put_samples=(a, b))) + batch(2, CacheMutations(drop_samples=(("h", "b"),)))
    destroyed = keys.all.pop(("h", "b", keys.current.pop(("h", "b")).key_id))
    assert destroyed
    folded = fold_changelog(log, 0, opener)
    assert list(folded.samples) == [("h", "a")] and folded.samples[("h", "a")] == a
    with pytest.raises(SealError, match="destroyed"):
        opener("h", "b", recs[1][1])  # type: ignore[arg-type]
    assert opener("h", "a", recs[0][1]) == encode_sample(a)  # type: ignore[arg-type]
