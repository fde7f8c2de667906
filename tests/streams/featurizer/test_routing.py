"""Routing by head, without a broker: the partition hash, the origin headers, and the exact
dropping of re-forwarded copies (``admit_routed``) under any pattern of router crashes."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.common.by_head import head_partition, routed_topic_name
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.delta_codec import decode_delta
from unlearn.schemas.envelope import Request, encode_request, is_valid_id
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.schemas.source_id import parse_source
from unlearn.streams.featurizer.batch_io import InMessage, Origin
from unlearn.streams.featurizer.core_config import CoreConfig
from unlearn.streams.featurizer.featurize import featurize_batch
from unlearn.streams.featurizer.routing import (
    ORIGIN_HEADER,
    PREVIOUS_HEADER,
    Admitted,
    RouterSession,
    admit_routed,
    might_delete,
    read_origin,
    route_partition,
    routing_head,
)


def req(head: str, **extra: object) -> bytes:
    return orjson.dumps({"schema": "unlearn.request/v1", "event_id": "e", "op": "delete_subject", "head_id": head,
                         "client_id": "c", "subject_id": "s", **extra})


def test_head_partition_is_the_documented_hash() -> None:
    # first 8 bytes of SHA-256(UTF-8 head id), big-endian, modulo the count: pinned, it is a contract
    assert [head_partition("alice", n) for n in (1, 2, 3, 4, 8, 1000)] == [0, 1, 2, 3, 7, 207]
    assert [head_partition("bob", n) for n in (4, 1000)] == [2, 650]
    assert head_partition("ü-subject", 1000) == 331  # UTF-8, not Latin-1 or UTF-16
    assert head_partition("alice", 4) == int("2bd806c97f0e00af", 16) % 4


def test_the_head_is_read_from_the_request_and_nothing_else() -> None:
    assert routing_head(req("alice")) == "alice"
    assert routing_head(req("alice", op="add", input={"kind": "text"})) == "alice"  # invalid, but routable
    for bad in (None, b"{not json", b"[1]", b'"alice"', orjson.dumps({"head_id": 7}), req(""), req("x" * 257),
                orjson.dumps({"schema": "unlearn.request/v1", "subject_id": "s"})):
        assert routing_head(bad) is None, bad
    # neither the key nor the subject plays a part; a record without a head stays with its
    # neighbours of the origin partition
    assert route_partition(req("alice"), 3, 4) == head_partition("alice", 4)
    assert route_partition(b"{not json", 6, 4) == 2 and route_partition(None, 1, 4) == 1


@given(st.sampled_from(["delete", "delete_subject"]), st.from_regex(r"[a-z0-9_.-]{1,12}", fullmatch=True),
       st.booleans())
@settings(max_examples=50, deadline=None)
def test_every_delete_is_seen_by_the_batch_window_hint(op: str, head: str, sdk: bool) -> None:
    # the hint may say "delete" of an add (a smaller batch), never miss a delete the SDK or a
    # plain JSON encoder writes (a delete that waits out the batch window)
    value = (encode_request(Request("e", op, "h", "c", "s", None if op == "delete_subject" else head))
             if sdk else orjson.dumps({"op": op, "head_id": head}, option=orjson.OPT_INDENT_2))
    assert might_delete(value)


def test_the_batch_window_hint_passes_ordinary_adds() -> None:
    assert not might_delete(encode_request(Request("e1", "add", "h", "c", "s", "x", 3, FeaturesInput((0.5, 1.0)))))
    assert not might_delete(None)


def test_router_headers_chain_each_origin_partition_per_target() -> None:
    r = RouterSession("requests", 4)
    alice, bob = head_partition("alice", 4), head_partition("bob", 4)
    assert alice != bob
    b1, h1 = r.route(req("alice"), 0, 10, [("trace", b"t1"), (ORIGIN_HEADER, b"requests/9@9")])
    b2, h2 = r.route(req("bob"), 0, 11)
    b3, h3 = r.route(req("alice"), 0, 12)
    b4, h4 = r.route(req("alice"), 1, 5)
    assert (b1, b2, b3, b4) == (alice, bob, alice, alice)
    # upstream headers are kept, a forged origin is not; the first of a session has no previous
    assert h1 == [("trace", b"t1"), (ORIGIN_HEADER, b"requests/0@10")]
    assert h2 == [(ORIGIN_HEADER, b"requests/0@11")]
    assert h3 == [(ORIGIN_HEADER, b"requests/0@12"), (PREVIOUS_HEADER, b"10")]  # bob's went elsewhere
    assert h4 == [(ORIGIN_HEADER, b"requests/1@5")]
    assert read_origin(h3, "requests") == Origin(0, 12, 10)
    assert read_origin(h1, "requests") == Origin(0, 10, None)
    r.reset(0)  # partition 0 assigned again: a new session
    assert r.route(req("alice"), 0, 12)[1] == [(ORIGIN_HEADER, b"requests/0@12")]
    assert r.route(req("alice"), 1, 6)[1][-1] == (PREVIOUS_HEADER, b"5")  # partition 1's session goes on


def test_read_origin_refuses_what_the_router_did_not_write() -> None:
    assert read_origin(None, "requests") is None
    assert read_origin([(ORIGIN_HEADER, b"requests.site-a/0@1")], "requests") is None  # another stream
    assert read_origin([(ORIGIN_HEADER, b"garbage")], "requests") is None
    assert read_origin([(ORIGIN_HEADER, b"\xff")], "requests") is None
    assert read_origin([(ORIGIN_HEADER, b"requests/0@5"), (PREVIOUS_HEADER, b"5")], "requests") is None
    assert read_origin([(ORIGIN_HEADER, b"requests/0@5"), (PREVIOUS_HEADER, b"x")], "requests") is None
    assert routed_topic_name("unlearn.requests") == "unlearn.requests.by-head"


def test_admit_drops_copies_and_records_after_a_lost_forward() -> None:
    msgs = [InMessage(0, i, b"{}", None, o) for i, o in enumerate([
        Origin(1, 5), Origin(1, 7, 5), Origin(2, 3),  # judged
        Origin(1, 5), Origin(1, 7, 5),  # a new session forwards them again: copies
        Origin(1, 12, 9),  # 9 was lost on the way (its session died before committing): dropped
        None,  # nobody routed it: its own origin
        Origin(1, 9), Origin(1, 12, 9),  # the next session: the lost one, then its successor
    ])]
    out = admit_routed(msgs, {2: 1})
    assert [m.offset for m in out.messages] == [0, 1, 2, 6, 7, 8]
    assert (out.reforwarded, out.gaps, out.origin_offsets) == (2, 1, {1: 12, 2: 3})
    assert admit_routed(msgs[:1], {1: 5}).messages == []  # state from earlier batches counts


# ---------------------------------------------------------------- router crashes, simulated
@settings(max_examples=200, deadline=None)
@given(seed=st.randoms(use_true_random=False), n_origin=st.integers(1, 3), n_routed=st.integers(1, 3),
       sessions=st.integers(1, 6))
def test_every_routed_record_is_judged_exactly_once(seed, n_origin: int, n_routed: int, sessions: int) -> None:
    """Requests partitions routed by sessions that forward in chunks, lose deliveries (a later
    record of the chunk may still land), crash before committing, or commit: each by-head log,
    cut into batches anywhere and read with ``admit_routed``, judges every origin record exactly
    once, and only on its head's partition."""
    rng = seed
    logs = {p: [f"h{rng.randrange(6)}" for _ in range(rng.randrange(1, 15))] for p in range(n_origin)}
    routed: dict[int, list[Origin]] = {b: [] for b in range(n_routed)}
    committed = dict.fromkeys(logs, 0)

    def session(clean: bool) -> None:
        router = RouterSession("requests", n_routed)
        for p, subjects in logs.items():
            at = committed[p]
            while at < len(subjects):
                chunk = range(at, min(len(subjects), at + rng.randrange(1, 5)))
                failed = False
                for off in chunk:
                    b, headers = router.route(req(subjects[off]), p, off)
                    if not clean and rng.random() < 0.15:
                        failed = True  # lost on the way; the records after it may still land
                        continue
                    origin = read_origin(headers, "requests")
                    assert origin is not None
                    routed[b].append(origin)
                if failed or (not clean and rng.random() < 0.2):
                    return  # the process dies before committing this chunk
                at = committed[p] = chunk[-1] + 1

    for _ in range(sessions):
        session(clean=False)
    session(clean=True)
    judged: list[tuple[int, int]] = []
    for b, origins in routed.items():
        state: dict[int, int] = {}
        i = 0
        while i < len(origins):
            size = rng.randrange(1, 6)
            batch = [InMessage(b, i + j, None, None, o) for j, o in enumerate(origins[i: i + size])]
            out = admit_routed(batch, state)
            state.update(out.origin_offsets)
            for m in out.messages:
                assert m.origin is not None
                assert head_partition(logs[m.origin.partition][m.origin.offset], n_routed) == b
                judged.append((m.origin.partition, m.origin.offset))
            i += size
    assert sorted(judged) == [(p, o) for p, subjects in logs.items() for o in range(len(subjects))]


