"""streams/featurizer/delete_lane.py: which records a batch judges first (no broker), and the lane
end to end on a broker: sent first, exact, and exact again after a crash at each step of its commit."""

from __future__ import annotations

import time
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
from unlearn.schemas.source_id import parse_source, source_stream
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.delete_lane import LANE_SUFFIX, overtaking, split_lane
from unlearn.streams.featurizer.feature_cache import FeatureCache
from unlearn.streams.featurizer.routing import RouterSession


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


def test_a_fetched_delete_overtakes_the_judged_records_that_do_not_name_it() -> None:
    """``overtaking``: the deletes fetched while ``judged`` was judged take the lane when no record
    ahead of them (judged or fetched) names their ids; a judged delete never does (it is judged
    already), and a fetched delete kept in place keeps the fetched deletes behind it that it names."""
    judged, fetched = _msgs(A1, A2, D1), [InMessage(0, 3 + i, v) for i, v in enumerate((DS, A1))]
    assert [m.offset for m in overtaking(judged, fetched, lambda head: True)] == [3]
    of_x1 = _v(delete("dx", "h", "t", "x1"))
    assert overtaking(judged, [InMessage(0, 3, of_x1)], lambda head: True) == []  # a1 ahead names x1
    assert overtaking(judged, [InMessage(0, 3, DS)], lambda head: False) == []  # a head not in the cache
    assert overtaking([], [InMessage(0, 3, DS)], lambda head: True) == []  # nothing ahead: no lane
    x5 = _msgs(_v(add("a5", "h", "q", "x5", [1.0, 2.0], 0)))
    d2, d3, d4 = (_v(delete("d2", "h", "w", "x5")), _v(delete("d3", "h", "w", "x8")),
                  _v(delete("d4", "h", "v", "x11")))
    fetched = [InMessage(0, 1 + i, v) for i, v in enumerate((d2, d3, d4))]
    # d2 deletes the judged a5's sample: it stays, and the lane ends there (d3 shares d2's subject,
    # d4 would qualify): d2 may take a later batch's lane, which must not come below d4's
    assert overtaking(x5, fetched, lambda head: True) == []
    d4_first = [InMessage(0, 1 + i, v) for i, v in enumerate((d4, d2, d3))]
    assert [m.offset for m in overtaking(x5, d4_first, lambda head: True)] == [1]


def test_the_overtaking_lane_ends_at_the_first_fetched_delete_it_leaves_behind() -> None:
    """Lanes leave a partition in offset order (the ledger skips a lane delta whose source offset is
    not above the last one it applied): a delete left behind, for a head not in the cache yet or for
    a sample the judged records name, may take a later batch's lane, so nothing after it overtakes."""
    judged = _msgs(A1)
    other = _v(delete("dn", "new-head", "t", "x9"))
    d_ok, d_x1 = _v(delete("d5", "h", "w", "x7")), _v(delete("d6", "h", "w2", "x1"))
    fetched = [InMessage(0, 1 + i, v) for i, v in enumerate((A2, d_ok, other, DS))]
    known = lambda head: head == "h"  # noqa: E731
    assert [m.offset for m in overtaking(judged, fetched, known)] == [2]  # dn (offset 3) stays: DS too
    fetched = [InMessage(0, 1 + i, v) for i, v in enumerate((d_x1, d_ok))]
    assert overtaking(judged, fetched, known) == []  # d6 names a1's sample: d5 waits behind it
    assert [m.offset for m in overtaking(judged, fetched[1:], known)] == [2]


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


def _lane_order(delta_msgs: list, lane_event: str) -> dict[str, int]:
    """Each event's first deltas message (its index); asserts ``lane_event`` came from a lane."""
    deltas = [plain_delta(m.value(), m.topic()) for m in delta_msgs]
    (lane,) = {d.source_id for d in deltas if lane_event in d.event_ids}
    assert parse_source(lane)[0].endswith(LANE_SUFFIX)  # type: ignore[index]
    return {e: i for i, d in reversed(list(enumerate(deltas))) for e in d.event_ids}


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
    first_of = _lane_order(got["deltas"], "del-x3")
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


