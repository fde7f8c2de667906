"""The durable feature cache and its transactional outbox (sqlite, one file per partition)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.streams.featurizer.test_changelog_records import HEADS, mk
from unlearn.schemas.delta_codec import decode_delta
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.streams.featurizer.batch_io import InMessage, OutMessage
from unlearn.streams.featurizer.cache_file import CacheError, cache_path
from unlearn.streams.featurizer.cache_view import CachedSample, CacheMutations, HeadInfo
from unlearn.streams.featurizer.changelog_records import Position
from unlearn.streams.featurizer.core_config import CoreConfig
from unlearn.streams.featurizer.feature_cache import FeatureCache
from unlearn.streams.featurizer.featurize import featurize_batch
from unlearn.streams.featurizer.tombstones import Tombstone

ROOT = Path(__file__).resolve().parents[3]
HEAD = HeadInfo("h", "features", "features", 3, "class", 0, 30, 0)
VHEAD = HeadInfo("v", "features", "features", 2, "vector", 2, 30, 8)


def sample(sid: str, subj: str, q, label=1, head: str = "h") -> CachedSample:
    lab = label if isinstance(label, int) else np.asarray(label, np.int64)
    return CachedSample(head, sid, subj, "c1", f"add-{sid}", lab, np.asarray(q, np.int64))


def test_roundtrip_and_reopen(tmp_path: Path) -> None:
    path = cache_path(tmp_path, "unlearn.requests", 2)
    assert path == tmp_path / "featurizer" / "unlearn.requests" / "p2.sqlite"
    big = [2**30, -(2**30), 7]
    muts = CacheMutations(
        put_samples=(sample("b", "s1", big, 4), sample("a", "s1", [1, 2, 3], 0), sample("c", "s2", [0, 0, 1]),
                     sample("z", "s1", [5, 6], [128, -64], head="v")),
        put_heads=(HEAD, VHEAD),
    )
    msgs = [OutMessage("t.deltas", b"h", b"\x00delta"), OutMessage("t.deadletter", None, b"{}")]
    with FeatureCache.open_partition(tmp_path, "unlearn.requests", 2) as cache:
        assert cache.applied_offset == -1 and cache.count() == 0 and cache.get_head("h") is None
        seqs = cache.commit_batch(muts, msgs, 41)
        assert len(seqs) == 2 and seqs[0] < seqs[1]
    with FeatureCache.open_partition(tmp_path, "unlearn.requests", 2) as cache:
        assert cache.applied_offset == 41
        assert cache.get_head("h") == HEAD and cache.get_head("v") == VHEAD and cache.heads() == [HEAD, VHEAD]
        assert cache.get_sample("h", "b") == sample("b", "s1", big, 4)
        assert cache.get_sample("v", "z") == sample("z", "s1", [5, 6], [128, -64], head="v")
        assert cache.get_sample("h", "z") is None
        assert [s.sample_id for s in cache.subject_samples("h", "s1")] == ["a", "b"]
        assert cache.subject_samples("v", "s2") == []
        assert cache.count() == 4 and cache.count("h") == 3
        rows = cache.pending_outbox()
        assert [(r.seq, r.topic, r.key, r.value) for r in rows] == [
            (seqs[0], "t.deltas", b"h", b"\x00delta"), (seqs[1], "t.deadletter", None, b"{}")]
        cache.ack_outbox([seqs[0]])
        assert [r.seq for r in cache.pending_outbox()] == [seqs[1]]
        # delete + re-add of another sample in one batch; the offset moves on
        cache.commit_batch(CacheMutations(drop_samples=(("h", "a"), ("h", "b")),
                                          put_samples=(sample("d", "s1", [9, 9, 9]),)), [], 50)
        assert [s.sample_id for s in cache.samples("h")] == ["c", "d"] and cache.applied_offset == 50
        mode = cache._db.execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"


def test_offsets_only_move_forward_and_failed_batches_roll_back(tmp_path: Path) -> None:
    with FeatureCache(tmp_path / "c.sqlite") as cache:
        cache.commit_batch(CacheMutations(put_heads=(HEAD,)), [], 10)
        with pytest.raises(CacheError):
            cache.commit_batch(CacheMutations(put_samples=(sample("a", "s", [1, 2, 3]),)), [], 10)
        # a failure inside the transaction (no value, not a changelog tombstone) leaves nothing behind
        with pytest.raises(sqlite3.IntegrityError):
            cache.commit_batch(CacheMutations(put_samples=(sample("a", "s", [1, 2, 3]),)),
                               [OutMessage("t", b"k", None)], 11)  # type: ignore[arg-type]
        assert cache.count() == 0 and cache.pending_outbox() == [] and cache.applied_offset == 10


def test_origin_offsets_commit_with_the_batch_and_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with FeatureCache(path) as cache:
        assert cache.origin_offsets() == {} and (cache.origin_topic_id, cache.route_partitions) == ("", 0)
        cache.commit_batch(CacheMutations(), [], 3, origins={0: 10, 2: 4})
        cache.commit_batch(CacheMutations(), [], 4, origins={0: 12})
        with pytest.raises(CacheError):  # a failed batch moves nothing
            cache.commit_batch(CacheMutations(), [], 4, origins={0: 99})
        cache.bind_routing("rid", 4)
        cache.bind_routing("rid", 4)
        with pytest.raises(CacheError):
            cache.bind_routing("rid", 8)
    with FeatureCache(path) as cache:
        assert cache.origin_offsets() == {0: 12, 2: 4}
        assert (cache.origin_topic_id, cache.route_partitions) == ("rid", 4)

def test_tombstones_only_move_later_expire_and_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    early, late = Tombstone("h", "sample", "x", "s", "", 5, "d1"), Tombstone("h", "sample", "x", "s", "", 9, "d2")
    subj = Tombstone("h", "subject", "s", "s", "c1", 7, "d3")
    with FeatureCache(path) as cache:
        cache.commit_batch(CacheMutations(put_tombstones=(late, subj)), [], 1)
        cache.commit_batch(CacheMutations(put_tombstones=(early,)), [], 2)  # never moves back
        assert cache.tombstones("h", "sample", "x", "s") == [late]
        names = [("h", "sample", "x", "s"), ("h", "subject", "s", "s"), ("h", "sample", "y", "s")]
        assert cache.get_tombstones(names) == {names[0]: [late], names[1]: [subj], names[2]: []}
        assert cache.expired_tombstones(8, 10) == [subj.key]
    with FeatureCache(path) as cache:
        assert cache.all_tombstones() == [late, subj]
        cache.commit_batch(CacheMutations(drop_tombstones=(subj.key,)), [], 3)
        assert cache.all_tombstones() == [late] and cache.expired_tombstones(9, 10) == []

def _reqs() -> list[bytes]:
    return [
        encode_request(Request("e1", "add", "h", "c1", "s1", "x1", 1, FeaturesInput((1.0, 2.0, 2.0)))),
        encode_request(Request("e2", "add", "h", "c1", "s1", "x2", 0, FeaturesInput((0.0, 3.0, 4.0)))),
        b"garbage",
        encode_request(Request("e3", "delete", "h", "c1", "s1", "x1")),
    ]


def test_core_plus_cache_survive_a_kill_between_commit_and_produce(tmp_path: Path) -> None:
    """The outbox contract with a real SIGKILL: a child process judges a batch, commits it to the
    cache and dies before producing. The batch's outcome is durable and nothing is lost."""
    child = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from unlearn.streams.featurizer.feature_cache import FeatureCache
        from unlearn.streams.featurizer.batch_io import InMessage
        from unlearn.streams.featurizer.core_config import CoreConfig
        from unlearn.streams.featurizer.featurize import featurize_batch
        import tests.streams.featurizer.test_feature_cache as t
        cfg = CoreConfig("t.requests", "t.deltas", "t.deadletter", "t.receipts")
        cache = FeatureCache.open_partition({str(tmp_path)!r}, "t.requests", 0)
        msgs = [InMessage(0, 100 + i, v, b"k") for i, v in enumerate(t._reqs())]
        out = featurize_batch(msgs, cache, cfg, now=1.0)
        cache.commit_batch(out.mutations, out.messages(cfg), out.last_offset)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", child], cwd=ROOT, timeout=60)
    assert proc.returncode == -9
    with FeatureCache.open_partition(tmp_path, "t.requests", 0) as cache:
        assert cache.applied_offset == 103  # the restart seeks to 104: nothing is judged twice
        assert [s.sample_id for s in cache.samples("h")] == ["x2"]  # x1 added and deleted
        rows = cache.pending_outbox()
        assert [r.topic for r in rows] == ["t.deltas", "t.deadletter"]
        delta = decode_delta(rows[0].value)
        assert delta.source_id == "requests/0@103"
        assert [(e.sign, e.event_ids) for e in delta.entries] == [(1, ("e1", "e2")), (-1, ("e3",))]
        # re-judging the same batch against the cache would be wrong (duplicates): that is why
        # the shell seeks past applied_offset; here it would see x2 as a duplicate add
        cfg = CoreConfig("t.requests", "t.deltas", "t.deadletter", "t.receipts")
        again = featurize_batch([InMessage(0, 100 + i, v) for i, v in enumerate(_reqs())], cache, cfg, now=1.0)
        assert "duplicate_add" in again.reasons()


