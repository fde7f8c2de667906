"""Head contracts (docs/registry.md): which contract an add is judged against, and the checks.

A declared contract (``unlearn heads create``, read from the head registry) wins: the first add
of a head takes its grid from it, and every add must match its backbone, input kind, dimension
and label space. An add to an undeclared head gets, when ``UNLEARN_AUTO_CREATE_HEADS`` is on (the
default), the **auto contract** (:func:`auto_contract`): the head's first-add facts with
``UNLEARN_DEFAULT_CLASSES`` classes (or the first add's vector width) and the settings'
preprocessing and gamma. It is a pure function of those facts and the settings, so it is the same
before and after the featurizer publishes it to the registry (with the head's first delta,
through the outbox). Either way no single add can size a head beyond its contract (the ledger
still sizes columns as the largest class seen plus one, now bounded by the contract).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

import numpy as np

from unlearn.features.backbones import backbone_cache_key
from unlearn.features.contract import FeatureRejected, resolve_backbone
from unlearn.schemas.envelope import Request
from unlearn.schemas.head_contract import HeadContract
from unlearn.streams.featurizer.cache_view import HeadInfo
from unlearn.streams.featurizer.core_config import CoreConfig

__all__ = [
    "with_registry",
    "AutoContracts",
    "auto_contract",
    "auto_contracts",
    "delta_contract",
    "judged_contract",
    "check_contract",
]


def with_registry(config: CoreConfig, contracts: Mapping[str, HeadContract]) -> CoreConfig:
    """``config`` for one batch: the registry's declared contracts, whose backbones also decide
    which backbone a head's inputs are encoded with (over ``UNLEARN_HEAD_BACKBONES``)."""
    backbones = {**config.head_backbones, **{h: c.backbone for h, c in contracts.items()}}
    return replace(config, contracts=dict(contracts), head_backbones=backbones)


def auto_contract(head_id: str, input_kind: str, dim: int, label_kind: str, label_width: int, frac_bits: int,
                  label_frac_bits: int, config: CoreConfig) -> HeadContract:
    """The contract of an undeclared head with these first-add facts (module docstring)."""
    name, _ = resolve_backbone(head_id, input_kind, config.head_backbones.get(head_id))
    vector = label_kind == "vector"
    return HeadContract(
        head_id=head_id, version=1, dimension=dim, backbone=name, input_kind=input_kind,
        normalization="l2" if config.heads.normalize_features else "none", feature_bound=config.heads.feature_bound,
        frac_bits=frac_bits, label_frac_bits=label_frac_bits, label_kind="vector" if vector else "class",
        gamma=config.heads.gamma_for(head_id),
        n_classes=0 if vector else config.heads.default_classes, label_width=label_width if vector else 0,
        origin="auto",
    )


def auto_contracts(new_heads: Iterable[HeadInfo], config: CoreConfig) -> list[HeadContract]:
    """The auto contracts to publish for heads a batch created without a declared contract."""
    return [auto_contract(h.head_id, h.input_kind, h.dim, h.label_kind, h.label_width, h.frac_bits,
                          h.label_frac_bits, config)
            for h in new_heads if h.head_id not in config.contracts]


def delta_contract(head: HeadInfo, config: CoreConfig) -> HeadContract | None:
    """The contract a head's delta names (its class count and version: ``schemas/delta_codec.py``),
    the one its adds were judged against in this batch: the declared one, else the auto one; None
    when neither applies (an undeclared head with auto-creation off: its delta names no contract)."""
    declared = config.contracts.get(head.head_id)
    if declared is not None:
        return declared
    if not config.heads.auto_create_heads:
        return None
    return auto_contract(head.head_id, head.input_kind, head.dim, head.label_kind, head.label_width,
                         head.frac_bits, head.label_frac_bits, config)


AutoContracts = dict[tuple[str, str, int, str, int, int, int], HeadContract]
"""One batch's auto contracts by their facts: the same ``config`` gives the same contract, and
building one (and checking it) for every add cost ~20 µs each."""