def test_featurize_batch_judges_routed_records_once_and_names_their_origin() -> None:
    cfg = CoreConfig("t.requests", "t.deltas", "t.deadletter", "t.receipts", stream="requests.by-head",
                     routed_topic="t.requests.by-head")
    add = encode_request(Request("a1", "add", "h", "c", "alice", "x", 1, FeaturesInput((1.0, 0.0))))
    bad = b"{broken"
    msgs = [InMessage(2, 40, add, b"k", Origin(0, 7)), InMessage(2, 41, bad, b"k", Origin(3, 9)),
            InMessage(2, 42, add, b"k", Origin(0, 7)), InMessage(2, 43, bad, None)]

    class Empty:
        def get_sample(self, head_id: str, sample_id: str) -> None:
            return None

        def subject_samples(self, head_id: str, subject_id: str) -> list:
            return []

        def get_head(self, head_id: str) -> None:
            return None

    out = featurize_batch(msgs, Empty(), cfg, now=1.0, origins={3: 2})
    assert (out.accepted, out.reforwarded, out.gaps, out.last_offset) == (1, 1, 0, 43)  # no duplicate_add
    assert out.origin_offsets == {0: 7, 3: 9}
    (delta,) = [decode_delta(m.value) for m in out.messages(cfg) if m.topic == "t.deltas"]
    assert parse_source(delta.source_id) == ("requests.by-head", 2, 43)
    dls = [decode_deadletter(m.value) for m in out.messages(cfg) if m.topic == "t.deadletter"]
    # where the producer put it, not the by-head copy; an unrouted record names its own place
    assert [(d.topic, d.partition, d.offset) for d in dls] == [("t.requests", 3, 9), ("t.requests.by-head", 2, 43)]
    copies = featurize_batch(msgs[2:3], Empty(), cfg, now=1.0, origins=out.origin_offsets)
    assert (copies.last_offset, copies.reforwarded, copies.messages(cfg), copies.mutations.empty) == (42, 1, [], True)
    # a batch of a lane's records only (judged ahead: admitted, none left to judge) still moves the
    # origins, or the record forwarded after them would be taken for one after a failed forward
    ahead = featurize_batch(msgs[:1], Empty(), cfg, now=1.0, origins={},
                            admission=Admitted([], {0: 7}))
    assert (ahead.origin_offsets, ahead.messages(cfg), ahead.mutations.empty) == ({0: 7}, [], True)