def test_batched_lookups_and_outbox_sequence_numbers(tmp_path: Path) -> None:
    puts = tuple(sample(f"s{i:04d}", f"u{i % 7}", [i, -i, 1]) for i in range(1200))
    with FeatureCache(tmp_path / "c.sqlite", synchronous="NORMAL") as cache:
        assert cache._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        first = cache.commit_batch(CacheMutations(put_samples=puts, put_heads=(HEAD,)),
                                   [OutMessage("t", b"k", b"v%d" % i) for i in range(5)], 1)
        assert first == list(range(first[0], first[0] + 5))
        # one lookup for many keys (several queries of 500) gives what one-by-one lookups give
        keys = [("h", f"s{i:04d}") for i in range(0, 1400, 3)] + [("v", "s0001"), ("h", "s0003")]
        got = cache.get_samples(keys)
        assert got == {k: s for k in keys if (s := cache.get_sample(*k)) is not None} and len(got) == 400
        # acknowledged in any order and with gaps: one range delete per run; numbers never reused
        cache.ack_outbox([first[4], first[0], first[1], first[3]])
        assert [r.seq for r in cache.pending_outbox()] == [first[2]]
        cache.ack_outbox([first[2]])
        cache.ack_outbox([])
        nxt = cache.commit_batch(CacheMutations(), [OutMessage("t", None, b"x"), OutMessage("t", None, b"y")], 2)
        assert nxt == [first[4] + 1, first[4] + 2]
        assert [(r.seq, r.value) for r in cache.pending_outbox()] == [(nxt[0], b"x"), (nxt[1], b"y")]
        assert cache._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # restored after the ack
    with FeatureCache(tmp_path / "c.sqlite") as cache:  # FULL by default, and the rows are there
        assert cache._db.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert [r.seq for r in cache.pending_outbox()] == nxt and cache.count() == 1200
        cache.ack_outbox(nxt)
        assert cache._db.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert cache.commit_batch(CacheMutations(), [OutMessage("t", None, b"z")], 3) == [nxt[1] + 1]
    with pytest.raises(ValueError):
        FeatureCache(tmp_path / "d.sqlite", synchronous="OFF")

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


