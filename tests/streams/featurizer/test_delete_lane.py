"""streams/featurizer/delete_lane.py: which records a batch judges first (no broker), and the lane
end to end on a broker: sent first, exact, and exact again after a crash at each step of its commit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.sealed_support import plain_delta
from tests.streams.featurizer.test_service import Reader, Running, add, delete, delete_subject, ledgers_from, produce
from tests.streams.featurizer.test_service import reference as reference_digest
from unlearn.common.by_head import head_partition, routed_topic_name
from unlearn.infra.settings import Settings
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.schemas.source_id import parse_source
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.delete_lane import LANE_SUFFIX, split_lane
from unlearn.streams.featurizer.feature_cache import FeatureCache


def _msgs(*values: bytes) -> list[InMessage]:
    return [InMessage(0, i, v) for i, v in enumerate(values)]


def _v(req: tuple[str, bytes]) -> bytes:
    return req[1]


A1, A2 = _v(add("a1", "h", "s", "x1", [1.0, 2.0], 0)), _v(add("a2", "h", "s", "x2", [2.0, 1.0], 1))
D1, DS = _v(delete("d1", "h", "t", "x0")), _v(delete_subject("ds", "h", "u"))


def split_lane_all(msgs: list[InMessage], signed: bool = False) -> tuple[list[InMessage], list[InMessage]]:
    return split_lane(msgs, lambda head: True, signed)


def test_the_deletes_after_other_records_are_judged_first_in_their_order() -> None:
    lane, rest = split_lane_all(_msgs(A1, D1, A2, DS))
    assert [m.offset for m in lane] == [1, 3] and [m.offset for m in rest] == [0, 2]


def test_a_delete_whose_judging_a_record_ahead_could_change_keeps_its_place() -> None:
    """What a delete is told depends on its head, sample, subject, event id and (signed mode) its
    client's state: a record ahead naming one keeps it in offset order (delete_lane.py)."""
    of_x1, of_s = _v(delete("d-x1", "h", "s", "x1")), _v(delete_subject("ds", "h", "s"))
    other = _v(add("b1", "h", "t", "y1", [1.0, 2.0], 0))
    assert split_lane_all(_msgs(A1, of_x1)) == ([], _msgs(A1, of_x1))  # its add: refused instead of removed
    assert split_lane_all(_msgs(A1, of_s)) == ([], _msgs(A1, of_s))
    lane, rest = split_lane_all(_msgs(A1, of_s, of_x1))  # s's add ahead keeps of_s, which keeps of_x1
    assert lane == [] and len(rest) == 3
    lane, rest = split_lane_all(_msgs(other, of_s, of_x1))  # both take the lane, in their order
    assert [m.offset for m in lane] == [1, 2] and [m.offset for m in rest] == [0]
    lane, rest = split_lane_all(_msgs(of_s, other, of_x1))  # of_s stays first: x1 must not pass it
    assert lane == [] and len(rest) == 3
    lane, rest = split_lane_all(_msgs(other, of_x1, A1))  # x1's add comes after its delete: no matter
    assert [m.offset for m in lane] == [1] and [m.offset for m in rest] == [0, 2]
    same_event = _v(add("d-x1", "h", "t", "y2", [1.0, 2.0], 0))  # one of the two would be refused
    assert split_lane_all(_msgs(same_event, of_x1)) == ([], _msgs(same_event, of_x1))
    x10 = _v(add("a10", "h", "t", "x10", [1.0, 2.0], 0))
    assert [m.offset for m in split_lane_all(_msgs(x10, of_x1))[0]] == [1]  # "x10" does not name "x1"
    assert split_lane(_msgs(other, of_x1), lambda head: False) == ([], _msgs(other, of_x1))  # a new head


def test_a_record_with_escapes_ahead_may_name_anything() -> None:
    """JSON may write an id with escapes ("x\\u0031" is "x1"): such a record's strings are not read
    without a parse, so no delete passes it (its bytes are searched only for what they plainly hold)."""
    escaped = A1.replace(b'"x1"', b'"x\\u0031"')
    assert orjson.loads(escaped)["sample_id"] == "x1"
    of_x1 = _v(delete("d-x1", "h", "t", "x1"))
    assert split_lane_all(_msgs(escaped, of_x1)) == ([], _msgs(escaped, of_x1))
    assert split_lane_all(_msgs(escaped, D1)) == ([], _msgs(escaped, D1))


