"""Head contracts in the featurizer's core: declared contracts win, undeclared heads get a bounded
auto contract, and no single add can size a head (the label 100000 case)."""

from __future__ import annotations

import numpy as np

from tests.streams.featurizer.test_featurize import MemCache, add, batch, cfg, no_encoder, ref_q
from unlearn.features.contract import quantize_feature_row
from unlearn.infra.settings import HeadSettings
from unlearn.schemas.delta_codec import decode_delta
from unlearn.schemas.head_contract import HeadContract, decode_contract
from unlearn.streams.featurizer.featurize import featurize_batch
from unlearn.streams.featurizer.head_contracts import with_registry


def declared(head: str = "h", **kw: object) -> HeadContract:
    base: dict = dict(head_id=head, version=1, dimension=4, backbone="features", input_kind="features",
                      normalization="l2", feature_bound=1.0, frac_bits=30, label_frac_bits=0, label_kind="class",
                      gamma=1.0, n_classes=3)
    return HeadContract(**{**base, **kw})


def reasons(out) -> list[tuple[str, str]]:
    return [(d.event_id, d.reason) for d in out.deadletters]


def test_label_outside_an_undeclared_heads_default_space_is_refused_and_never_sizes_it() -> None:
    config = cfg(registry_topic="t.head-registry", heads=HeadSettings(default_classes=10))
    cache = MemCache()
    out = featurize_batch(batch(add("big", "h", "s", "x0", [1, 0, 0, 0], 100000),
                                add("ok", "h", "s", "x1", [1, 0, 0, 0], 9)), cache, config, no_encoder)
    assert reasons(out) == [("big", "label_out_of_range")]
    assert "label space 0..9" in out.deadletters[0].detail and "unlearn heads extend" in out.deadletters[0].detail
    # the head exists from the accepted add, with the auto contract published alongside its delta
    (c,) = out.contracts
    assert (c.head_id, c.version, c.dimension, c.n_classes, c.origin, c.backbone) == ("h", 1, 4, 10, "auto", "features")
    msgs = out.messages(config)
    assert msgs[0].topic == "t.head-registry" and decode_contract(msgs[0].value) == c
    assert int(decode_delta(msgs[1].value).entries[0].labels.max()) == 9
    cache.apply(out.mutations)
    # later batches: same auto contract (derived from the cached facts), nothing republished
    out = featurize_batch(batch(add("big2", "h", "s", "x2", [0, 1, 0, 0], 10), start=2), cache, config, no_encoder)
    assert reasons(out) == [("big2", "label_out_of_range")] and out.contracts == []


def test_declared_contract_wins_and_extend_admits_a_new_class() -> None:
    c = declared(frac_bits=20, normalization="none", feature_bound=2.0)
    cache = MemCache()
    config = with_registry(cfg(registry_topic="t.head-registry"), {"h": c})
    out = featurize_batch(batch(add("a", "h", "s", "x0", [0.5, 1.5, 0, 0], 2),
                                add("new", "h", "s", "x1", [0.5, 0, 0, 0], 3),
                                add("d5", "h", "s", "x2", [0.5, 0, 0, 0, 0], 1),
                                add("vec", "h", "s", "x3", [0.5, 0, 0, 0], [1.0, 0.0])), cache, config, no_encoder)
    assert reasons(out) == [("new", "label_out_of_range"), ("d5", "dimension_mismatch"), ("vec", "label_mismatch")]
    assert out.contracts == []  # declared: never auto-published
    (delta,) = out.deltas
    assert delta.frac_bits == 20  # the contract's grid, not the settings' 30
    np.testing.assert_array_equal(delta.entries[0].q[0], quantize_feature_row(np.array([0.5, 1.5, 0, 0]), 20, 2.0,
                                                                              normalize=False))
    cache.apply(out.mutations)
    assert cache.heads["h"].frac_bits == 20
    config = with_registry(config, {"h": c.extend(4)})
    out = featurize_batch(batch(add("new", "h", "s", "x1", [0.5, 0, 0, 0], 3), start=4), cache, config, no_encoder)
    assert reasons(out) == [] and int(out.deltas[0].entries[0].labels[0]) == 3


def test_undeclared_heads_policy_and_conflicts() -> None:
    off = cfg(heads=HeadSettings(auto_create_heads=False))
    out = featurize_batch(batch(add("a", "h", "s", "x0", [1, 0, 0, 0], 0)), MemCache(), off, no_encoder)
    assert reasons(out) == [("a", "undeclared_head")] and not out.deltas
    # a head that holds rows on the settings' grid, declared afterwards on another grid
    cache = MemCache()
    out = featurize_batch(batch(add("a", "h", "s", "x0", [1, 0, 0, 0], 0)), cache, cfg(), no_encoder)
    cache.apply(out.mutations)
    np.testing.assert_array_equal(out.deltas[0].entries[0].q[0], ref_q([1, 0, 0, 0]))
    config = with_registry(cfg(), {"h": declared(frac_bits=20)})
    out = featurize_batch(batch(add("b", "h", "s", "x1", [1, 0, 0, 0], 0), start=1), cache, config, no_encoder)
    assert reasons(out) == [("b", "contract_conflict")]
    config = with_registry(cfg(), {"h": declared(backbone="features:4")})
    out = featurize_batch(batch(add("b", "h", "s", "x1", [1, 0, 0, 0], 0), start=1), cache, config, no_encoder)
    assert reasons(out) == [("b", "backbone_mismatch")]  # the cached head is on "features"
    # a vector head: the auto contract takes the first add's width, bounded by max_classes
    few = HeadSettings(default_classes=8, max_classes=8)
    out = featurize_batch(batch(add("w", "v", "s", "y0", [1, 0], [1.0] * 9)), MemCache(), cfg(heads=few),
                          no_encoder)
    assert reasons(out) == [("w", "label_out_of_range")]
    out = featurize_batch(batch(add("w", "v", "s", "y0", [1, 0], [1.0] * 3)), MemCache(), cfg(), no_encoder)
    assert [(c.label_kind, c.label_width, c.n_classes) for c in out.contracts] == [("vector", 3, 0)]
