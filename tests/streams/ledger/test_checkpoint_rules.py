"""The ledger's crash-consistency invariants, without a broker (streams/ledger/checkpoint_rules.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unlearn.common.checkpoint_record import Checkpoint, HeadPointer, checkpoint_key, latest_checkpoint
from unlearn.runtime.log_position import StaleStateError
from unlearn.streams.ledger.checkpoint_rules import check_recovery, first_needed, safe_floor

HEADS = st.sampled_from(["a", "b", "c", "d"])


@given(st.lists(HEADS, min_size=1, max_size=60), st.data())
def test_a_floor_never_passes_an_event_that_is_not_durable(log: list[str], data: st.DataObject) -> None:
    """Invariant 1: for a partition holding several heads, whichever heads got a durable snapshot
    (and up to where), every event at or above the floor may be lost, none below it is."""
    last_touched: dict[str, int] = {}
    for offset, head in enumerate(log):
        last_touched[head] = offset
    durable: dict[str, int] = {}
    for head, last in last_touched.items():
        if data.draw(st.booleans()):  # this head was snapshotted, up to some offset of its own
            mine = [o for o, h in enumerate(log) if h == head and o <= last]
            durable[head] = data.draw(st.sampled_from(mine))
    floor = safe_floor(len(log), last_touched, durable)
    for offset, head in enumerate(log):
        covered = offset <= durable.get(head, -1)
        if offset < floor:
            assert covered, f"event {offset} of head {head} is below the floor {floor} but not durable"
    assert 0 <= floor <= len(log)


def test_floor_when_every_head_is_durable_is_the_next_offset() -> None:
    assert safe_floor(10, {"a": 4, "b": 9}, {"a": 4, "b": 9}) == 10
    # the reported bug: two heads share a partition, one snapshot lags: the floor waits for it
    assert safe_floor(1179, {"a": 1178, "b": 1177}, {"a": 1178, "b": 1176}) == 1177


@given(st.integers(0, 3), st.integers(0, 10**12), st.text(max_size=30),
       st.dictionaries(st.text(min_size=1, max_size=20),
                       st.tuples(st.integers(1, 10**6), st.integers(-1, 10**12), st.text(max_size=64),
                                 st.lists(st.integers(0, 10**12), min_size=1, max_size=8)), max_size=5),
       st.booleans())
def test_checkpoint_record_round_trips(part: int, floor: int, topic_id: str, heads: dict, erasure: bool) -> None:
    cp = Checkpoint(part, floor, topic_id, {h: HeadPointer(g, o, s, tuple(p)) for h, (g, o, s, p) in heads.items()},
                    erasure_pending=erasure)
    assert Checkpoint.decode(cp.encode()) == cp


def test_a_checkpoint_without_pending_erasure_encodes_as_before() -> None:
    """The flag is written only when set: records of workers that predate it read as 'none pending'."""
    old = b'{"format":"unlearn.ledger-checkpoint/v1","partition":0,"floor":3,"topic_id":"t","heads":{}}'
    assert Checkpoint.decode(old) == Checkpoint(0, 3, "t")
    assert Checkpoint(0, 3, "t").encode() == old
    assert b'"erasure_pending":true' in Checkpoint(0, 3, "t", erasure_pending=True).encode()
    with pytest.raises(StaleStateError):
        Checkpoint.decode(old[:-1] + b',"erasure_pending":"yes"}')


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"[]", b'{"format": "other"}', b'{"format": "unlearn.ledger-checkpoint/v1"}'])
def test_an_unreadable_checkpoint_is_a_stale_state_error(raw: bytes) -> None:
    with pytest.raises(StaleStateError):
        Checkpoint.decode(raw)


def test_recovery_resumes_at_the_floor_of_a_matching_log() -> None:
    cp = Checkpoint(2, 120, "T1")
    assert check_recovery(cp, "T1", 0, 500) == 120
    assert check_recovery(cp, "T1", 0, 120) == 120  # nothing new since
    assert check_recovery(None, "T1", 0, 500) == 0  # no state yet: build from the start of the log
    assert check_recovery(cp, "", 0, 500) == 120  # a broker without topic ids: offsets still checked


@pytest.mark.parametrize(("cp", "topic_id", "start", "end", "words"), [
    (Checkpoint(1, 131, "OLD"), "NEW", 0, 500, "recreated"),  # another incarnation of the topic
    (Checkpoint(1, 131, "T"), "T", 0, 40, "ends at 40"),  # a fresh broker: the log is shorter
    (Checkpoint(1, 131, ""), "T", 0, 0, "ends at 0"),  # an earlier broker's state, topic ids unknown
    (Checkpoint(1, 131, "T"), "T", 200, 500, "starts at 200"),  # retention ate unprocessed events
    (None, "T", 7, 500, "starts at offset 7"),  # no state and the log is no longer complete
])
def test_recovery_refuses_state_that_does_not_belong_to_the_log(cp: Checkpoint | None, topic_id: str, start: int,
                                                               end: int, words: str) -> None:
    """Invariant 2: never skip silently; the error names the mismatch."""
    with pytest.raises(StaleStateError, match=words):
        check_recovery(cp, topic_id, start, end)


def test_the_latest_checkpoint_of_the_partition_wins() -> None:
    a, b, other = Checkpoint(0, 10, "T"), Checkpoint(0, 25, "T"), Checkpoint(1, 99, "T")
    records = [
        (3, checkpoint_key(0), a.encode()),
        (4, b"piece/h/0/0", b"..."),
        (9, checkpoint_key(1), other.encode()),
        (12, checkpoint_key(0), b.encode()),
        (13, checkpoint_key(0), None),  # a tombstone is not a checkpoint
    ]
    assert latest_checkpoint(records, 0) == b
    assert latest_checkpoint(reversed(records), 0) == b  # by offset, not by reading order
    assert latest_checkpoint(records, 1) == other
    assert latest_checkpoint(records, 2) is None


def test_first_needed_is_the_lowest_piece_a_checkpoint_names() -> None:
    """Trimming ledger-state below it keeps every piece the checkpoint names (and the checkpoint
    record, written after them); a checkpoint naming no head trims nothing."""
    pointers = {"a": HeadPointer(1, 10, "00", (40, 41, 45)), "b": HeadPointer(2, 11, "00", (37,)),
                "c": HeadPointer(1, 12, "00", (50, 52))}
    assert first_needed(pointers) == 37
    assert first_needed({}) is None
