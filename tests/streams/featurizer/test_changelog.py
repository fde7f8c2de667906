"""The feature cache's changelog, without a broker: records of batches fold back into the cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.streams.featurizer.changelog_batches import (
    batch_records,
    delivered_record,
    outputs_of_txn,
    snapshot_mutations,
)
from unlearn.streams.featurizer.changelog_records import (
    PHASE_CHANGELOG,
    PHASE_OUTPUT,
    ChangelogError,
    Position,
    decode_sample,
    decode_tombstone,
    encode_sample,
    encode_tombstone,
    position_key,
    sample_key,
    tombstone_key,
)
from unlearn.streams.featurizer.changelog_restore import LocalPosition, fold_changelog, resume_plan
from unlearn.streams.featurizer.core import Tombstone
from unlearn.streams.featurizer.feature_cache import FeatureCache
from unlearn.streams.featurizer.model import CachedSample, CacheMutations, HeadInfo, OutMessage

TOPIC = "t.featurizer-cache"
HEADS = {"h": HeadInfo("h", "features", "features", 3, "class", 0, 30, 0),
         "v/w": HeadInfo("v/w", "features", "features", 3, "vector", 2, 30, 8)}


def pos(offset: int, generation: int, lineage: str = "L") -> Position:
    return Position(2, offset, "t.requests.by-head", "tid", lineage, generation, 0, "", {0: offset}, "rid", 4)


def mk(head: str, sid: str, subj: str, seed: int) -> CachedSample:
    rng = np.random.default_rng(seed)
    q = rng.integers(-(2**30), 2**30, size=3, dtype=np.int64)
    label: int | np.ndarray = int(seed % 5) if head == "h" else rng.integers(-9, 9, size=2, dtype=np.int64)
    return CachedSample(head, sid, subj, "c", f"e{seed}", label, q, event_us=seed)


def test_sample_record_roundtrip_keeps_q_bits() -> None:
    for s in (mk("h", "a/b", "s", 1), mk("v/w", "x", "s", 2)):
        assert decode_sample(s.head_id, s.sample_id, encode_sample(s)) == s
    assert sample_key("v/w", "x") != sample_key("v", "w/x")  # ids with '/' never collide
    for t in (Tombstone("v/w", "sample", "x/1:y", "s/", "c/d", 3, "e"),
              Tombstone("h", "subject", "s", "s", "", 0, "e")):
        assert decode_tombstone(tombstone_key(t.key), encode_tombstone(t)) == t
    assert tombstone_key(("v/w", "sample", "x", "s", "")) != tombstone_key(("v", "sample", "w/x", "s", ""))
    with pytest.raises(ChangelogError):
        decode_sample("h", "a", encode_sample(mk("h", "a", "s", 1))[:-3])


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


def test_delivered_record_clears_the_pending_batch() -> None:
    recs = batch_records(2, TOPIC, CacheMutations(put_samples=(mk("h", "a", "s", 1),)), [OutMessage("t.d", None, b"x")],
                         pos(5, 3), 100)
    log = [(m.key or b"", m.value) for m in recs]
    assert fold_changelog(log, 2).pending
    done = delivered_record(TOPIC, 2, 3)
    folded = fold_changelog([*log, (done.key or b"", done.value)], 2)
    assert folded.pending == [] and folded.pending_records == [] and list(folded.samples) == [("h", "a")]
    assert fold_changelog([(m.key or b"", m.value) for m in recs if m.phase == PHASE_OUTPUT], 2).empty


def test_a_seed_uploads_the_tombstones_with_the_samples() -> None:
    """A seed (a local cache the changelog lacks) is one batch of the whole cache: its tombstones
    travel with it, so remove wins survives a recreated changelog topic."""
    tombs = [Tombstone("h", "sample", "gone", "s", "", 7, "d1"), Tombstone("h", "subject", "s2", "s2", "c", 9, "d2")]
    snap = snapshot_mutations([mk("h", "a", "s", 1)], [HEADS["h"]], tombs)
    folded = fold_changelog([(m.key or b"", m.value) for m in batch_records(2, TOPIC, snap, [], pos(5, 1), 100)], 2)
    assert sorted(folded.tombstones.values(), key=lambda t: t.key) == sorted(tombs, key=lambda t: t.key)
    assert list(folded.samples) == [("h", "a")] and folded.samples[("h", "a")].event_us == 1


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


def test_cache_rebuild_replaces_everything_with_a_new_lineage(tmp_path: Path) -> None:
    with FeatureCache(tmp_path / "c.sqlite") as cache:
        old = cache.lineage
        cache.commit_batch(CacheMutations(put_samples=(mk("h", "a", "s", 1),), put_heads=(HEADS["h"],)),
                           [OutMessage("t.d", None, b"x")], 7, 1, {0: 70, 5: 9})
        cache.bind_routing("old-requests-id", 8)
        rebuilt = Position(2, 3, "t.requests.by-head", "tid", "L", 9, 0, "", {0: 40, 1: 12}, "rid", 4)
        tomb = Tombstone("h", "subject", "s", "s", "c", 5, "d")
        cache.replace_all([mk("h", "b", "s", 2)], [HEADS["h"]], rebuilt, [tomb])
        assert cache.all_tombstones() == [tomb]
        assert cache.lineage != old and cache.generation == 9 and cache.applied_offset == 3
        assert cache.topic_id == "tid" and cache.pending_outbox() == []
        assert [s.sample_id for s in cache.all_samples()] == ["b"]
        # the routing state moves with the cache, nothing of the old one survives
        assert cache.origin_offsets() == {0: 40, 1: 12}
        assert (cache.origin_topic_id, cache.route_partitions) == ("rid", 4)


def test_position_records_carry_the_routing_state() -> None:
    p = Position(2, 41, "t.requests.by-head", "tid", "L", 7, 3, "ab", {3: 100, 0: 5}, "rid", 4)
    assert Position.decode(p.encode()) == p
    assert Position.decode(Position(2, 1, "t", "", "L", 1, 0, "").encode()).origins == {}
    for other in (b'{"format":"unlearn.featurizer-position/v9"}', b'{"format":"unlearn.featurizer-position/v1",'
                  b'"partition":2,"applied_offset":9,"requests_topic":"t.requests","topic_id":"x","lineage":"L",'
                  b'"generation":3,"pieces":1,"sha256":"00"}'):
        with pytest.raises(ChangelogError, match="unknown position format"):
            Position.decode(other)