def test_every_lookup_of_judging_is_a_seek_not_a_walk_of_the_head(tmp_path: Path) -> None:
    """What a batch asks of the cache (samples, subjects, tombstones, event marks) seeks each name
    in an index; sqlite's own choice walked every sample or tombstone of the head, so a batch's
    cost grew with the head (bench/results/pipeline_bench.md section 22). Checked on the plans
    of the statements the lookups run, with their values bound."""
    with FeatureCache(tmp_path / "c.sqlite") as cache:
        cache.commit_batch(CacheMutations(
            put_samples=tuple(sample(f"x{i}", f"s{i % 7}", [i, 1, 2]) for i in range(50)), put_heads=(HEAD,),
            put_tombstones=(Tombstone("h", "sample", "x1", "s1", "", 5, "d1"),
                            Tombstone("h", "subject", "s2", "s2", "c1", 7, "d2"))), [], 0)
        statements: list[str] = []
        cache._db.set_trace_callback(statements.append)
        assert [s.sample_id for s in cache.get_samples([("h", "x1"), ("h", "nope")]).values()] == ["x1"]
        assert [s.sample_id for s in cache.subject_samples("h", "s2")] == ["x16", "x2", "x23", "x30", "x37", "x44",
                                                                            "x9"]
        got = cache.get_tombstones([("h", "sample", "x1", "s1"), ("h", "subject", "s2", "s2")])
        assert [t.event_id for ts in got.values() for t in ts] in (["d1", "d2"], ["d2", "d1"])
        assert cache.get_events([("h", "add-x3"), ("h", "nope")])[("h", "add-x3")].sample_id == "x3"
        cache._db.set_trace_callback(None)
        selects = [s for s in statements if s.startswith("SELECT")]
        assert len(selects) >= 5  # samples, subject, tombstones, marks and the cached adds
        for sql in selects:
            plan = [row[3] for row in cache._db.execute("EXPLAIN QUERY PLAN " + sql)]
            searches = [p for p in plan if p.startswith(("SEARCH", "SCAN"))]
            assert searches and all(p.startswith("SEARCH") and "=? AND " in p for p in searches), (sql, plan)


