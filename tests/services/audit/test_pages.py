"""The page renderers without a broker: what an id can inject, and the history plot's edges."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import numpy as np

from tests.services.audit.support import rows_by_first, tables
from tests.services.serving.support import make_head
from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.delta_codec import Delta, RowsEntry, encode_delta
from unlearn.services.audit.certificates import Certifier
from unlearn.services.audit.pages import head_page, history_coverage, history_svg, index_page, subject_page
from unlearn.services.audit.views import (
    HeadView,
    IndexView,
    PendingDelete,
    Refusal,
    SubjectHead,
    pending_removals,
    sample_facts,
)
from unlearn.services.erasure.report import ErasureReport

EVIL = '<script>alert(1)</script>"\'&'


def test_ids_are_escaped_everywhere_they_are_shown() -> None:
    p = PendingDelete("ev<1>", EVIL, EVIL, "delete", EVIL, 1_000.0, "requests")
    html = index_page(IndexView({EVIL: make_head(2, head=EVIL)}, [p], now=1_060.0))
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "/subjects/%3Cscript%3Ealert%281%29%3C%2Fscript%3E%22%27%26" in html  # the link's path is quoted
    assert rows_by_first(tables(html)["pending"])["ev<1>"][5] == "60 s"
    assert "<script>alert" not in subject_page(EVIL, [])
    h = make_head(3, head=EVIL)
    assert "<script>alert" not in head_page(HeadView(EVIL, [h], h, [], {"head_id": EVIL}), None, "unlearn verify")


def test_the_plot_has_one_mark_per_version_by_mode_and_survives_one_point() -> None:
    one = history_svg([make_head(1)], [])
    assert one.count("<circle cx=") == 2  # the version and the legend's circle
    ups = [make_head(1), dataclasses.replace(make_head(2, "fast"), created_ts=make_head(1).created_ts + 5),
           dataclasses.replace(make_head(2), created_ts=make_head(1).created_ts + 6)]
    svg = history_svg(ups, [ups[0].created_ts + 1, ups[0].created_ts + 2])
    assert svg.count("<circle cx=") == 3 and svg.count("<rect x=") == 2  # exact: circles, fast: squares (+ legend)
    assert "version 2 fast: 20 samples" in svg and "2 deletes applied" in svg


def test_a_removal_already_in_deltas_is_a_pending_delete_dated_by_its_event_time() -> None:
    q = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    delta = Delta("h", "f", 3, 30, 0, [RowsEntry(1, ["e1"], ["s1"], ["u"], np.array([0]), q[:1]),
                                       RowsEntry(-1, ["e2", "e2"], ["s2", "s3"], ["v", "v"], np.array([0, 1]), q,
                                                 (7_000_000, 7_000_000), True)])
    got = pending_removals(LogRecord(0, 5, 9_000, b"h", encode_delta(delta)))
    assert [(p.event_id, p.head_id, p.subject_id, p.op, p.sample_id, p.received_ts, p.where) for p in got] == [
        ("e2", "h", "v", "delete_subject", "s2", 7.0, "deltas"),
        ("e2", "h", "v", "delete_subject", "s3", 7.0, "deltas")]
    assert pending_removals(LogRecord(0, 6, 9_000, b"h", b"not a delta")) == []


def test_sample_states_come_from_the_replay_the_receipts_and_the_refusals() -> None:
    rep = ErasureReport("h", "u", receipts=[
        {"event_id": "d1", "status": "applied", "sample_ids": ["s1"], "head_version": 4, "reason": None},
        {"event_id": "d2", "status": "rejected", "sample_ids": ["s2"], "head_version": None, "reason": "bad"},
        {"event_id": "d4", "status": "applied", "sample_ids": ["s4"], "head_version": 6, "reason": None},
        {"event_id": "d5", "status": "applied", "sample_ids": ["s5"], "head_version": 7, "reason": None},
        {"event_id": "d4b", "status": "applied", "sample_ids": ["s4"], "head_version": 9, "reason": None}],
        samples={"s1": ["k1"], "s2": ["k2"], "s4": ["k4"], "s5": ["k5"], "s6": ["k6"]})
    refused = [Refusal("h", "s3", "add", "dimension_mismatch", 1.0), Refusal("h", "s2", "delete", "bad", 1.0),
               Refusal("h", None, "delete_subject", "bad", 1.0),
               Refusal("h", "s5", "add", "deleted_before_arrival", 2.0)]
    # the replay retains s2 (its delete was refused), s4 (deleted twice, re-added after the second)
    facts = {f.sample_id: f for f in sample_facts(rep, refused, {"s2", "s4"})}
    assert sorted(facts) == ["s1", "s2", "s3", "s4", "s5", "s6"]
    assert facts["s1"].state == "deleted" and (facts["s1"].receipt or {}).get("event_id") == "d1"
    assert not facts["s1"].readded
    assert facts["s2"].state == "retained" and facts["s2"].receipt is None and not facts["s2"].readded
    assert facts["s3"].state == "refused" and facts["s3"].reason == "add: dimension_mismatch"
    assert facts["s4"].state == "retained" and facts["s4"].readded
    assert (facts["s4"].receipt or {}).get("event_id") == "d4b"  # the latest delete it came back after
    assert facts["s5"].state == "deleted" and facts["s5"].reason == "add: deleted_before_arrival"
    assert facts["s6"].state == "not retained" and facts["s6"].receipt is None
    html = subject_page("u", [SubjectHead("h", list(facts.values()), rep)])
    states = {k: v[1] for k, v in rows_by_first(tables(html)["samples"]).items()}
    assert states["s4"] == "retained (re-added after its delete)" and states["s1"] == "deleted"
    assert states["s6"].startswith("not retained")
    assert "first excluding every sample: none: 2 retained now" in html  # never the receipts' version


def test_certificates_are_computed_in_the_background_one_at_a_time() -> None:
    release = threading.Event()
    calls: list[tuple[str, int]] = []
    running = []

    def run(head: str, seed: int) -> dict[str, object] | None:
        running.append(1)
        assert len(running) == 1  # one at a time
        calls.append((head, seed))
        release.wait(10)
        running.pop()
        return None if head == "broken" else {"head": head, "seed": seed}

    async def scenario() -> None:
        c = Certifier(run)
        st = c.state(("h", 3, "exact"))  # answers at once: nothing finished, v3 computing
        assert (st.certificate, st.status) == (None, "computing")
        assert c.state(("g", 1, "exact")).status == "waiting"  # queued behind h
        assert c.state(("h", 4, "exact")).status == "waiting"  # h's newest version replaces nothing running
        release.set()
        await c.idle()
        assert calls == [("h", 3), ("g", 1), ("h", 4)]
        st = c.state(("h", 4, "exact"))
        assert st.status == "done" and st.current and st.certificate == {"head": "h", "seed": 4}
        release.clear()
        st = c.state(("h", 5, "fast"))  # a new version: the latest finished is shown, of its version
        assert st.status == "computing" and st.certifies == ("h", 4, "exact") and not st.current
        html = head_page(HeadView("h", [make_head(5, "fast")], make_head(5, "fast"), [], None),
                         dataclasses.replace(st, certificate={"ok": True, "summary": "PASS", "created_ts": 1.0,
                                                              "certificate_sha256": "ab", "checks": []}), "cmd")
        assert 'data-status="computing"' in html and "version 4 (exact)</span> (not the live version)" in html
        release.set()
        await c.idle()
        assert c.state(("broken", 1, "exact")).status == "computing"
        await c.idle()
        assert c.state(("broken", 1, "exact")).status == "computing again"  # a failed run is retried, said so
        await c.idle()

    asyncio.run(scenario())


def test_the_history_says_which_versions_it_covers_and_keeps_every_delete() -> None:
    t = make_head(1).created_ts
    full = [make_head(1), dataclasses.replace(make_head(2), created_ts=t + 5)]
    assert "Samples retained: every version from the first." in history_coverage(full, [t + 2])
    assert "oldest version kept" not in history_svg(full, [t + 2])
    # versions 5 and 7 left on the heads topics (6 compacted away); deletes from the receipts since t - 100
    kept = [dataclasses.replace(make_head(5), created_ts=t), dataclasses.replace(make_head(7), created_ts=t + 10)]
    deletes = [t - 100, t - 50, t + 5]
    text = history_coverage(kept, deletes)
    assert "only versions 5 to 7 (1 versions between them are gone too)" in text
    assert "nothing is shown of the samples retained before" in text
    assert "Deletes applied: all 3, from the receipts" in text
    svg = history_svg(kept, deletes)
    assert "oldest version kept: 5" in svg and "3 deletes applied (every receipt)" in svg
    steps = svg.split('<polyline points="')[1].split('"')[0].split()
    assert steps[0].startswith("48.0,")  # the deletes series starts at the first receipt, left of every version
    assert "Deletes applied: none yet" in history_coverage(kept, [])
    html = head_page(HeadView("h", kept, kept[-1], [], None), None, "cmd")
    assert 'id="history-coverage"' in html
