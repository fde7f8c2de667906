"""Refusals (streams/featurizer/refusals.py): dead letters for every refused request, rejected
receipts only for deletes, salvaged from an invalid request when its ids are usable."""

from __future__ import annotations

from tests.streams.featurizer.test_featurize import add, batch, cfg, delete, raw
from unlearn.schemas.envelope import parse_request
from unlearn.streams.featurizer.refusals import refusal, salvage_delete_ids


def test_refusal_gives_receipts_only_for_deletes() -> None:
    (m,) = batch(delete("d", "h", "s", "x"))
    dl, receipt = refusal(m, parse_request(m.value), "unknown_sample", "gone", cfg(), 1.0)
    assert dl.reason == "unknown_sample" and dl.event_id == "d" and dl.stage == "featurizer"
    assert receipt is not None and receipt.reason == "unknown_sample" and receipt.sample_ids == ("x",)
    (m,) = batch(add("a", "h", "s", "x", [1, 0]))
    assert refusal(m, parse_request(m.value), "duplicate_add", "dup", cfg(), 1.0)[1] is None
    bad = raw(op="delete", event_id="e", subject_id="s", head_id="h", sample_id="x", client_id=7)
    ids = salvage_delete_ids(bad)
    assert ids == {"op": "delete", "event_id": "e", "subject_id": "s", "head_id": "h", "sample_ids": ["x"]}
    assert salvage_delete_ids(raw(op="add", event_id="e", subject_id="s", head_id="h")) is None
    assert salvage_delete_ids(b"\xff") is None and salvage_delete_ids(None) is None