_ids = st.text(alphabet="abcXYZ019._:@+-", min_size=1, max_size=12)
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                     st.sampled_from(["head_id", '"head_id"', "\\", "é"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["head_id", "a", "input"]), inner, max_size=3), max_leaves=6)


@settings(max_examples=400, deadline=None)
@given(before=st.dictionaries(st.sampled_from(["schema", "event_id", "op", "x", "head\u005fid"]), _values, max_size=4),
       head=st.one_of(_ids, _values, st.text(max_size=140)), after=st.dictionaries(
           st.sampled_from(["input", "label", "head_id", "y"]), _values, max_size=3),
       spaces=st.booleans(), cut=st.integers(0, 400))
def test_the_cheap_head_lookup_agrees_with_a_full_parse(before: dict[str, object], head: object,
                                                        after: dict[str, object], spaces: bool, cut: int) -> None:
    # whatever precedes or follows it (nested heads, duplicate keys, escapes, strings that look
    # like the key): a JSON document routes as its full parse says; a truncated one (not JSON)
    # routes by its head id only if one was certain before the cut, else by its origin
    doc = orjson.dumps({**before, "head_id": head, **after})
    if spaces:
        spaced = doc.replace(b'":', b'" :  ').replace(b',"', b', \n"')
        try:  # the replaces also hit string values (a head id ","): a raw newline there is not JSON
            orjson.loads(spaced)
            doc = spaced
        except orjson.JSONDecodeError:
            doc = orjson.dumps({**before, "head_id": head, **after}, option=orjson.OPT_INDENT_2)
    full = orjson.loads(doc).get("head_id")
    assert routing_head(doc) == (full if is_valid_id(full) else None)
    assert routing_head(b" \t{" + doc[1:]) == routing_head(doc)
    broken = doc[:cut]
    if broken != doc:
        assert routing_head(broken) in (None, full)


def test_the_cheap_head_lookup_answers_hostile_prefixes() -> None:
    # long runs that would make a backtracking scan explode (its cost: bench, not a timed test)
    for doc, head in ((b'{' + b'"a":1,' * 5000 + b'"head_id":"h"}', "h"), (b'{' + b'"head_id":1,' * 5000 + b'}', None),
                      (b'{"a":"' + b'x' * 100_000 + b'","head_id":"h"}', "h"), (b'{"a":' + b'1e' * 500 + b'}', None),
                      (b'{' + b'"a":1,' * 160 + b'"head_id":"h"}', "h")):
        assert routing_head(doc) == head


def test_the_cheap_head_lookup_is_never_fooled() -> None:
    # the full parse's answer, for the spellings a prefix scan could get wrong
    for doc, head in ((b'{"head_id":"a","head_id":"b"}', "b"),  # duplicate key: the last one wins
                      (b'{"head\\u005fid":"b","head_id":"a"}', "a"), (b'{"head_id":"a","head\\u005fid":"b"}', "b"),
                      (b'{"x":{"head_id":"a"}}', None), (b'{"x":[1],"head_id":"a"}', "a"),
                      (b'{"x":"head_id","head_id":"a"}', "a"), (b'["head_id","a"]', None),
                      (b'{"head_id":"a","s":"\\"head_id\\""}', "a"), (b'{"head_id" : "a" }', "a")):
        assert routing_head(doc) == head, doc
        d = orjson.loads(doc)
        assert (d.get("head_id") if type(d) is dict else None) == head
    # not JSON after a certain head id: routed by it (and dead-lettered there, not_json)
    assert routing_head(b'{"op":"add","head_id":"a","input":') == "a"
