"""What serving holds and how it predicts, without I/O: the served heads and the prediction rule.

**Served heads** (:class:`HeadStore`): one immutable :class:`ServedHead` per head id, swapped in
one assignment. A request reads ONE reference and computes everything (scores, variance, version,
digest) from it, so a response can never mix two heads. Which update is newer is
``HeadUpdate.supersedes``: the one ordering of head updates every reader in the project uses.

**Predictions**: parse a request body, featurize its inputs exactly like training, score them.
Inputs go through the featurizer's pipeline and nothing else, all of it from the feature contract
(``unlearn.features.contract``) and the **head's contract** from the head registry
(``schemas/head_contract.py``, docs/registry.md): its backbone and input kind, then
``quantize_feature_row`` with its normalization, bound and grid, then dequantization -- so a
served input is the very feature vector a training sample with that input contributed to the
ledger, whatever this process's own settings say. A head with no contract in the registry falls
back to the settings.
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from unlearn.features.contract import FeatureRejected, quantize_feature_row, quantizer, resolve_backbone
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.schemas.head import HeadUpdate, retained_class_list
from unlearn.schemas.head_contract import HeadContract
from unlearn.schemas.head_scores import score_rows

__all__ = [
    "HeadStore",
    "OfferResult",
    "ServedHead",
    "MAX_INPUTS",
    "MAX_TOP_K",
    "PredictError",
    "parse_predict_body",
    "predict",
    "prepare_inputs",
]

#: What ``HeadStore.offer`` did with an update.
OfferResult = Literal["accepted", "stale"]


@dataclass(frozen=True, eq=False)
class ServedHead:
    """One immutable served state of a head: the update and the posterior used for variance.

    ``posterior`` is the update's own T when it carries one, else the T of the last exact update
    of this head that carried one (``posterior_version`` says which; None when never seen), so
    variance stays available between resets and the response can name how stale it is.
    """

    update: HeadUpdate
    received_at: float  # wall clock when this update was accepted
    posterior: np.ndarray | None
    posterior_version: int | None
    posterior_digest: str | None

    @property
    def posterior_source(self) -> str | None:
        """"current_head" | "last_exact_head" | None: where the variance comes from."""
        if self.posterior is None:
            return None
        return "current_head" if self.update.posterior is not None else "last_exact_head"

    def summary(self, now: float | None = None) -> dict[str, Any]:
        """The JSON summary of ``GET /v1/heads/{head}`` (ages relative to ``now``)."""
        now = time.time() if now is None else now
        u = self.update
        return {
            "head_id": u.head_id,
            "version": u.version,
            "mode": u.mode,
            "digest": u.digest,
            "n_retained": u.n_retained,
            "events_covered": u.events_covered,
            "d": u.d,
            "c": u.c,
            "retained_classes": retained_class_list(u),
            "gamma": u.gamma,
            "contract_version": u.contract_version,
            "drift": u.drift,
            "offsets": [[p, o] for p, o in u.offsets],
            "created_ts": u.created_ts,
            "age_seconds": max(0.0, now - u.created_ts),
            "received_age_seconds": max(0.0, now - self.received_at),
            "has_posterior": u.posterior is not None,
            "posterior_version": self.posterior_version,
        }


class HeadStore:
    """head id -> current :class:`ServedHead`. Writers (the follower) serialize on a lock;
    readers take one reference with ``get`` (a dict read: atomic) and never lock, so requests
    never wait for a swap."""

    def __init__(self) -> None:
        self._heads: dict[str, ServedHead] = {}
        self._lock = threading.Lock()

    def offer(self, update: HeadUpdate, now: float | None = None) -> OfferResult:
        """Serve ``update`` if it supersedes the current head: returns "accepted" or "stale"."""
        now = time.time() if now is None else now
        with self._lock:
            cur = self._heads.get(update.head_id)
            if cur is not None and not update.supersedes(cur.update):
                return "stale"
            post: np.ndarray | None
            pv: int | None
            pd: str | None
            if update.posterior is not None:
                post, pv, pd = update.posterior, update.version, update.digest
            elif cur is not None and cur.posterior is not None and cur.posterior.shape[0] == update.d:
                post, pv, pd = cur.posterior, cur.posterior_version, cur.posterior_digest
            else:
                post, pv, pd = None, None, None
            # One reference replaced: a reader holds either the old or the new object, never a mix.
            self._heads[update.head_id] = ServedHead(update, now, post, pv, pd)
            return "accepted"

    def get(self, head_id: str) -> ServedHead | None:
        """The current served state of ``head_id`` (one reference: use it for the whole request)."""
        return self._heads.get(head_id)

    def all(self) -> dict[str, ServedHead]:
        """A snapshot copy: head id -> served head."""
        return dict(self._heads)

    def __len__(self) -> int:
        return len(self._heads)


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
    scores are null (``schemas/head_scores.py``)."""
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