_NAME = st.tuples(st.sampled_from(["h", "g"]), st.sampled_from(["sample", "subject"]), st.sampled_from("abc"),
                  st.sampled_from("st"))


@settings(max_examples=40, deadline=None)
@given(stored=st.lists(st.tuples(_NAME, st.sampled_from(["", "c1", "c2"]), st.integers(0, 9)), max_size=25),
       asked=st.lists(_NAME, max_size=12))
def test_the_batch_tombstone_lookup_is_the_one_name_lookup(tmp_path_factory: pytest.TempPathFactory,
                                                           stored: list, asked: list) -> None:
    """``get_tombstones`` (one query per head and kind) against ``tombstones`` (one name each),
    over heads, kinds, ids and subjects that share their values."""
    path = tmp_path_factory.mktemp("c") / "c.sqlite"
    tombs = {(*name, client): Tombstone(*name, client, t, f"d{t}") for name, client, t in stored}
    with FeatureCache(path) as cache:
        cache.commit_batch(CacheMutations(put_tombstones=tuple(tombs.values())), [], 0)
        assert cache.get_tombstones(asked) == {n: cache.tombstones(*n) for n in asked}


def test_a_lane_batch_keeps_the_offset_and_records_what_it_judged_ahead(tmp_path: Path) -> None:
    """The delete lane (delete_lane.py): its commit leaves the offset where it was and adds its
    offsets as done ahead; the next batch moves the offset past them and forgets them; the file,
    a reopen and a rebuild from a position keep them."""
    muts = CacheMutations(put_samples=(sample("a", "s1", [1, 2, 3]),), put_heads=(HEAD,))
    with FeatureCache.open_partition(tmp_path, "r", 0) as cache:
        with pytest.raises(CacheError, match="lane"):  # a fresh cache has no offset to keep
            cache.commit_batch(muts, [], -1, ahead=[3], lane=True)
        cache.commit_batch(muts, [], 9)
        cache.commit_batch(CacheMutations(), [], 9, ahead=[14], lane=True)
        cache.commit_batch(CacheMutations(), [], 9, ahead=[14, 12], lane=True)
        assert cache.applied_offset == 9 and cache.ahead_offsets() == [12, 14]
        with pytest.raises(CacheError, match="keeps the offset"):
            cache.commit_batch(CacheMutations(), [], 10, ahead=[15], lane=True)
        with pytest.raises(CacheError, match="not past"):  # what is done ahead lies past the offset
            cache.commit_batch(CacheMutations(), [], 12, ahead=[12, 14])
    with FeatureCache.open_partition(tmp_path, "r", 0) as cache:
        assert cache.applied_offset == 9 and cache.ahead_offsets() == [12, 14]
        cache.commit_batch(CacheMutations(), [], 13, ahead=[14])
        assert cache.applied_offset == 13 and cache.ahead_offsets() == [14]
        cache.commit_batch(CacheMutations(), [], 20)
        assert cache.ahead_offsets() == []
        cache.replace_all([], [HEAD], Position(0, 30, "t", "", "L", 5, 0, "", ahead=(31, 33)))
        assert cache.applied_offset == 30 and cache.ahead_offsets() == [31, 33]
