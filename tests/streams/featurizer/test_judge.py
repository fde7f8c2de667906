"""Judging requests (streams/featurizer/judge.py): adds and deletes decided against a cache view,
without writing to it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.streams.featurizer.test_featurize import K, MemCache, add, cfg, delete, delete_subject, ref_q
from unlearn.features.contract import FeatureRejected
from unlearn.schemas.envelope import parse_request
from unlearn.streams.featurizer.cache_view import CachedSample, HeadInfo
from unlearn.streams.featurizer.judge import judge_add, judge_delete, judge_delete_subject


def test_judge_steps_are_pure_decisions() -> None:
    cache = MemCache()
    head = HeadInfo("h", "features", "features", 2, "class", 0, K, 0)
    cache.heads["h"] = head
    cs = CachedSample("h", "x", "s", "c1", "add-x", 1, np.array([1, 2], np.int64))
    cache.samples[("h", "x")] = cs
    req = parse_request
    assert judge_delete(req(delete("d", "h", "s", "x")), cache) == [cs]
    with pytest.raises(FeatureRejected) as exc:
        judge_delete(req(delete("d", "h", "other", "x")), cache)
    assert exc.value.reason == "subject_mismatch"
    assert judge_delete_subject(req(delete_subject("ds", "h", "s")), cache) == [cs]
    assert judge_delete_subject(req(delete_subject("ds", "h", "nobody")), cache) == []  # removes nothing
    assert judge_delete(req(delete("d", "h", "s", "nope")), cache) == []
    later = CachedSample("h", "x", "s", "c1", "add-x", 1, np.array([1, 2], np.int64), event_us=7_000_000)
    cache.samples[("h", "x")] = later  # re-added after the delete's event time: the add wins
    assert judge_delete(req(delete("d", "h", "s", "x")), cache, 6_999_999) == []
    assert judge_delete(req(delete("d", "h", "s", "x")), cache, 7_000_000) == [later]
    assert judge_delete_subject(req(delete_subject("ds", "h", "s")), cache, 6_999_999) == []
    cache.samples[("h", "x")] = cs
    new, got_head, is_new = judge_add(req(add("a", "h", "s", "y", [0, 2], 0)), np.array([0.0, 2.0]), "features",
                                      cache, cfg())
    assert got_head is head and not is_new and new.q.tolist() == ref_q([0, 2]).tolist()
    with pytest.raises(FeatureRejected, match="duplicate_add"):
        judge_add(req(add("a", "h", "s", "x", [0, 2], 0)), np.array([0.0, 2.0]), "features", cache, cfg())
    with pytest.raises(FeatureRejected, match="dimension_mismatch"):
        judge_add(req(add("a", "h", "s", "z", [1, 2, 3], 0)), np.array([1.0, 2, 3]), "features", cache, cfg())
    assert cache.samples.keys() == {("h", "x")}  # nothing was written: the caller applies decisions