def test_in_signed_mode_a_clients_requests_keep_their_order() -> None:
    """Its token bucket and replay window make every request of a client depend on the ones
    before: of four deletes over a burst of two, the last two are the ones refused."""
    mine = [_v(delete(f"d{i}", "h", f"s{i}", f"x{i}", client="slow")) for i in range(2)]
    other, own_add = _v(add("b1", "h", "t", "y1", [1.0, 2.0], 0)), _v(add("b2", "h", "t", "y2", [1.0, 2.0], 0, "slow"))
    assert [m.offset for m in split_lane_all(_msgs(other, *mine), signed=True)[0]] == [1, 2]  # their order kept
    assert split_lane_all(_msgs(mine[0], other, mine[1]), signed=True) == ([], _msgs(mine[0], other, mine[1]))
    assert split_lane_all(_msgs(own_add, *mine), signed=True) == ([], _msgs(own_add, *mine))
    assert [m.offset for m in split_lane_all(_msgs(own_add, *mine))[0]] == [1, 2]  # unsigned: no client state


def test_nothing_before_a_delete_means_no_lane() -> None:
    assert split_lane_all(_msgs(D1, A1)) == ([], _msgs(D1, A1))
    assert split_lane_all(_msgs(A1, A2)) == ([], _msgs(A1, A2))
    assert split_lane_all([]) == ([], [])


def test_only_valid_deletes_take_the_lane() -> None:
    """An add whose bytes hold '"delete' and a malformed delete keep their place (the malformed
    one's dead letter is the rest's)."""
    sneaky = encode_request(Request("e", "add", "h", "app", "s", "delete-me", 0, FeaturesInput((1.0, 2.0))))
    assert b'"delete' in sneaky
    broken = b'{"op": "delete", "event_id": 3}'
    assert split_lane_all(_msgs(A1, sneaky, broken)) == ([], _msgs(A1, sneaky, broken))


# --------------------------------------------------------------------------- on a broker
def _wave(n0: int, n1: int, subject: str) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(n0)
    return [add(f"a{i}", "h1", subject, f"x{i}", list(rng.normal(size=3)), i % 3) for i in range(n0, n1)]


def _retained(reqs: list[tuple[str, bytes]], gone: set[str]) -> dict[tuple[str, str], tuple[list[float], int]]:
    out = {}
    for _, raw in reqs:
        d = orjson.loads(raw)
        if d["op"] == "add" and d["sample_id"] not in gone:
            out[(d["head_id"], d["sample_id"])] = (d["input"]["values"], d["label"])
    return out