def _produce_late(s: Settings, reqs: list[tuple[str, bytes]], routed: bool) -> None:
    """To their head's by-head partition, as a producer that routes by head writes them, or with
    the origin headers another featurizer's router gives copies of requests partition 0's offsets
    100, 101, ... (``RouterSession``)."""
    from confluent_kafka import Producer

    from unlearn.runtime.clients import producer_config

    if not routed:
        _produce(s, reqs, True)
        return
    topic = routed_topic_name(s.topic("requests"))
    p = Producer(producer_config(s))
    parts = len(p.list_topics(topic, timeout=10).topics[topic].partitions)
    session = RouterSession(source_stream(s.topic("requests"), s.topic_prefix), parts)
    for i, (key, value) in enumerate(reqs):
        target, headers = session.route(value, 0, 100 + i)
        p.produce(topic, value=value, key=key.encode(), partition=target, headers=headers)
    assert p.flush(30) == 0


@pytest.mark.parametrize(("via", "crash_at"), [("by-head", None), ("by-head", "after_cache_commit"),
                                               ("router", None)])
def test_a_delete_fetched_while_the_adds_before_it_are_judged_is_committed_first(
        settings: Settings, tmp_path: Path, via: str, crash_at: str | None) -> None:
    """30 adds are judged as one batch; while they are (the ``judged`` hook), a delete of a wave-1
    sample and one more add arrive: the delete is committed and sent before the 30 adds (from the
    lane's source stream), the add after it waits for the next batch. ``via`` "router": both are
    copies forwarded by another featurizer's router from one requests partition, so the add's copy
    names the delete's as forwarded before it (and must not be taken for one sent after a failed
    forward, ``admit_routed``). With ``crash_at`` the featurizer dies right after the
    delete's commit: the next one judges the 30 adds and the add again, not the delete. Every row
    once, the digest of what is left, no dead letter."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    wave1, wave2 = _wave(0, 10, "alice"), _wave(10, 40, "bob")
    late = [("bob", delete("del-x3", "h1", "alice", "x3")[1]), *_wave(40, 41, "bob")]
    _produce(s, wave1, True)
    reader = Reader(s)
    points: list[str] = []

    class Crash(Exception):
        pass

    def fault(point: str) -> None:
        points.append(point)
        if point == "judged" and points.count("judged") == 1:
            _produce_late(s, late, via == "router")
            time.sleep(1.0)  # fetched by the client meanwhile (it prefetches in the background)
        elif crash_at is not None and point == crash_at and "judged" in points:
            raise Crash(point)

    try:
        first = Running(s, group="fz-overtake")
        reader.until(lambda g: {f"a{i}" for i in range(10)} <= set(ledgers_from(g["deltas"])[1]))
        assert first.stop() == 0
        _produce(s, wave2, True)
        runner = Running(s, group="fz-overtake", fault=fault, max_batch=1000, max_ms=1000)
        if crash_at is not None:
            assert isinstance(runner.wait_dead(40), Crash)
            runner = Running(s, group="fz-overtake", max_batch=1000, max_ms=1000)
        want = {f"a{i}" for i in range(41)} | {"del-x3"}
        got = reader.until(lambda g: want <= set(ledgers_from(g["deltas"])[1]))
        assert runner.stop() == 0
        if crash_at is None:
            assert runner.service.stats["lane_deletes"] == 1
            assert runner.service.stats["events"] == len(wave2) + len(late)  # each judged once
            assert runner.service.stats["gaps"] == runner.service.stats["reforwarded"] == 0
        else:
            assert runner.service.stats["events"] == len(wave2) + 1  # the adds again, not the delete
        got = reader.until(lambda g: True)
    finally:
        reader.close()
    first_of = _lane_order(got["deltas"], "del-x3")
    assert first_of["del-x3"] < min(first_of[f"a{i}"] for i in range(10, 40)) < first_of["a40"]
    ledgers, events = ledgers_from(got["deltas"])
    assert sorted(events) == sorted(want)  # each row once
    assert ledgers["h1"].digest() == reference_digest(_retained([*wave1, *wave2, *late], {"x3"}), "h1",
                                                      ledgers["h1"].n_outputs)
    assert [decode_deadletter(m.value()).reason for m in got["deadletter"]] == []  # nothing judged twice


def test_a_rebalance_while_the_fetched_deletes_are_looked_for_loses_and_doubles_nothing(
        settings: Settings, tmp_path: Path) -> None:
    """A second featurizer joins the group while the first has judged 30 adds and looks for deletes
    fetched meanwhile: the group's rebalance runs inside that fetch (the first member's revocation
    closes the judged part's cache, so the part is not committed). Whoever owns the partition next
    judges the adds and the delete: every row once, the digest of what is left, no dead letter."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    wave1, wave2 = _wave(0, 10, "alice"), _wave(10, 40, "bob")
    late = [("alice", delete("del-x3", "h1", "alice", "x3")[1]), *_wave(40, 41, "bob")]
    _produce(s, wave1, True)
    reader = Reader(s)
    seen: dict[str, int] = {}
    members: list[Running] = []

    def fault(point: str) -> None:
        loop = members[0].service.loop
        assert loop is not None
        if point == "judged" and "judged" not in seen:
            seen["judged"] = loop.rebalances
            _produce(s, late, True)
            members.append(Running(s.with_(data_dir=str(tmp_path / "data2")), group="fz-rebalance",
                                   max_batch=1000, max_ms=1000))
            time.sleep(8.0)  # the join is under way: the first member's next client call revokes
        elif point == "after_cache_commit" and "judged" in seen and "after" not in seen:
            seen["after"] = loop.rebalances

    try:
        first = Running(s, group="fz-rebalance")
        reader.until(lambda g: {f"a{i}" for i in range(10)} <= set(ledgers_from(g["deltas"])[1]))
        assert first.stop() == 0
        _produce(s, wave2, True)
        members.append(Running(s, group="fz-rebalance", fault=fault, max_batch=1000, max_ms=1000))
        want = {f"a{i}" for i in range(41)} | {"del-x3"}
        got = reader.until(lambda g: want <= set(ledgers_from(g["deltas"])[1]), timeout=90)
        for m in members:
            assert m.stop() == 0
        got = reader.until(lambda g: True)
    finally:
        reader.close()
    assert seen["after"] > seen["judged"]  # the rebalance ran inside the fetch
    ledgers, events = ledgers_from(got["deltas"])
    assert sorted(events) == sorted(want)  # each row once
    assert ledgers["h1"].digest() == reference_digest(_retained([*wave1, *wave2, *late], {"x3"}), "h1",
                                                      ledgers["h1"].n_outputs)
    assert [decode_deadletter(m.value()).reason for m in got["deadletter"]] == []


