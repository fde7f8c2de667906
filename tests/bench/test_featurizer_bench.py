"""Smoke tests of the feature-encoding parts of bench/featurizer_bench.py and bench/app_requests.py:
well-formed numbers at a tiny size, requests that parse to the vectors they were built from, and a
load spread over heads on different by-head partitions.
No timing assertions (timings are only printed by the benches)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import app_requests, featurizer_bench
from unlearn.schemas.envelope import parse_request
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.services.client.sdk import FEATURES_ENCODINGS


def test_wire_costs_cover_every_encoding() -> None:
    rows = featurizer_bench.wire_costs(dim=16, n=20, repeats=2)
    assert [r["encoding"] for r in rows] == list(FEATURES_ENCODINGS)
    for r in rows:
        assert r["dim"] == 16 and r["dtype"] == FEATURES_ENCODINGS[r["encoding"]]
        for key in ("bytes_per_request", "parse_us", "quantize_us", "events_per_s"):
            assert math.isfinite(r[key]) and r[key] > 0
    size = {r["encoding"]: r["bytes_per_request"] for r in rows}
    assert size["f32"] < size["f64"] < size["json"]


@pytest.mark.parametrize("encoding", sorted(FEATURES_ENCODINGS))
def test_pipeline_bench_requests_carry_their_vectors(encoding: str) -> None:
    f = np.random.default_rng(3).normal(size=32)
    dtype = FEATURES_ENCODINGS[encoding]
    key, value = app_requests.request(7, "add", "bench-x", f, 4, dtype)
    req = parse_request(value)
    assert key == b"user7" and (req.event_id, req.head_id, req.sample_id, req.label) == ("bench-x.add7", "bench-x",
                                                                                           "s7", 4)
    assert isinstance(req.input, FeaturesInput) and req.input.dtype == dtype
    np.testing.assert_array_equal(req.input.values, f.astype(np.float32) if dtype == "<f4" else f)
    delete = parse_request(app_requests.request(7, "delete", "bench-x")[1])
    assert (delete.op, delete.event_id, delete.input) == ("delete", "bench-x.delete7", None)


def test_load_heads_spread_lands_on_as_many_by_head_partitions_as_they_can() -> None:
    from unlearn.common.by_head import head_partition

    plain = app_requests.load_heads("bench-f32", 4)
    assert plain == ["bench-f32", "bench-f32.load1", "bench-f32.load2", "bench-f32.load3"]
    for n, parts in ((4, 4), (6, 4), (3, 8)):
        heads = app_requests.load_heads("bench-f32", n, parts)
        assert heads[0] == "bench-f32" and len(set(heads)) == n
        assert len({head_partition(h, parts) for h in heads}) == min(n, parts)