def judged_contract(r: Request, head: HeadInfo | None, dim: int, label_kind: str, label_width: int,
                    config: CoreConfig, memo: AutoContracts | None = None) -> HeadContract:
    """The contract an add is judged against: the declared one, else the auto contract of the
    head's facts (the cached ones, or this add's for a new head; kept in ``memo``, one batch's).
    Raises ``FeatureRejected``: ``undeclared_head`` when auto-creation is off,
    ``label_out_of_range`` for a vector wider than ``UNLEARN_MAX_CLASSES``."""
    declared = config.contracts.get(r.head_id)
    if declared is not None:
        return declared
    if not config.heads.auto_create_heads:
        raise FeatureRejected("undeclared_head", f"head {r.head_id!r} is not declared (`unlearn heads create`) and "
                                                 "UNLEARN_AUTO_CREATE_HEADS is off")
    assert r.input is not None
    facts: tuple[str, str, int, str, int, int, int]
    if head is not None:
        facts = (r.head_id, head.input_kind, head.dim, head.label_kind, head.label_width, head.frac_bits,
                 head.label_frac_bits)
    elif label_width > config.heads.max_classes:
        raise FeatureRejected("label_out_of_range", f"a label vector of {label_width} values is wider than "
                                                    f"UNLEARN_MAX_CLASSES={config.heads.max_classes}")
    else:
        facts = (r.head_id, r.input.kind, dim, label_kind, label_width, config.heads.frac_bits,
                 config.heads.label_frac_bits)
    found = None if memo is None else memo.get(facts)
    if found is None:
        head_id, input_kind, d, kind, width, frac_bits, label_frac_bits = facts
        found = auto_contract(head_id, input_kind, d, kind, width, frac_bits, label_frac_bits, config)
        if memo is not None:
            memo[facts] = found
    return found


def check_contract(r: Request, c: HeadContract, head: HeadInfo | None, backbone_key: str, dim: int,
                   label_kind: str, label_width: int, label: int | np.ndarray) -> None:
    """Raise ``FeatureRejected`` unless the add fits the contract: backbone and input kind
    (``backbone_mismatch``), dimension (``dimension_mismatch``), label kind and width
    (``label_mismatch``), class index inside the label space (``label_out_of_range``), and a
    head whose cached grid differs from its contract (``contract_conflict``: it was declared after
    its first add, on another grid)."""
    assert r.input is not None
    if backbone_cache_key(c.backbone) != backbone_key or c.input_kind != r.input.kind:
        raise FeatureRejected("backbone_mismatch",
                              f"head {r.head_id!r} declares backbone {c.backbone!r} on {c.input_kind} inputs "
                              f"(contract v{c.version}); this add resolves to {backbone_key!r} on a "
                              f"{r.input.kind} input")
    if dim != c.dimension:
        raise FeatureRejected("dimension_mismatch", f"head {r.head_id!r} declares d={c.dimension} (contract "
                                                    f"v{c.version}), this add has {dim} features")
    if label_kind != c.label_kind or label_width != c.label_width:
        what = "class indices" if c.label_kind == "class" else f"label vectors of width {c.label_width}"
        raise FeatureRejected("label_mismatch", f"head {r.head_id!r} declares {what} (contract v{c.version})")
    if isinstance(label, int) and label >= c.n_classes:
        raise FeatureRejected("label_out_of_range",
                              f"class {label} is outside head {r.head_id!r}'s label space 0..{c.n_classes - 1} "
                              f"(contract v{c.version}); `unlearn heads extend` grows it")
    if head is not None and (head.frac_bits, head.label_frac_bits) != (c.frac_bits, c.label_frac_bits):
        raise FeatureRejected("contract_conflict",
                              f"head {r.head_id!r} holds rows on grid frac_bits={head.frac_bits}, label_frac_bits="
                              f"{head.label_frac_bits}; its contract v{c.version} declares {c.frac_bits}, "
                              f"{c.label_frac_bits}")
