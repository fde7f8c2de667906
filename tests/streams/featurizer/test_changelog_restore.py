"""The feature cache's changelog folded back, without a broker: records of batches fold back into the
cache, and the resume plan picks between the local file and the changelog."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.streams.featurizer.test_changelog_batches import TOPIC, batches, to_mutations
from tests.streams.featurizer.test_changelog_records import mk, pos
from unlearn.streams.featurizer.batch_io import OutMessage
from unlearn.streams.featurizer.cache_view import CacheMutations
from unlearn.streams.featurizer.changelog_batches import batch_records, delivered_record
from unlearn.streams.featurizer.changelog_records import PHASE_CHANGELOG, PHASE_OUTPUT, ChangelogError, position_key
from unlearn.streams.featurizer.changelog_restore import LocalPosition, fold_changelog, resume_plan
from unlearn.streams.featurizer.feature_cache import FeatureCache


@settings(max_examples=60, deadline=None)
@given(batches=batches, cut=st.integers(0, 10_000), piece_bytes=st.sampled_from([7, 100, 1_000_000]))
def test_replaying_the_changelog_gives_the_cache(tmp_path_factory: pytest.TempPathFactory, batches: list,
                                                 cut: int, piece_bytes: int) -> None:
    """Apply any sequence of batches to a real FeatureCache and write their changelog records as
    the service does; folding the log gives the same contents, also when the last batch's phase-1
    records were cut short by a crash (its txn restores them), and an unfinished next batch
    (txn pieces without a position) changes nothing."""
    path = tmp_path_factory.mktemp("c") / "p2.sqlite"
    log: list[tuple[bytes, bytes | None]] = []
    with FeatureCache(path) as cache:
        for g, (puts, drops, with_heads) in enumerate(batches, start=1):
            muts = to_mutations(puts, drops, with_heads, g)
            out = [OutMessage("t.deltas", b"h", f"delta {g}".encode())]
            recs = batch_records(2, TOPIC, muts, out, pos(10 * g, g), piece_bytes)
            assert [m.phase for m in recs] == sorted(m.phase for m in recs)  # phase 0 first
            assert recs[sum(m.phase == PHASE_CHANGELOG for m in recs) - 1].key == position_key(2)
            cache.commit_batch(muts, recs + out, 10 * g, g)
            last = recs
            log += [(m.key or b"", m.value) for m in recs]
        want = {(s.head_id, s.sample_id): s for s in cache.all_samples()}
        want_heads = {h.head_id: h for h in cache.heads()}
        want_tombs = {t.key: t for t in cache.all_tombstones()}
    # a crash cut the last batch's phase-1 records short
    n_state = sum(m.phase == PHASE_OUTPUT for m in last)
    log = log[: len(log) - (cut % (n_state + 1))]
    # and the next batch only got some txn pieces out
    nxt = batch_records(2, TOPIC, to_mutations([("h", "z", "s", 1)], [("h", "a")], True), [],
                        pos(999, len(batches) + 1), piece_bytes)
    log += [(m.key or b"", m.value) for m in nxt if m.phase == PHASE_CHANGELOG][:-1]
    folded = fold_changelog(log, 2)
    assert folded.samples.keys() == want.keys() and all(folded.samples[k] == want[k] for k in want)
    assert folded.heads == want_heads
    assert folded.tombstones == want_tombs  # the deletes' tombstones move with the cache (remove wins)
    assert folded.position is not None and folded.position.generation == len(batches)
    assert folded.position.origins == {0: 10 * len(batches)}
    assert [m.value for m in folded.pending] == [f"delta {len(batches)}".encode()]

def test_delivered_record_clears_the_pending_batch() -> None:
    recs = batch_records(2, TOPIC, CacheMutations(put_samples=(mk("h", "a", "s", 1),)), [OutMessage("t.d", None, b"x")],
                         pos(5, 3), 100)
    log = [(m.key or b"", m.value) for m in recs]
    assert fold_changelog(log, 2).pending
    done = delivered_record(TOPIC, 2, 3)
    folded = fold_changelog([*log, (done.key or b"", done.value)], 2)
    assert folded.pending == [] and folded.pending_records == [] and list(folded.samples) == [("h", "a")]
    assert fold_changelog([(m.key or b"", m.value) for m in recs if m.phase == PHASE_OUTPUT], 2).empty

def test_a_corrupt_txn_is_refused() -> None:
    recs = batch_records(2, TOPIC, CacheMutations(put_samples=(mk("h", "a", "s", 1),)), [], pos(5, 1), 10)
    log = [(m.key or b"", m.value) for m in recs]
    log[0] = (log[0][0], b"\x00" * 10)
    with pytest.raises(ChangelogError):
        fold_changelog(log, 2)

def test_resume_plan() -> None:
    local = LocalPosition(40, "L", 4)
    assert resume_plan(LocalPosition(-1, "L", 0), None) == "fresh"
    assert resume_plan(local, None) == "seed"  # recreated changelog / crash before the first batch
    assert resume_plan(LocalPosition(-1, "L", 0), pos(40, 4)) == "rebuild"  # empty data dir
    assert resume_plan(local, pos(40, 4)) == "continue"
    assert resume_plan(local, pos(30, 3)) == "continue"  # local ahead: its outbox brings the changelog up
    assert resume_plan(local, pos(30, 3, lineage="other")) == "rebuild"  # another host wrote meanwhile
    assert resume_plan(local, pos(50, 5)) == "rebuild"
