"""Predictions: parse a request body, featurize its inputs exactly like training, score them.

Inputs go through the featurizer's pipeline and nothing else, all of it from the feature contract
(``unlearn.features.contract``) and the **head's contract** from the head registry
(``schemas/head.py``, docs/registry.md): its backbone and input kind, then
``quantize_feature_row`` with its normalization, bound and grid, then dequantization -- so a
served input is the very feature vector a training sample with that input contributed to the
ledger, whatever this process's own UNLEARN_FRAC_BITS and friends say. A head with no contract
in the registry (published before the registry existed) falls back to the settings, as before.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import numpy as np

from unlearn.features.contract import FeatureRejected, quantize_feature_row, quantizer, resolve_backbone
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.schemas.head import HeadContract, retained_class_list, score_rows
from unlearn.services.serving.store import ServedHead

__all__ = ["MAX_INPUTS", "MAX_TOP_K", "PredictError", "parse_predict_body", "predict", "prepare_inputs"]

#: At most this many inputs per predict request.
MAX_INPUTS = 1024
#: Largest ``top_k`` of a predict request (the label space cap's format limit is far above it).
MAX_TOP_K = 1024


class PredictError(ValueError):
    """A bad predict request: HTTP ``status`` with a machine-readable ``reason``."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.status = status
        self.reason = reason
        self.detail = detail


#: The input kinds of a predict body (exactly one per request).
_KINDS = ("features", "text", "image_png")


def _as_list(v: Any, kind: str) -> tuple[list[Any], bool]:
    """(items, batched): a single input or a list of them (a features list of lists is a batch)."""
    if kind == "features":
        if isinstance(v, list) and v and all(isinstance(r, list) for r in v):
            return v, True
        return [v], False
    if isinstance(v, list):
        return v, True
    return [v], False


def _backbone_name(settings: Settings, head_id: str, kind: str) -> str:
    """The backbone the featurizer uses for ``head_id``'s ``kind`` inputs (the contract's one rule,
    ``resolve_backbone``): a head configured for another input kind refuses, as the featurizer
    dead-letters; a backbone that cannot be resolved is the server's problem (500)."""
    try:
        name, _key = resolve_backbone(head_id, kind, HeadSettings.of(settings).backbone_for(head_id))
    except FeatureRejected as exc:
        raise PredictError(500 if exc.reason == "backbone_unavailable" else 400, exc.reason, exc.detail) from None
    return name


def parse_predict_body(body: Any) -> tuple[str, list[Any], bool]:
    """(kind, raw items, batched) from a predict JSON body; PredictError if malformed."""
    if not isinstance(body, dict):
        raise PredictError(400, "bad_body", "the body must be a JSON object")
    given = [k for k in _KINDS if k in body]
    unknown = sorted(set(body) - set(_KINDS))
    if unknown:
        raise PredictError(400, "bad_body", f"unknown field(s) {unknown}; give one of {list(_KINDS)}")
    if len(given) != 1:
        raise PredictError(400, "bad_body", f"give exactly one of {list(_KINDS)}, got {given or 'none'}")
    kind = given[0]
    items, batched = _as_list(body[kind], kind)
    if not items:
        raise PredictError(400, "bad_body", f"{kind}: no inputs")
    if len(items) > MAX_INPUTS:
        raise PredictError(400, "bad_body", f"{kind}: at most {MAX_INPUTS} inputs per request, got {len(items)}")
    for i, it in enumerate(items):
        if kind == "features":
            if (not isinstance(it, list) or not it
                    or not all(type(x) in (int, float) for x in it)):
                raise PredictError(400, "bad_features", f"input {i}: features must be a non-empty list of numbers")
        elif kind == "text":
            if not isinstance(it, str) or not it:
                raise PredictError(400, "bad_text", f"input {i}: text must be a non-empty string")
        else:
            if not isinstance(it, str):
                raise PredictError(400, "bad_base64", f"input {i}: image_png must be a base64 string")
            try:
                items[i] = base64.b64decode(it.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError) as exc:
                raise PredictError(400, "bad_base64", f"input {i}: image_png is not standard base64: {exc}") from None
    return kind, items, batched


