"""The feature contract: how an input becomes the exact integer row a head is trained on.

A head's features are ``q = rint(f * 2^k)`` of the (optionally L2-normalized) backbone output,
with every component inside a declared bound. Training (the featurizer) and serving must apply
*the same* contract, or served predictions silently differ from what the head learned; both
import it from here and nowhere else. The contract covers: which backbone an input goes through
(:func:`resolve_backbone`), the dimension a backbone fixes (:func:`fixed_dim`), the feature row
(:func:`quantize_feature_row`) and the label (:func:`quantize_label`). Every refusal is a
:class:`FeatureRejected` with a reason code (docs/featurizer.md lists them).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Literal

import numpy as np

from unlearn.features.backbones import BackboneError, backbone_cache_key, backbone_info
from unlearn.ledger import QuantizationError, Quantizer, l2_normalize
from unlearn.ledger.quantization import MAX_CLASS_INDEX

__all__ = [
    "DEFAULT_BACKBONES",
    "BatchQuantizer",
    "FeatureRejected",
    "LabelKind",
    "MIN_FEATURE_NORM",
    "QuantizeRow",
    "check_information",
    "fixed_dim",
    "quantize_feature_row",
    "quantize_feature_rows",
    "quantize_label",
    "quantizer",
    "resolve_backbone",
]

LabelKind = Literal["class", "vector"]
"""A head's label kind: class indices, or (quantized) target vectors."""

DEFAULT_BACKBONES: dict[str, str] = {"features": "features", "text": "minilm", "image": "efficientnet-lite0"}
"""Backbone per input kind when ``UNLEARN_HEAD_BACKBONES`` names none for the head: part of the
contract, since training (the featurizer) and serving must pick the same backbone for an input."""


