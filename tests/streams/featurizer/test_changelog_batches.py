"""A batch's changelog messages, without a broker: phase 1 is rebuilt from the outbox's txn, and a
seed carries the whole cache."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.streams.featurizer.test_changelog_records import HEADS, mk, pos
from unlearn.streams.featurizer.batch_io import OutMessage
from unlearn.streams.featurizer.cache_view import CacheMutations
from unlearn.streams.featurizer.changelog_batches import batch_records, outputs_of_txn, snapshot_mutations
from unlearn.streams.featurizer.changelog_records import PHASE_CHANGELOG, PHASE_OUTPUT, ChangelogError
from unlearn.streams.featurizer.changelog_restore import fold_changelog
from unlearn.streams.featurizer.tombstones import Tombstone

TOPIC = "t.featurizer-cache"

# A batch: puts and drops over a small id space (so later batches hit earlier samples).
batches = st.lists(
    st.tuples(
        st.lists(st.tuples(st.sampled_from(sorted(HEADS)), st.sampled_from("abcdef"), st.sampled_from("st"),
                           st.integers(0, 10_000)), max_size=5),
        st.lists(st.tuples(st.sampled_from(sorted(HEADS)), st.sampled_from("abcdef")), max_size=3),
        st.booleans(),
    ),
    min_size=1, max_size=8,
)

def to_mutations(puts: list, drops: list, with_heads: bool, g: int = 1) -> CacheMutations:
    """A batch's mutations; each dropped sample leaves a tombstone dated 10 g (later batches,
    later tombstones, as the overlay's only ever move later), each put sample's tombstone expires."""
    put = {(h, s): mk(h, s, subj, seed) for h, s, subj, seed in puts}
    drop = tuple(k for k in dict.fromkeys(drops) if k not in put)  # a key is put or dropped, never both
    heads = tuple(HEADS[h] for h in sorted({h for h, _ in put})) if with_heads else ()
    tombs = tuple(Tombstone(h, "sample", sid, "s", "", 10 * g, f"d{g}") for h, sid in drop)
    expired = tuple((h, "sample", sid, "s", "") for h, sid in put)
    return CacheMutations(put_samples=tuple(put.values()), drop_samples=drop, put_heads=heads,
                          put_tombstones=tombs, drop_tombstones=expired)

@settings(max_examples=60, deadline=None)
@given(batches=batches, piece_bytes=st.sampled_from([7, 100, 1_000_000]), n_out=st.integers(0, 4))
def test_phase_one_is_rebuilt_byte_for_byte_from_the_outbox_txn(batches: list, piece_bytes: int, n_out: int) -> None:
    """The outbox keeps phase 0 only (cache schema 4): ``outputs_of_txn`` of it is exactly the
    phase 1 the batch was committed with (state records, then the downstream messages, keys,
    values, tombstones, partitions and order), for any batch, piece size and number of batches
    pending; a piece that does not verify is refused, never re-sent."""
    phase0: list[OutMessage] = []
    want: list[OutMessage] = []
    for g, (puts, drops, with_heads) in enumerate(batches, start=1):
        out = [OutMessage(f"t.{t}", None if i == 2 else f"k{i}".encode(), bytes([g, i]) * (i + 1))
               for i, t in zip(range(n_out), ("deltas", "deadletter", "receipts", "head-registry"), strict=False)]
        recs = batch_records(2, TOPIC, to_mutations(puts, drops, with_heads, g), out, pos(10 * g, g), piece_bytes)
        phase0 += [m for m in recs if m.phase == PHASE_CHANGELOG]
        want += [m for m in recs if m.phase == PHASE_OUTPUT] + out
    assert outputs_of_txn(TOPIC, 2, phase0) == want
    broken = [m if m.key != phase0[0].key or i else OutMessage(m.topic, m.key, (m.value or b"") + b"!", 2, 0)
              for i, m in enumerate(phase0)]
    with pytest.raises(ChangelogError):
        outputs_of_txn(TOPIC, 2, broken)
    with pytest.raises(ChangelogError):
        outputs_of_txn(TOPIC, 2, phase0[:-1])  # the last batch's pieces without their position

def test_a_seed_uploads_the_tombstones_with_the_samples() -> None:
    """A seed (a local cache the changelog lacks) is one batch of the whole cache: its tombstones
    travel with it, so remove wins survives a recreated changelog topic."""
    tombs = [Tombstone("h", "sample", "gone", "s", "", 7, "d1"), Tombstone("h", "subject", "s2", "s2", "c", 9, "d2")]
    snap = snapshot_mutations([mk("h", "a", "s", 1)], [HEADS["h"]], tombs)
    folded = fold_changelog([(m.key or b"", m.value) for m in batch_records(2, TOPIC, snap, [], pos(5, 1), 100)], 2)
    assert sorted(folded.tombstones.values(), key=lambda t: t.key) == sorted(tombs, key=lambda t: t.key)
    assert list(folded.samples) == [("h", "a")] and folded.samples[("h", "a")].event_us == 1
