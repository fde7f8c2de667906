"""``unlearn heads create|show|list|extend``: declare heads and grow their label space.

``create`` writes version 1 of a head's contract and refuses a head that exists; ``extend``
writes the next version with more classes (class-incremental learning), nothing else changes;
``show`` and ``list`` print the latest contracts as text or ``--json``. Defaults for what
``create`` is not told come from the settings (UNLEARN_FRAC_BITS, ...), so a declared head
matches what an auto-created one would be. Exit 0 on success, 1 when the registry refuses
(existing or unknown head, a change that is not growth), 2 for bad arguments or no broker.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Literal

from unlearn.infra.cli_args import add_broker_args, settings_help
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.schemas.head_contract import ContractError, HeadContract
from unlearn.services.registry.command import run_registry_command

__all__ = ["build_parser", "contract_from_args", "heads_main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``unlearn heads`` parser (one subparser per action)."""
    ap = argparse.ArgumentParser(prog="unlearn heads", description="Declare and inspect head contracts.")
    sub = ap.add_subparsers(dest="action", required=True)
    create = sub.add_parser("create", help="declare a new head (refuses an existing one)")
    create.add_argument("--head", required=True)
    create.add_argument("--dim", type=int, help="feature dimension (default: the backbone's, if it fixes one)")
    create.add_argument("--backbone", help="backbone name (default: UNLEARN_HEAD_BACKBONES, else by --input-kind)")
    create.add_argument("--input-kind", choices=("features", "text", "image"),
                        help="default: the backbone's, else features")
    space = create.add_mutually_exclusive_group(required=True)
    space.add_argument("--classes", type=int, help="number of classes (labels 0..N-1)")
    space.add_argument("--labels", help="comma-separated class names (class i is the i-th name)")
    space.add_argument("--label-width", type=int, help="width of target-vector labels")
    create.add_argument("--gamma", type=float, help="ridge gamma (default: UNLEARN_HEAD_GAMMAS / UNLEARN_GAMMA)")
    create.add_argument("--frac-bits", type=int, help="default: UNLEARN_FRAC_BITS")
    create.add_argument("--label-frac-bits", type=int, help="default: UNLEARN_LABEL_FRAC_BITS")
    create.add_argument("--feature-bound", type=float, help="default: UNLEARN_FEATURE_BOUND")
    create.add_argument("--normalization", choices=("l2", "none"),
                        help="default: l2 unless UNLEARN_NORMALIZE_FEATURES=false")
    extend = sub.add_parser("extend", help="grow a head's class space (bumps its contract version)")
    extend.add_argument("--head", required=True)
    more = extend.add_mutually_exclusive_group(required=True)
    more.add_argument("--classes", type=int, help="the new total number of classes")
    more.add_argument("--add-labels", help="comma-separated names of the new classes (named heads)")
    show = sub.add_parser("show", help="print a head's latest contract")
    show.add_argument("--head", required=True)
    lst = sub.add_parser("list", help="print every declared head")
    for p in (create, extend, show, lst):
        add_broker_args(p)
        settings_help(p, HeadSettings)
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return ap


def _names(raw: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in raw.split(",") if n.strip())


def contract_from_args(args: argparse.Namespace, settings: Settings) -> HeadContract:
    """Version 1 of a head's contract from ``create``'s options and the settings' defaults.
    Raises :class:`ContractError` (or ValueError) for a contract the deployment cannot take."""
    from unlearn.features.contract import FeatureRejected, fixed_dim, resolve_backbone

    heads = HeadSettings.of(settings)
    kind = args.input_kind
    name = args.backbone or heads.backbone_for(args.head)
    if name is not None and kind is None:
        from unlearn.features.backbones import BackboneError, backbone_info

        try:
            kind = backbone_info(name).kind
        except BackboneError as exc:
            raise ContractError(str(exc)) from None
    kind = kind or "features"
    try:
        name, key = resolve_backbone(args.head, kind, name)
    except FeatureRejected as exc:
        raise ContractError(exc.detail) from None
    fixed = fixed_dim(key)
    dim = args.dim if args.dim is not None else fixed
    if dim is None:
        raise ContractError(f"backbone {name!r} does not fix a dimension: give --dim")
    if fixed is not None and dim != fixed:
        raise ContractError(f"backbone {name!r} has d={fixed}, not {dim}")
    if dim > heads.max_feature_dim:
        raise ContractError(f"d={dim} exceeds UNLEARN_MAX_FEATURE_DIM={heads.max_feature_dim}")
    names = _names(args.labels) if args.labels is not None else None
    width = args.label_width or 0
    n_classes = len(names) if names is not None else (args.classes or 0)
    if max(n_classes, width) > heads.max_classes:
        raise ContractError(f"{max(n_classes, width)} label columns exceed UNLEARN_MAX_CLASSES={heads.max_classes}")
    normalization: Literal["l2", "none"] = args.normalization or ("l2" if heads.normalize_features else "none")
    return HeadContract(
        head_id=args.head, version=1, dimension=dim, backbone=name, input_kind=kind,
        normalization=normalization,
        feature_bound=heads.feature_bound if args.feature_bound is None else args.feature_bound,
        frac_bits=heads.frac_bits if args.frac_bits is None else args.frac_bits,
        label_frac_bits=heads.label_frac_bits if args.label_frac_bits is None else args.label_frac_bits,
        label_kind="vector" if width else "class",
        gamma=heads.gamma_for(args.head) if args.gamma is None else args.gamma,
        n_classes=0 if width else n_classes, label_names=names, label_width=width,
    )


def _text(c: HeadContract) -> str:
    space = (f"{c.n_classes} classes" + (f" ({', '.join(c.label_names)})" if c.label_names else "")
             if c.label_kind == "class" else f"target vectors of width {c.label_width}")
    return (f"{c.head_id}\tv{c.version}\td={c.dimension}\tbackbone={c.backbone} ({c.input_kind})\t"
            f"norm={c.normalization} bound={c.feature_bound:g} frac_bits={c.frac_bits} "
            f"label_frac_bits={c.label_frac_bits}\tgamma={c.gamma:g}\t{space}\t{c.origin}")


def heads_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn heads ...`` (module docstring)."""
    from unlearn.common.registry import RegistryError, publish_contract, read_contracts

    ap = build_parser()
    args = ap.parse_args(argv)

    def extend(current: HeadContract, settings: Settings) -> HeadContract | None:
        if args.action != "extend":
            return None  # show
        grown = current.extend(args.classes, _names(args.add_labels) if args.add_labels else ())
        max_classes = HeadSettings.of(settings).max_classes
        if grown.n_classes > max_classes:
            raise ContractError(f"{grown.n_classes} classes exceed UNLEARN_MAX_CLASSES={max_classes}")
        return grown

    return run_registry_command(
        ap, args, read=read_contracts, publish=publish_contract, key_arg="head",
        create=lambda settings: contract_from_args(args, settings), change=extend,
        exists="head {key!r} exists (contract v{version}); use `unlearn heads extend` to grow its label space",
        missing="head {key!r} is not declared (`unlearn heads list`)", text=_text,
        errors=(ContractError, RegistryError))