class FeatureRejected(ValueError):
    """A feature vector the contract refuses: ``reason`` (a reason code) and ``detail``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


_QUANTIZERS: dict[tuple[int, float], Quantizer] = {}


def quantizer(frac_bits: int, bound: float) -> Quantizer:
    """The (cached) quantizer of a grid 2^-frac_bits and a bound."""
    key = (int(frac_bits), float(bound))
    qz = _QUANTIZERS.get(key)
    if qz is None:
        qz = _QUANTIZERS[key] = Quantizer(frac_bits, bound)
    return qz


def quantize_feature_row(f: np.ndarray, frac_bits: int, bound: float = 1.0, normalize: bool = True) -> np.ndarray:
    """q for ONE feature vector: ``Quantizer(k, bound).quantize(l2_normalize(f))`` in float64 (no
    normalization when ``normalize`` is False). Raises :class:`FeatureRejected`
    (``non_finite_feature``, ``feature_out_of_bound``); never clips. Public so a client can
    reproduce its q exactly."""
    x = np.asarray(f, dtype=np.float64).reshape(-1)
    if not np.isfinite(x).all():
        raise FeatureRejected("non_finite_feature", "a feature is NaN or infinite")
    if normalize:
        with np.errstate(over="ignore"):
            ss = float(np.dot(x, x))
        if not math.isfinite(ss):
            raise FeatureRejected("non_finite_feature", "the squared L2 norm overflows float64")
        x = l2_normalize(x)[0]
    try:
        return quantizer(frac_bits, bound).quantize(x)[0]
    except QuantizationError as exc:
        raise FeatureRejected("feature_out_of_bound", str(exc)) from None


MIN_FEATURE_NORM = 1e-12
"""The smallest L2 norm a training vector may have when its head normalizes: ``l2_normalize``'s
floor, below which a row would not come out of normalization with unit norm."""


def check_information(f: np.ndarray, q: np.ndarray, normalize: bool = True) -> None:
    """Refuse a training vector with no information (``zero_norm_feature``), never a zero row that
    counts in n while adding nothing to S or G: with normalization, an L2 norm below
    :data:`MIN_FEATURE_NORM` (all 0.0, all -0.0, subnormals like 5e-324: it cannot be scaled to
    unit norm); with or without, a q of all zeros. The featurizer asks it of every add after
    quantizing (``q`` is :func:`quantize_feature_row`'s); a prediction query is not refused."""
    if normalize:
        x = np.asarray(f, dtype=np.float64).reshape(-1)
        norm = math.sqrt(float(np.dot(x, x)))  # finite: quantize_feature_row refused an overflow
        if norm < MIN_FEATURE_NORM:
            raise FeatureRejected("zero_norm_feature", f"the L2 norm {norm:.3g} is below {MIN_FEATURE_NORM:g}: the "
                                                       "vector cannot be normalized")
    if not np.asarray(q).any():
        raise FeatureRejected("zero_norm_feature", "every component quantizes to 0: the row carries no information")


_SAFE_SQUARED_NORM = 1e300
"""Rows whose squared norm is above this take the per-row path: there the per-row overflow check
(``np.dot``, another summation order) could in principle disagree with the batch's sum."""


def quantize_feature_rows(F: np.ndarray, frac_bits: int, bound: float = 1.0,
                          normalize: bool = True) -> list[np.ndarray | FeatureRejected]:
    """:func:`quantize_feature_row` of every row of ``F`` (n, d): q, or the refusal it raises,
    bit for bit (property-tested in tests/features/test_contract.py). Why: the featurizer
    quantizes a batch's rows in a few numpy calls instead of a dozen per row; the per-row function
    stays the specification (clients reproduce q with it). Rows that are not finite, near
    overflow, or out of bound take the per-row function itself, so refusals are its own."""
    X = np.asarray(F, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"F must be 2-d (rows), got shape {X.shape}")
    qz = quantizer(frac_bits, bound)
    out: list[np.ndarray | FeatureRejected | None] = [None] * X.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        ok = np.isfinite(X).all(axis=1)
        if normalize:
            ok &= np.einsum("ij,ij->i", X, X) <= _SAFE_SQUARED_NORM
        fast = np.flatnonzero(ok)
        Y = l2_normalize(X[fast]) if normalize else X[fast]
        good = (np.abs(Y) <= qz.bound).all(axis=1)  # NaN compares False: per-row path
        Q = np.rint(Y[good] * qz.scale).astype(np.int64)
    for i, q in zip(fast[good].tolist(), Q, strict=True):
        out[i] = q
    for i, q in enumerate(out):
        if q is None:
            try:
                out[i] = quantize_feature_row(X[i], frac_bits, bound, normalize)
            except FeatureRejected as exc:
                out[i] = exc
    return [q for q in out if q is not None]


QuantizeRow = Callable[[np.ndarray, int, float, bool], np.ndarray]
"""``(f, frac_bits, bound, normalize) -> q``: :func:`quantize_feature_row` or a :class:`BatchQuantizer`."""


class BatchQuantizer:
    """``quantize_feature_row`` for the rows of one batch: the first row of a (grid, bound,
    normalization, dimension) asking quantizes every row of that dimension in one
    :func:`quantize_feature_rows` call; later rows look theirs up (rows are known by identity).
    Same results and refusals as the per-row function; a row it was not built with takes it."""

    def __init__(self, rows: Iterable[object]) -> None:
        self._rows = [r for r in rows if isinstance(r, np.ndarray) and r.ndim == 1]
        self._done: dict[tuple[int, float, bool, int], dict[int, np.ndarray | FeatureRejected]] = {}

    def __call__(self, f: np.ndarray, frac_bits: int, bound: float = 1.0, normalize: bool = True) -> np.ndarray:
        """q of ``f`` (a row given at construction, else computed now); raises FeatureRejected."""
        key = (int(frac_bits), float(bound), bool(normalize), int(np.shape(f)[0]) if np.ndim(f) == 1 else -1)
        done = self._done.get(key)
        if done is None:
            rows = [r for r in self._rows if r.shape[0] == key[3]]
            qs = quantize_feature_rows(np.stack(rows), frac_bits, bound, normalize) if rows else []
            done = self._done[key] = {id(r): q for r, q in zip(rows, qs, strict=True)}
        got = done.get(id(f))
        if got is None:
            return quantize_feature_row(f, frac_bits, bound, normalize)
        if isinstance(got, FeatureRejected):
            raise FeatureRejected(got.reason, got.detail)
        return got


def quantize_label(label: int | tuple[float, ...], label_frac_bits: int) -> tuple[LabelKind, int, int | np.ndarray]:
    """(kind, width, value) of a request's label: a class index (width 0), or the int64 target
    vector ``rint(y * 2^k_y)``. Part of the contract because the ledger sums exactly these
    integers; raises :class:`FeatureRejected` (``label_out_of_range``,
    ``soft_label_needs_label_frac_bits``) rather than clip or round silently."""
    if isinstance(label, int):
        if not 0 <= label <= MAX_CLASS_INDEX:
            raise FeatureRejected("label_out_of_range", f"class index {label} exceeds {MAX_CLASS_INDEX}")
        return "class", 0, int(label)
    y = np.asarray(label, dtype=np.float64)
    if y.size > MAX_CLASS_INDEX + 1:
        raise FeatureRejected("label_out_of_range",
                              f"label vector of {y.size} values is wider than {MAX_CLASS_INDEX + 1}")
    if label_frac_bits == 0 and not np.all(y == np.rint(y)):
        raise FeatureRejected("soft_label_needs_label_frac_bits",
                              "label vector has non-integer values; set UNLEARN_LABEL_FRAC_BITS > 0 to quantize them")
    try:
        qy = quantizer(label_frac_bits, float(2 ** (30 - label_frac_bits))).quantize(y)[0]
    except QuantizationError as exc:
        raise FeatureRejected("label_out_of_range", f"label vector: {exc}") from None
    return "vector", int(qy.shape[0]), qy


def resolve_backbone(head_id: str, input_kind: str, configured: str | None = None) -> tuple[str, str]:
    """(registry name, cache key) of the backbone a head's ``input_kind`` input goes through:
    ``configured`` (``UNLEARN_HEAD_BACKBONES``) or :data:`DEFAULT_BACKBONES`. One rule for
    training and serving, so both see the same features. Raises :class:`FeatureRejected`
    (``backbone_unavailable``, ``backbone_mismatch``)."""
    name = configured or DEFAULT_BACKBONES[input_kind]
    try:
        kind, key = _backbone_kind_key(name)
    except BackboneError as exc:
        raise FeatureRejected("backbone_unavailable", f"head {head_id!r}: {exc}") from None
    if kind != input_kind:
        raise FeatureRejected("backbone_mismatch",
                              f"head {head_id!r} uses backbone {key!r} ({kind} inputs), got a {input_kind} input")
    return name, key


@functools.lru_cache(maxsize=256)
def _backbone_kind_key(name: str) -> tuple[str, str]:
    """(input kind, cache key) of a registry name: the registry is fixed at import, and the
    featurizer asks this for every add (a name that raises is not cached)."""
    return backbone_info(name).kind, backbone_cache_key(name)


def fixed_dim(backbone_key: str) -> int | None:
    """The feature dimension a backbone cache key fixes (``features:64`` -> 64, ``minilm`` -> 384),
    or None when the first add decides (plain ``features``, unknown names). Checked on a head's
    first add so a head never starts with a dimension its backbone cannot produce."""
    if backbone_key.startswith("features:"):
        return int(backbone_key.split(":", 1)[1])
    try:
        return backbone_info(backbone_key.split("@", 1)[0]).dim
    except BackboneError:
        return None
