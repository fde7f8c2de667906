"""Event ids (``streams/featurizer/events.py``): one event id of a head means one request. Pure
core and the sqlite cache and changelog fold; on the broker: ``test_hostile_requests.py``."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.schemas.envelope import Request, encode_request, parse_request
from unlearn.schemas.request_inputs import FeaturesInput, TextInput
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.cache_view import CacheMutations
from unlearn.streams.featurizer.changelog_batches import batch_records
from unlearn.streams.featurizer.changelog_records import Position
from unlearn.streams.featurizer.changelog_restore import fold_changelog
from unlearn.streams.featurizer.core_config import CoreConfig
from unlearn.streams.featurizer.events import (
    ERASED,
    EventMark,
    decode_event,
    encode_event,
    event_key,
    event_value,
    legacy_fingerprint,
    open_event,
    request_fingerprint,
)
from unlearn.streams.featurizer.feature_cache import FeatureCache
from unlearn.streams.featurizer.featurize import featurize_batch

NOW = time.time()


def cfg() -> CoreConfig:
    return CoreConfig(requests_topic="t.requests", deltas_topic="t.deltas", deadletter_topic="t.deadletter",
                      receipts_topic="t.receipts")


def add(ev: str, sample: str, label: int = 0, values: tuple[float, ...] = (1.0, 2.0, 2.0), head: str = "h",
        ts: float | None = None, subject: str = "s") -> Request:
    return Request(ev, "add", head, "c1", subject, sample, label, FeaturesInput(values), ts)


def delete(ev: str, sample: str, head: str = "h", ts: float | None = None) -> Request:
    return Request(ev, "delete", head, "c1", "s", sample, ts=ts)


class Judge:
    """Batches judged against one sqlite cache, committed as the service commits them."""

    def __init__(self, path: Path) -> None:
        self.cache = FeatureCache(path)
        self.offset = 0

    def run(self, *reqs: Request) -> tuple[dict[str, str], dict[str, str], int]:
        """(event id -> dead-letter reason, event id -> receipt status, rows) of one batch."""
        msgs = []
        for r in reqs:
            msgs.append(InMessage(0, self.offset, encode_request(r), timestamp_ms=int(NOW * 1000) - 1000 + self.offset))
            self.offset += 1
        out = featurize_batch(msgs, self.cache, cfg(), now=NOW)
        self.cache.commit_batch(out.mutations, [], out.last_offset)
        dls = {d.event_id or "": d.reason for d in out.deadletters}
        receipts = {r.event_id: r.status for r in out.receipts}
        return dls, receipts, out.rows


def test_a_conflicting_add_under_a_taken_event_id_is_refused(tmp_path: Path) -> None:
    j = Judge(tmp_path / "c.sqlite")
    dls, _, rows = j.run(add("replay-1", "rp-a", 0), add("replay-1", "rp-b", 1))
    assert dls == {"replay-1": "event_id_conflict"} and rows == 1  # within one batch
    dls, _, rows = j.run(add("replay-1", "rp-c", 1, values=(3.0, 0.0, 1.0)))
    assert dls == {"replay-1": "event_id_conflict"} and rows == 0  # in a later batch
    assert [s.sample_id for s in j.cache.samples("h")] == ["rp-a"]
    # another head: another scope
    dls, _, rows = j.run(add("replay-1", "rp-b", 1, head="h2"))
    assert dls == {} and rows == 1


def test_a_resend_is_a_duplicate_and_existing_duplicate_add_stays(tmp_path: Path) -> None:
    j = Judge(tmp_path / "c.sqlite")
    first = add("e1", "x", 0, ts=NOW - 5)
    assert j.run(first)[2] == 1
    # a resend (same meaning, another ts) of a cached sample: the old reason, as before
    assert j.run(add("e1", "x", 0, ts=NOW - 1))[0] == {"e1": "duplicate_add"}
    # another event id for the cached sample: duplicate_add too (unchanged)
    assert j.run(add("e2", "x", 0))[0] == {"e2": "duplicate_add"}
    # a delete and its resend: the resend has no effect and no receipt of its own
    dls, receipts, rows = j.run(delete("d1", "x", ts=NOW - 0.5))
    assert (dls, receipts, rows) == ({}, {}, 1)
    dls, receipts, rows = j.run(delete("d1", "x", ts=NOW - 0.2))
    assert (dls, receipts, rows) == ({"d1": "duplicate_event"}, {}, 0)
    # the deleted add's event id is taken for good (its meaning erased with the sample)
    assert j.run(add("e1", "x", 0, ts=NOW - 0.1))[0] == {"e1": "event_id_erased"}
    # a tombstoning delete, resent: duplicate_event, no second receipt
    dls, receipts, _ = j.run(delete("d2", "never"))
    assert receipts == {"d2": "tombstoned"}
    dls, receipts, _ = j.run(delete("d2", "never"))
    assert (dls, receipts) == ({"d2": "duplicate_event"}, {})


def test_a_delete_under_an_add_event_id_is_a_conflict_with_a_rejected_receipt(tmp_path: Path) -> None:
    j = Judge(tmp_path / "c.sqlite")
    j.run(add("e1", "x"))
    dls, receipts, rows = j.run(delete("e1", "x"))
    assert (dls, receipts, rows) == ({"e1": "event_id_conflict"}, {"e1": "rejected"}, 0)
    assert j.cache.count("h") == 1


def test_refused_requests_take_no_event_id(tmp_path: Path) -> None:
    j = Judge(tmp_path / "c.sqlite")
    dls, _, _ = j.run(add("e1", "x", values=(0.0, 0.0, 0.0)))  # refused: zero_norm_feature
    assert dls == {"e1": "zero_norm_feature"}
    assert j.run(add("e1", "x"))[2] == 1  # the id is still free


def test_marks_expire_with_the_retention_but_a_cached_add_keeps_its_id(tmp_path: Path) -> None:
    """Marks are dropped by event time (an index range, whatever the cache holds); an add whose
    sample is still cached keeps its id through the sample itself."""
    j = Judge(tmp_path / "c.sqlite")
    week = 604_800.0
    j.run(add("old", "x", ts=NOW - week + 30), delete("gone", "y", ts=NOW - week + 30))
    assert {m.event_id for m in j.cache.all_events()} == {"old", "gone"}
    before_us = int((NOW + 60) * 1e6) - int(week * 1e6)  # a minute later, both are past the horizon
    expired = j.cache.expired_events(before_us, 10)
    assert sorted(expired) == [("h", "gone"), ("h", "old")]
    j.cache.commit_batch(CacheMutations(drop_events=tuple(expired)), [], j.offset + 100)
    j.offset += 101
    assert j.cache.all_events() == []
    assert j.run(add("old", "z", values=(0.0, 1.0, 0.0)))[0] == {"old": "event_id_conflict"}  # x holds it
    assert j.run(add("old", "x", ts=NOW - 1))[0] == {"old": "duplicate_add"}  # its resend: as before
    assert j.run(delete("old", "x"))[0] == {"old": "event_id_conflict"}
    assert j.run(delete("gone", "y"))[:2] == ({}, {"gone": "tombstoned"})  # a delete's id is free again


def test_the_fingerprint_is_of_the_meaning() -> None:
    a = add("e", "x", values=(0.0, 1.0, 2.0))
    assert request_fingerprint(a) == request_fingerprint(add("e", "x", values=(-0.0, 1.0, 2.0), ts=5.0))
    f32 = Request("e", "add", "h", "c1", "s", "x", 0, FeaturesInput(np.array([0, 1, 2], dtype="<f4"), "<f4"))
    assert request_fingerprint(a) == request_fingerprint(f32)
    assert request_fingerprint(parse_request(encode_request(a))) == request_fingerprint(a)  # type: ignore[arg-type]
    for other in (add("e", "y", values=(0.0, 1.0, 2.0)), add("e", "x", 1, values=(0.0, 1.0, 2.0)),
                  add("e", "x", values=(0.0, 1.0, 2.5)), add("e", "x", values=(0.0, 1.0, 2.0), subject="t"),
                  Request("e", "add", "h", "c1", "s", "x", 0, TextInput("hello"))):
        assert request_fingerprint(other) != request_fingerprint(a)


def test_the_v1_fingerprint_is_pinned_and_v2_differs_only_for_features() -> None:
    a = add("e", "x", values=(0.0, 1.0, 2.0))
    # the v1 form (the value the code before v2 gave): what marks written then hold
    assert legacy_fingerprint(a).hex() == "8d3476523854a0c1c25dd9c454ff0da3edf9a3b0a9ffd6b157acfd2a69e31c94"
    assert request_fingerprint(a) != legacy_fingerprint(a)
    text = Request("e", "add", "h", "c1", "s", "x", 0, TextInput("hello"))
    assert request_fingerprint(text) == legacy_fingerprint(text)
    # the length is part of the meaning: a vector is never the prefix of another one's bytes
    assert request_fingerprint(add("e", "x", values=(1.0, 2.0))) != request_fingerprint(add("e", "x", values=(1.0,)))


def test_marks_of_the_v1_fingerprint_still_judge_resends(tmp_path: Path) -> None:
    """A cache written by a featurizer before v2 (its marks hold v1 fingerprints): a resend is
    still a duplicate, another meaning still a conflict."""
    j = Judge(tmp_path / "c.sqlite")
    old_add, old_del = add("a1", "x", ts=NOW - 5), delete("d1", "y", ts=NOW - 5)
    marks = tuple(EventMark("h", r.event_id, legacy_fingerprint(r), int((NOW - 5) * 1e6)) for r in (old_add, old_del))
    j.cache.commit_batch(CacheMutations(put_events=marks), [], 100)
    j.offset = 101
    assert j.run(old_add)[0] == {"a1": "duplicate_event"}
    assert j.run(add("a1", "x", values=(1.0, 2.0, 3.0), ts=NOW - 5))[0] == {"a1": "event_id_conflict"}
    assert j.run(old_del)[0] == {"d1": "duplicate_event"}
    assert j.run(delete("d1", "z", ts=NOW - 5))[0] == {"d1": "event_id_conflict"}


@settings(max_examples=50, deadline=None)
@given(head=st.text(min_size=1, max_size=12), event=st.text(min_size=1, max_size=12),
       t=st.integers(0, 2**62), fp=st.binary(min_size=32, max_size=32), sample=st.text(max_size=8))
def test_event_records_round_trip(head: str, event: str, t: int, fp: bytes, sample: str) -> None:
    m = EventMark(head, event, fp, t, sample)
    assert decode_event(event_key(m.key), encode_event(m)) == m


def test_marks_come_back_from_the_changelog() -> None:
    """Event marks are cache state: written with their batch, folded back by a new owner (last
    value per key, a drop deletes)."""
    m = EventMark("h/1", "e/2", bytes(range(32)), 7, "x")
    erased = EventMark("h", "e", ERASED, 3)
    pos = Position(0, 5, "t.by-head", "", "lin", 1, 0, "", {}, "", 0)
    first = batch_records(0, "t.cache", CacheMutations(put_events=(m, erased)), [], pos, 1_000_000)
    second = batch_records(0, "t.cache", CacheMutations(drop_events=(erased.key,)), [],
                           Position(0, 6, "t.by-head", "", "lin", 2, 0, "", {}, "", 0), 1_000_000)
    folded = fold_changelog([(o.key, o.value) for o in [*first, *second]], 0)
    assert folded.events == {m.key: m}
    assert decode_event(event_key(m.key), encode_event(m)) == m
    with pytest.raises(ValueError):
        decode_event(b"event/3:abc", b"{}")


def test_an_add_mark_is_sealed_under_its_sample_key_and_erased_with_it() -> None:
    """With sealing, an add's fingerprint (a hash of its input) is sealed like its sample record:
    folded back while the key lives, an erased mark (the id still taken) once it is destroyed."""
    keys: dict[tuple[str, str], bytes] = {("h", "x"): b"k" * 16}

    def seal(head: str, sample: str, plain: bytes) -> bytes:
        return b"SEALED" + keys[(head, sample)] + plain[::-1]

    def open_(head: str, sample: str, raw: bytes) -> bytes:
        k = keys.get((head, sample))
        if k is None or not raw.startswith(b"SEALED" + k):
            raise KeyError("destroyed")
        return raw[len(b"SEALED") + 16:][::-1]

    add_mark = EventMark("h", "e1", bytes(range(32)), 11, "x")
    del_mark = EventMark("h", "d1", bytes(range(1, 33)), 12)
    value = event_value(add_mark, seal)
    assert bytes(range(32)).hex().encode() not in value  # the fingerprint is not readable
    assert event_value(del_mark, seal) == encode_event(del_mark)  # a delete's mark carries no input
    assert open_event(event_key(add_mark.key), value, open_) == add_mark
    del keys[("h", "x")]
    assert open_event(event_key(add_mark.key), value, open_) == EventMark("h", "e1", ERASED, 11)
