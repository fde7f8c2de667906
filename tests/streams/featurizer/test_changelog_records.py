"""The changelog's records, without a broker: sample, tombstone and position records round-trip."""

from __future__ import annotations

import numpy as np
import pytest

from unlearn.streams.featurizer.cache_view import CachedSample, HeadInfo
from unlearn.streams.featurizer.changelog_records import (
    ChangelogError,
    Position,
    decode_sample,
    decode_tombstone,
    encode_sample,
    encode_tombstone,
    sample_key,
    tombstone_key,
)
from unlearn.streams.featurizer.tombstones import Tombstone

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

def test_position_records_carry_the_routing_state() -> None:
    p = Position(2, 41, "t.requests.by-head", "tid", "L", 7, 3, "ab", {3: 100, 0: 5}, "rid", 4)
    assert Position.decode(p.encode()) == p
    assert Position.decode(Position(2, 1, "t", "", "L", 1, 0, "").encode()).origins == {}
    for other in (b'{"format":"unlearn.featurizer-position/v9"}', b'{"format":"unlearn.featurizer-position/v1",'
                  b'"partition":2,"applied_offset":9,"requests_topic":"t.requests","topic_id":"x","lineage":"L",'
                  b'"generation":3,"pieces":1,"sha256":"00"}'):
        with pytest.raises(ChangelogError, match="unknown position format"):
            Position.decode(other)
