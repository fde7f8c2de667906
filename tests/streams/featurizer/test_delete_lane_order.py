"""The delete lanes against offset order, no broker: a property test of ``delete_lane``.

The featurizer commits a batch's lane first, then the deletes fetched while the batch's rest was
judged (``overtaking``), then the rest, then the next batch (its own lane first). Against a judge
whose answer to a record depends only on the state its ids name (the sample, the subject, the
event id), every record must get the answer offset order gives it, and the lanes must leave the
partition with rising offsets (the ledger skips a lane delta whose source offset is not above the
last one it applied)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.streams.featurizer.test_service import add, delete, delete_subject
from unlearn.schemas.envelope import Request, parse_request
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.cache_view import CachedSample, CacheMutations
from unlearn.streams.featurizer.delete_lane import overtaking, split_lane
from unlearn.streams.featurizer.feature_cache import FeatureCache

HEADS, SUBJECTS, SAMPLES = ("h", "g", "new"), ("s", "t", "u"), ("x0", "x1", "x2", "x3")
KNOWN = frozenset({"h", "g"})  # heads in the cache before the batch ("new" gets its first add later)


class Model:
    """A judge with the locality of the real one: adds refused for a sample already held or an
    event id seen, deletes applied when the sample is held under their subject, a delete_subject
    removes the subject's samples; each answer depends only on the state the record names."""

    def __init__(self) -> None:
        self.samples = {("h", "x0"): "s", ("g", "x1"): "t"}
        self.events: set[str] = set()

    def judge(self, value: bytes) -> str:
        r = orjson.loads(value)
        if r["event_id"] in self.events:
            return "duplicate event"
        self.events.add(r["event_id"])
        key = (r["head_id"], r.get("sample_id"))
        if r["op"] == "add":
            if key in self.samples:
                return "sample held"
            self.samples[key] = r["subject_id"]
            return "added"
        if r["op"] == "delete":
            if key not in self.samples:
                return "nothing to delete"
            if self.samples[key] != r["subject_id"]:
                return "subject mismatch"
            del self.samples[key]
            return "deleted"
        gone = [k for k, subject in self.samples.items() if k[0] == r["head_id"] and subject == r["subject_id"]]
        for k in gone:
            del self.samples[k]
        return f"deleted {len(gone)}"

    def held(self, r: Request) -> list[str]:
        """``delete_lane.Held`` of this state (``batch._held`` of the cache)."""
        if r.op == "delete_subject":
            return [k[1] for k, subject in self.samples.items() if k[0] == r.head_id and subject == r.subject_id]
        subject = self.samples.get((r.head_id, r.sample_id or ""))
        return [] if subject is None else [subject]


@st.composite
def records(draw: st.DrawFn) -> list[InMessage]:
    n = draw(st.integers(2, 14))
    out = []
    for i in range(n):
        op = draw(st.sampled_from(["add", "add", "delete", "delete", "delete_subject"]))
        head, subject = draw(st.sampled_from(HEADS)), draw(st.sampled_from(SUBJECTS))
        sample = draw(st.sampled_from(SAMPLES))
        event = draw(st.sampled_from([f"e{i}", f"e{i}", f"e{i}", "e0"]))  # now and then an event id again
        if op == "add":
            value = add(event, head, subject, sample, [1.0, 2.0], 0)[1]
        elif op == "delete":
            value = delete(event, head, subject, sample)[1]
        else:
            value = delete_subject(event, head, subject)[1]
        if draw(st.integers(0, 9)) == 0:  # an escaped character: the record may name anything
            value = value.replace(b'"app"', b'"\\u0041pp"')
        out.append(InMessage(0, i, value))
    return out


def _lane(msgs: list[InMessage], known: set[str], model: Model) -> tuple[list[InMessage], list[InMessage]]:
    return split_lane(msgs, lambda head: head in known, held=model.held)


@settings(max_examples=5000, deadline=None)
@given(records(), st.data())
def test_lanes_give_every_record_the_answer_of_offset_order(msgs: list[InMessage], data: st.DataObject) -> None:
    cut = data.draw(st.integers(1, len(msgs)))  # the batch: msgs[:cut]
    upto = data.draw(st.integers(cut, len(msgs)))  # fetched while its rest was judged: msgs[cut:upto]
    reference = Model()
    want = {m.offset: reference.judge(m.value) for m in msgs}

    model, known, got = Model(), set(KNOWN), {}
    lane_offsets: list[int] = []

    def commit(part: list[InMessage], lane: bool) -> None:
        for m in part:
            got[m.offset] = model.judge(m.value)
            if got[m.offset] == "added":  # the head is in the cache from its first accepted add on
                known.add(orjson.loads(m.value)["head_id"])
        if lane and part:
            assert lane_offsets == [] or part[-1].offset > lane_offsets[-1], "a lane below an earlier lane"
            lane_offsets.append(part[-1].offset)

    batch, fetched = msgs[:cut], msgs[cut:upto]
    lane1, rest = _lane(batch, known, model)
    commit(lane1, True)
    lane2 = overtaking(batch, fetched, lambda head: head in known, held=model.held)
    commit(lane2, True)
    commit(rest, False)
    taken = {m.offset for m in lane2}
    following = [m for m in msgs[cut:] if m.offset not in taken]
    lane3, rest3 = _lane(following, known, model) if following else ([], [])
    commit(lane3, True)
    commit(rest3, False)
    assert got == want, "|".join(f"{m.offset}:{m.value.decode()}" for m in msgs) + f" cut={cut} upto={upto}"


def test_the_batch_processor_reads_the_ties_from_the_cache(tmp_path: Path) -> None:
    """``batch._held`` (the ``Held`` the processor passes): a delete's sample's subject, a
    delete_subject's samples, nothing for a sample or subject the cache does not hold."""
    from unlearn.streams.featurizer.batch import _held

    def sample(sample_id: str, subject: str) -> CachedSample:
        return CachedSample("h", sample_id, subject, "app", f"a-{sample_id}", 0, np.zeros(2, np.int64))

    def req(value: bytes) -> Request:
        return parse_request(value)

    with FeatureCache(tmp_path / "c.sqlite") as cache:
        cache.commit_batch(CacheMutations(put_samples=(sample("x0", "s"), sample("x1", "s"), sample("x2", "t"))), [], 0)
        assert _held(cache, req(delete("d", "h", "u", "x2")[1])) == ["t"]  # named by another subject
        assert _held(cache, req(delete("d", "h", "s", "x9")[1])) == []
        assert sorted(_held(cache, req(delete_subject("ds", "h", "s")[1]))) == ["x0", "x1"]
        assert _held(cache, req(delete_subject("ds", "g", "s")[1])) == []