def test_a_fetched_delete_does_not_overtake_the_add_the_window_holds_for_the_next_batch(
        settings: Settings, tmp_path: Path) -> None:
    """The batch ends at its last delete and the window holds the add fetched behind it for the
    next batch; a delete of that add's sample fetched while the batch is judged must wait behind
    it (judged first it would find nothing to remove, and leave a tombstone that refuses the add):
    the add's row and the delete's negative row both reach the deltas, no refusal, no dead letter."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    wave1, wave2 = _wave(0, 10, "alice"), _wave(10, 40, "bob")
    tail = [("alice", delete("del-x1", "h1", "alice", "x1")[1]), *_wave(50, 51, "carol")]
    late = [("carol", delete("del-x50", "h1", "carol", "x50")[1]), *_wave(51, 52, "dave")]
    _produce(s, wave1, True)
    reader = Reader(s)
    points: list[str] = []

    def fault(point: str) -> None:
        points.append(point)
        if point == "judged" and points.count("judged") == 1:
            _produce(s, late, True)
            time.sleep(1.0)  # fetched by the client meanwhile

    try:
        first = Running(s, group="fz-tail")
        reader.until(lambda g: {f"a{i}" for i in range(10)} <= set(ledgers_from(g["deltas"])[1]))
        assert first.stop() == 0
        _produce(s, [*wave2, *tail], True)  # one fetch: the 30 adds and del-x1 a batch, a50 held behind
        runner = Running(s, group="fz-tail", fault=fault, max_batch=1000, max_ms=1000)
        got = reader.until(lambda g: "a51" in set(ledgers_from(g["deltas"])[1]))
        assert runner.stop() == 0
        got = reader.until(lambda g: True)
    finally:
        reader.close()
    ledgers, events = ledgers_from(got["deltas"])
    assert {"a50", "del-x50", "del-x1"} <= set(events)
    everything = [*wave1, *wave2, *tail, *late]
    assert ledgers["h1"].digest() == reference_digest(_retained(everything, {"x1", "x50"}), "h1",
                                                      ledgers["h1"].n_outputs)
    assert [decode_deadletter(m.value()).reason for m in got["deadletter"]] == []
