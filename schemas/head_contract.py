"""A head's contract: ``head-registry`` records, ``unlearn.head-contract/v1``, JSON because operators
and other languages read it.

A head's contract declares everything that must stay fixed for its
ledger to stay meaningful: the feature dimension, the backbone and input kind, the preprocessing
(L2 normalization, feature bound, quantization grids), gamma and the label space (a class count,
optionally with class names, or a target-vector width). The featurizer refuses what falls outside
it, and serving quantizes with it, so neither depends on its own settings nor on the data seen so
far (docs/registry.md). The class columns of a head never depend on data: only an explicit
:meth:`HeadContract.extend` grows the label space, and each change bumps ``version``.
:func:`parse_contract` is strict: unknown fields, wrong types and out-of-range values raise
:class:`ContractError` naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson

from unlearn.ledger.quantization import MAX_CLASS_INDEX
from unlearn.schemas.registry_record import check_id_and_version, load_document, open_document, require_fields, typed

__all__ = [
    "HEAD_CONTRACT_SCHEMA_V1",
    "INPUT_KINDS",
    "MAX_CONTRACT_CLASSES",
    "MAX_CONTRACT_DIM",
    "ContractError",
    "HeadContract",
    "decode_contract",
    "encode_contract",
    "parse_contract",
]

HEAD_CONTRACT_SCHEMA_V1 = "unlearn.head-contract/v1"
INPUT_KINDS: tuple[str, ...] = ("features", "text", "image")
MAX_CONTRACT_DIM = 65_536
"""Format limit on ``dimension``; deployments cap it lower (``UNLEARN_MAX_FEATURE_DIM``)."""
MAX_CONTRACT_CLASSES = MAX_CLASS_INDEX + 1
"""Format limit on the label space (the ledger's class-index limit); deployments cap it lower
(``UNLEARN_MAX_CLASSES``)."""
_MAX_LABEL_NAME = 256

_FIELDS = ("schema", "head_id", "version", "dimension", "backbone", "input_kind", "normalization",
           "feature_bound", "frac_bits", "label_frac_bits", "label_kind", "n_classes", "label_names",
           "label_width", "gamma", "origin")


class ContractError(ValueError):
    """A head contract that is malformed, out of range, or not a valid change of its predecessor."""


@dataclass(frozen=True)
class HeadContract:
    """One version of a head's contract (see the module docstring; fields as in the JSON).

    ``label_kind`` "class": labels are class indices ``0 <= y < n_classes`` (``label_names``,
    when given, names each class); "vector": labels are target vectors of ``label_width`` values.
    ``origin`` says who wrote it: "declared" (``unlearn heads``) or "auto" (the featurizer, on
    the first add of an undeclared head)."""

    head_id: str
    version: int
    dimension: int
    backbone: str
    input_kind: str
    normalization: Literal["l2", "none"]
    feature_bound: float
    frac_bits: int
    label_frac_bits: int
    label_kind: Literal["class", "vector"]
    gamma: float
    n_classes: int = 0
    label_names: tuple[str, ...] | None = None
    label_width: int = 0
    origin: Literal["declared", "auto"] = "declared"

    def __post_init__(self) -> None:
        _check(self)

    @property
    def normalize(self) -> bool:
        """Whether feature rows are L2-normalized before quantizing."""
        return self.normalization == "l2"

    @property
    def n_outputs(self) -> int:
        """The head's label columns: ``n_classes`` or ``label_width``."""
        return self.n_classes if self.label_kind == "class" else self.label_width

    def extend(self, n_classes: int | None = None, names: tuple[str, ...] = ()) -> HeadContract:
        """The next version with a larger class space: ``n_classes`` in total, or ``names``
        appended (a named label space grows by names only). Raises :class:`ContractError` for
        anything but growth: class-incremental learning adds columns, never removes or renames."""
        if self.label_kind != "class":
            raise ContractError(f"head {self.head_id!r} takes label vectors; only a class label space can grow")
        if self.label_names is not None:
            if n_classes is not None or not names:
                raise ContractError(f"head {self.head_id!r} names its classes: extend it with new names")
            return replace(self, version=self.version + 1, n_classes=self.n_classes + len(names),
                           label_names=(*self.label_names, *names))
        if names:
            raise ContractError(f"head {self.head_id!r} has unnamed classes: extend it with a class count")
        if n_classes is None or n_classes <= self.n_classes:
            raise ContractError(f"head {self.head_id!r} has {self.n_classes} classes: extend needs more, "
                                f"got {n_classes}")
        return replace(self, version=self.version + 1, n_classes=n_classes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (fields that do not apply to the label kind are left out)."""
        d: dict[str, Any] = {
            "schema": HEAD_CONTRACT_SCHEMA_V1, "head_id": self.head_id, "version": self.version,
            "dimension": self.dimension, "backbone": self.backbone, "input_kind": self.input_kind,
            "normalization": self.normalization, "feature_bound": self.feature_bound,
            "frac_bits": self.frac_bits, "label_frac_bits": self.label_frac_bits,
            "label_kind": self.label_kind, "gamma": self.gamma, "origin": self.origin,
        }
        if self.label_kind == "class":
            d["n_classes"] = self.n_classes
            if self.label_names is not None:
                d["label_names"] = list(self.label_names)
        else:
            d["label_width"] = self.label_width
        return d


def _check(c: HeadContract) -> None:
    """Every range rule of the format (the JSON Schema says the same)."""
    check_id_and_version("head_id", c.head_id, c.version, ContractError)
    if not 1 <= c.dimension <= MAX_CONTRACT_DIM:
        raise ContractError(f"dimension must be in 1..{MAX_CONTRACT_DIM}, got {c.dimension}")
    if not c.backbone or len(c.backbone) > 128:
        raise ContractError("backbone must be a backbone name of 1..128 characters")
    if c.input_kind not in INPUT_KINDS:
        raise ContractError(f"input_kind must be one of {INPUT_KINDS}, got {c.input_kind!r}")
    if c.normalization not in ("l2", "none"):
        raise ContractError(f"normalization must be 'l2' or 'none', got {c.normalization!r}")
    if not 1 <= c.frac_bits <= 30:
        raise ContractError(f"frac_bits must be in 1..30, got {c.frac_bits}")
    if not 0 <= c.label_frac_bits <= 30:
        raise ContractError(f"label_frac_bits must be in 0..30, got {c.label_frac_bits}")
    if not (math.isfinite(c.feature_bound) and c.feature_bound > 0):
        raise ContractError(f"feature_bound must be a finite number > 0, got {c.feature_bound}")
    if c.feature_bound * 2.0 ** c.frac_bits > 2.0 ** 30:
        raise ContractError(f"feature_bound * 2^frac_bits must be <= 2^30 (|q| <= 2^30), got "
                            f"{c.feature_bound} * 2^{c.frac_bits}")
    if not (math.isfinite(c.gamma) and c.gamma > 0):
        raise ContractError(f"gamma must be a finite number > 0, got {c.gamma}")
    if c.origin not in ("declared", "auto"):
        raise ContractError(f"origin must be 'declared' or 'auto', got {c.origin!r}")
    if c.label_kind == "class":
        if not 1 <= c.n_classes <= MAX_CONTRACT_CLASSES or c.label_width:
            raise ContractError(f"a class head needs n_classes in 1..{MAX_CONTRACT_CLASSES} and no label_width, "
                                f"got n_classes={c.n_classes}, label_width={c.label_width}")
        if c.label_names is not None:
            if len(c.label_names) != c.n_classes:
                raise ContractError(f"label_names has {len(c.label_names)} names for {c.n_classes} classes")
            if len(set(c.label_names)) != len(c.label_names) or not all(
                    isinstance(n, str) and 1 <= len(n) <= _MAX_LABEL_NAME for n in c.label_names):
                raise ContractError(f"label_names must be distinct strings of 1..{_MAX_LABEL_NAME} characters")
    elif c.label_kind == "vector":
        if not 1 <= c.label_width <= MAX_CONTRACT_CLASSES or c.n_classes or c.label_names is not None:
            raise ContractError(f"a vector head needs label_width in 1..{MAX_CONTRACT_CLASSES} and no n_classes "
                                f"or label_names, got label_width={c.label_width}")
    else:
        raise ContractError(f"label_kind must be 'class' or 'vector', got {c.label_kind!r}")


def _typed(d: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    return typed(d, name, kind, ContractError)


def parse_contract(d: Any) -> HeadContract:
    """A contract from its JSON object; raises :class:`ContractError` naming the first problem."""
    d = open_document(d, schema=HEAD_CONTRACT_SCHEMA_V1, fields=_FIELDS, what="a head contract", error=ContractError)
    require_fields(d, ["head_id", "version", "dimension", "backbone", "input_kind", "normalization", "feature_bound",
                       "frac_bits", "label_frac_bits", "label_kind", "gamma", "origin",
                       "n_classes" if d.get("label_kind") == "class" else "label_width"], ContractError)
    names = d.get("label_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise ContractError("label_names must be a list of strings")
    return HeadContract(
        head_id=_typed(d, "head_id", str), version=_typed(d, "version", int),
        dimension=_typed(d, "dimension", int), backbone=_typed(d, "backbone", str),
        input_kind=_typed(d, "input_kind", str), normalization=_typed(d, "normalization", str),
        feature_bound=float(_typed(d, "feature_bound", (int, float))),
        frac_bits=_typed(d, "frac_bits", int), label_frac_bits=_typed(d, "label_frac_bits", int),
        label_kind=_typed(d, "label_kind", str), gamma=float(_typed(d, "gamma", (int, float))),
        n_classes=_typed(d, "n_classes", int) if "n_classes" in d else 0,
        label_names=tuple(names) if names is not None else None,
        label_width=_typed(d, "label_width", int) if "label_width" in d else 0,
        origin=_typed(d, "origin", str),
    )


def encode_contract(c: HeadContract) -> bytes:
    """The record value on ``head-registry`` (key: the head id, UTF-8)."""
    return orjson.dumps(c.to_dict())


def decode_contract(raw: bytes) -> HeadContract:
    """A record value of ``head-registry``; raises :class:`ContractError` (also for bad JSON)."""
    return parse_contract(load_document(raw, ContractError))