def _produce(s: Settings, reqs: list[tuple[str, bytes]], direct: bool) -> int:
    """To ``requests`` (the router forwards, with origin headers) or, as a producer that routes by
    head does, each straight to its head's by-head partition (no origin); the by-head topic's
    partition count."""
    from confluent_kafka import Producer

    from unlearn.runtime.clients import producer_config

    topic = routed_topic_name(s.topic("requests"))
    p = Producer(producer_config(s))
    parts = len(p.list_topics(topic, timeout=10).topics[topic].partitions)
    if not direct:
        produce(s, reqs)
        return parts
    for key, value in reqs:
        p.produce(topic, value=value, key=key.encode(), partition=head_partition(orjson.loads(value)["head_id"], parts))
    assert p.flush(30) == 0
    return parts


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "routed"])
@pytest.mark.parametrize("crash_at", [None, "after_cache_commit", "after_changelog", "after_produce"])
def test_a_delete_goes_ahead_of_the_adds_before_it_and_everything_stays_exact(
        settings: Settings, tmp_path: Path, direct: bool, crash_at: str | None) -> None:
    """Wave 1 fills the head; wave 2 is 30 adds then a delete of a wave-1 sample, judged as one
    batch: the delete's delta is produced before the adds' delta, from the lane's source stream.
    With ``crash_at``, the featurizer dies at that step of the lane's commit (the first of its run),
    and the next one re-judges the adds but not the delete: no duplicate_event dead letter, every
    row once after the ledger's source dedup, the digest of what is left."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    wave1, wave2 = _wave(0, 10, "alice"), _wave(10, 40, "bob")  # bob's adds do not name alice's x3
    _produce(s, wave1, direct)
    reader = Reader(s)
    first = Running(s, group="fz-lane")
    try:
        reader.until(lambda g: len(g["deltas"]) >= 1 and sum(len(plain_delta(m.value(), m.topic()).event_ids)
                                                           for m in g["deltas"]) >= 10)
        assert first.stop() == 0
        # keyed like bob's adds: one requests partition, so the router forwards them in this order
        _produce(s, [*wave2, ("bob", delete("del-x3", "h1", "alice", "x3")[1])], direct)
        if crash_at is not None:
            class Crash(Exception):
                pass

            def fault(point: str) -> None:
                if point == crash_at:
                    raise Crash(point)

            crashed = Running(s, group="fz-lane", fault=fault, max_batch=1000, max_ms=2000)
            assert isinstance(crashed.wait_dead(40), Crash)
            aheads = []
            for path in (tmp_path / "data" / "featurizer").glob("*/p*.sqlite"):
                with FeatureCache(path) as cache:  # the crash was in the lane's commit, after its sqlite part
                    aheads += [(cache.applied_offset, o) for o in cache.ahead_offsets()]
            assert [o - applied for applied, o in aheads] == [31]
        second = Running(s, group="fz-lane", max_batch=1000, max_ms=2000)
        got = reader.until(lambda g: {f"a{i}" for i in range(40)} | {"del-x3"}
                           <= set(ledgers_from(g["deltas"])[1]))
        assert second.stop() == 0
        assert second.service.stats["lane_deletes"] == (0 if crash_at else 1)  # a crash's was the first's
        assert second.service.stats["events"] == len(wave2) + (0 if crash_at else 1)  # judged once, counted once
        got = reader.until(lambda g: True)
    finally:
        reader.close()
    deltas = [plain_delta(m.value(), m.topic()) for m in got["deltas"]]
    (lane,) = {d.source_id for d in deltas if "del-x3" in d.event_ids}
    assert parse_source(lane)[0].endswith(LANE_SUFFIX)  # type: ignore[index]
    first_of = {e: i for i, d in reversed(list(enumerate(deltas))) for e in d.event_ids}
    assert first_of["del-x3"] < min(first_of[f"a{i}"] for i in range(10, 40))  # the delete went first
    ledgers, events = ledgers_from(got["deltas"])
    assert sorted(events) == sorted([f"a{i}" for i in range(40)] + ["del-x3"])  # each row once
    assert ledgers["h1"].digest() == reference_digest(_retained([*wave1, *wave2], {"x3"}), "h1",
                                                      ledgers["h1"].n_outputs)
    assert [decode_deadletter(m.value()).reason for m in got["deadletter"]] == []  # nothing judged twice


def test_a_delete_first_in_its_partition_goes_before_the_adds_of_another(settings: Settings, tmp_path: Path) -> None:
    """One batch holds 30 adds to a head on one by-head partition and, on a later-numbered one, a
    delete with nothing ahead of it in its partition (so no lane): the delete's partition is
    committed and its delta produced before the adds' commit starts; both heads stay exact."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    parts = _produce(s, [], True)
    heads = sorted((f"h{i}" for i in range(1, 40)), key=lambda h: head_partition(h, parts))
    adds_head, del_head = heads[0], heads[-1]
    assert head_partition(adds_head, parts) < head_partition(del_head, parts)
    rng = np.random.default_rng(3)
    wave1 = [add(f"a{i}", del_head, "alice", f"x{i}", list(rng.normal(size=3)), i % 3) for i in range(10)]
    adds = [add(f"b{i}", adds_head, "bob", f"y{i}", list(rng.normal(size=3)), i % 3) for i in range(30)]
    _produce(s, wave1, True)
    reader = Reader(s)
    try:
        first = Running(s, group="fz-first")
        reader.until(lambda g: {f"a{i}" for i in range(10)} <= set(ledgers_from(g["deltas"])[1]))
        assert first.stop() == 0
        _produce(s, [*adds, delete("del-x3", del_head, "alice", "x3")], True)
        second = Running(s, group="fz-first", max_batch=1000, max_ms=2000)
        got = reader.until(lambda g: {f"b{i}" for i in range(30)} | {"del-x3"}
                           <= set(ledgers_from(g["deltas"])[1]))
        assert second.stop() == 0
    finally:
        reader.close()
    assert second.service.stats["lane_deletes"] == 0
    ts = {e: m.timestamp()[1] for m in got["deltas"] for e in plain_delta(m.value(), m.topic()).event_ids}
    assert ts["del-x3"] < min(ts[f"b{i}"] for i in range(30))  # sent before the adds' commit began
    ledgers, _ = ledgers_from(got["deltas"])
    assert ledgers[del_head].digest() == reference_digest(_retained(wave1, {"x3"}), del_head,
                                                          ledgers[del_head].n_outputs)
    assert ledgers[adds_head].digest() == reference_digest(_retained(adds, set()), adds_head,
                                                           ledgers[adds_head].n_outputs)
    assert [decode_deadletter(m.value()).reason for m in got["deadletter"]] == []
