"""The changelog's records, without a broker: sample, tombstone and position records round-trip."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.ledger.quantization import QMAX
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


def ref_sample_record(s: CachedSample, version: int) -> bytes:
    """A sample record as docs/featurizer.md tables it, built by hand: ``ULFS`` + version byte + u32
    header length + JSON header + q (v2: int32 LE, v1: int64 LE, the records of older changelogs)
    [+ label vector (int64 LE)]; no range check."""
    vec = not isinstance(s.label, int)
    header = orjson.dumps({"subject": s.subject_id, "client": s.client_id, "event": s.event_id,
                           "label": None if vec else s.label, "d": len(s.q),
                           "label_width": len(s.label) if vec else 0, "t": s.event_us})  # type: ignore[arg-type]
    body = struct.pack(f"<{len(s.q)}{'i' if version == 2 else 'q'}", *(int(v) for v in s.q))
    if vec:
        body += struct.pack(f"<{len(s.label)}q", *(int(v) for v in s.label))  # type: ignore[arg-type]
    return b"ULFS" + bytes([version]) + struct.pack("<I", len(header)) + header + body


@settings(max_examples=100, deadline=None)
@given(q=st.lists(st.integers(-QMAX, QMAX), min_size=1, max_size=9),
       label=st.one_of(st.integers(0, 2**20), st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3)),
       t=st.integers(1, 2**62))
def test_sample_records_are_written_with_q_as_i32_and_old_i64_records_still_read(q: list[int], label: object,
                                                                                   t: int) -> None:
    lab: int | np.ndarray = label if isinstance(label, int) else np.array(label, dtype=np.int64)
    s = CachedSample("h", "s/1", "u", "c", "e", lab, np.array(q, dtype=np.int64), event_us=t)
    raw = encode_sample(s)
    assert raw == ref_sample_record(s, 2)  # the documented layout, 4 bytes per q value
    for record in (raw, ref_sample_record(s, 1)):
        back = decode_sample("h", "s/1", record)
        assert back == s and back.q.dtype == np.int64
        if not isinstance(label, int):
            assert isinstance(back.label, np.ndarray) and back.label.dtype == np.int64


@pytest.mark.parametrize(("version", "value"), [(2, QMAX + 1), (2, -QMAX - 1), (2, 2**31 - 1), (1, QMAX + 1),
                                                (1, -(2**40)), (1, 2**63 - 1)])
def test_q_beyond_2_30_is_refused_never_wrapped(version: int, value: int) -> None:
    s = CachedSample("h", "s", "u", "c", "e", 1, np.array([3, value], dtype=np.int64), event_us=1)
    with pytest.raises(ChangelogError, match=r"2\^30"):
        encode_sample(s)
    with pytest.raises(ChangelogError, match=r"2\^30"):
        decode_sample("h", "s", ref_sample_record(s, version))
    for bad in (ref_sample_record(s, version)[:-4], b"ULFS\x03" + ref_sample_record(s, version)[5:]):
        with pytest.raises(ChangelogError):
            decode_sample("h", "s", bad)


def test_positions_carry_the_offsets_judged_ahead_and_are_unchanged_without_them() -> None:
    """The delete lane's offsets ride in the position (delete_lane.py); a position without them is
    written as it always was, so a changelog of a featurizer that never used the lane reads the same."""
    p = Position(2, 41, "t.requests.by-head", "tid", "L", 7, 3, "ab", {0: 5}, "rid", 4, (45, 43))
    back = Position.decode(p.encode())
    assert back.ahead == (43, 45) and back.applied_offset == 41
    plain = Position(2, 41, "t.requests.by-head", "tid", "L", 7, 3, "ab", {0: 5}, "rid", 4)
    assert b"ahead" not in plain.encode() and Position.decode(plain.encode()).ahead == ()