def prepare_inputs(settings: Settings, head: ServedHead, kind: str, items: Sequence[Any],
                   contract: HeadContract | None = None) -> np.ndarray:
    """Raw inputs -> the dequantized feature rows (n, d) the ledger would have seen for them:
    backbone (text/image), L2 normalization, quantization, dequantization, all as ``contract``
    (the head's, from the registry) declares; without one, as the settings say. Blocking (runs
    the model)."""
    head_id = head.update.head_id
    input_kind = "image" if kind == "image_png" else kind
    if contract is None:
        name = _backbone_name(settings, head_id, input_kind)
        heads = HeadSettings.of(settings)
        frac_bits, bound, normalize = heads.frac_bits, heads.feature_bound, heads.normalize_features
    elif contract.input_kind != input_kind:
        raise PredictError(400, "backbone_mismatch", f"head {head_id!r} takes {contract.input_kind} inputs "
                                                     f"(contract v{contract.version}), got {input_kind}")
    else:
        name = contract.backbone
        frac_bits, bound, normalize = contract.frac_bits, contract.feature_bound, contract.normalize
    if kind == "features":
        raw = [np.asarray(it, dtype=np.float64) for it in items]
    else:
        from unlearn.features.backbones import BackboneError, get_backbone

        try:
            bb = get_backbone(name, HeadSettings.of(settings).device)
            feats = bb.encode(list(items))
        except BackboneError as exc:
            status = 400 if exc.index is not None else 500
            raise PredictError(status, "undecodable_input" if status == 400 else "backbone_unavailable",
                               str(exc)) from None
        except (ImportError, OSError, RuntimeError) as exc:  # package/weights missing, bad device
            raise PredictError(500, "backbone_unavailable",
                               f"cannot load backbone {name!r}: {type(exc).__name__}: {exc}") from None
        raw = [feats[i] for i in range(feats.shape[0])]
    d = head.update.d
    rows = []
    for i, f in enumerate(raw):
        if f.shape[0] != d:
            raise PredictError(400, "dimension_mismatch",
                               f"input {i}: {f.shape[0]} features, head {head_id!r} has d = {d}")
        try:
            rows.append(quantize_feature_row(f, frac_bits, bound, normalize))
        except FeatureRejected as exc:
            raise PredictError(400, exc.reason, f"input {i}: {exc.detail}") from None
    return quantizer(frac_bits, bound).dequantize(np.stack(rows))


def predict(head: ServedHead, X: np.ndarray, sigma2: float = 1.0, top_k: int = 1) -> dict[str, Any]:
    """Scores X @ W, predicted class and top ``top_k`` classes, predictive variance sigma^2 f^T T f
    -- all from ``head``. Classes are ranked over those with retained samples only; the others'
    scores are null (``schemas/head.py``)."""
    from unlearn.ledger.bayes import predictive_variance

    u = head.update
    ranked = score_rows(u, X, top_k)
    var = predictive_variance(X, head.posterior, sigma2) if head.posterior is not None else None
    preds = []
    for i in range(X.shape[0]):
        preds.append({**ranked.as_json(i), "variance": float(var[i]) if var is not None else None})
    src = head.posterior_source
    note = {
        "current_head": "posterior T of this head version",
        "last_exact_head": (f"this {u.mode} head (version {u.version}) carries no posterior: variance uses T "
                            f"of the last exact head of {u.head_id!r}, version {head.posterior_version}"),
        None: f"no posterior published for head {u.head_id!r} yet (exact heads carry T when "
              "UNLEARN_PUBLISH_POSTERIOR is on): variance unavailable",
    }[src]
    return {
        "head_id": u.head_id,
        "version": u.version,
        "mode": u.mode,
        "digest": u.digest,
        "n_retained": u.n_retained,
        "retained_classes": retained_class_list(u),
        "predictions": preds,
        "variance": {
            "available": var is not None,
            "source": src,
            "posterior_version": head.posterior_version,
            "posterior_digest": head.posterior_digest,
            "sigma2": sigma2,
            "note": note,
        },
    }
