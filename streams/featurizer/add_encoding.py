"""Encoding the adds of a batch into float64 features, before anything is judged: which backbone
each add goes through (the feature contract, :mod:`features.contract`, shared with serving), one
encoder call per backbone (encoding does not depend on the cache, and a model is fast on batches),
and a per-item refusal for each input the backbone cannot take.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unlearn.features.backbones import BackboneError, EncodeResult
from unlearn.features.backbones.images import image_pixels
from unlearn.features.contract import FeatureRejected, resolve_backbone
from unlearn.schemas.envelope import Request
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.request_inputs import FeaturesInput, ImageInput, TextInput
from unlearn.streams.featurizer.core_config import CoreConfig

__all__ = [
    "Encoder",
    "RegistryEncoder",
    "EncodedAdds",
    "route_adds",
    "encode_adds",
    "encode_group",
]


Encoder = Callable[[str, Sequence[Any]], EncodeResult]
"""``encoder(backbone_name, items) -> EncodeResult`` (per-item errors, like
``Backbone.encode_checked``); raises ``BackboneError`` with ``index=None`` when the backbone
cannot be loaded. Only text and image inputs reach it: feature vectors are passed through here
in float64."""


class RegistryEncoder:
    """The production encoder: ``features.backbones.get_backbone(name, device)``, cached.
    ``on_load`` runs once per backbone, after its first load (``unlearn featurizer`` freezes the
    heap then: runtime/heap.py)."""

    def __init__(self, device: str = "auto", on_load: Callable[[], object] | None = None) -> None:
        self.device = device
        self.on_load = on_load
        self._announced: set[str] = set()

    def __call__(self, name: str, items: Sequence[Any]) -> EncodeResult:
        from unlearn.features.backbones import get_backbone

        try:
            backbone = get_backbone(name, self.device)
        except BackboneError:
            raise
        except (ImportError, OSError, RuntimeError) as exc:  # package/weights missing, bad device
            raise BackboneError(f"cannot load backbone {name!r}: {type(exc).__name__}: {exc}") from exc
        if name not in self._announced:  # "auto" resolves per machine: say where the model runs
            self._announced.add(name)
            logging.getLogger(__name__).info("backbone %s loaded on %s", backbone.cache_key, backbone.device)
            if self.on_load is not None:
                self.on_load()
        return backbone.encode_checked(items)


@dataclass
class EncodedAdds:
    """Per add (by its index in the batch): float64 features or the refusal, and its backbone key."""

    features: dict[int, np.ndarray | FeatureRejected] = field(default_factory=dict)
    backbones: dict[int, str] = field(default_factory=dict)


def route_adds(reqs: Sequence[Request | InvalidRequest],
               config: CoreConfig) -> tuple[EncodedAdds, dict[str, list[tuple[int, Any]]]]:
    """Resolve each add's backbone. Feature vectors pass through in float64 as sent (the registry's
    ``FeaturesBackbone`` casts to float32, so q would differ from what a client computes; a
    ``features_bin`` '<f4' vector is widened exactly, so q is that of its float32 values); text and
    images are grouped per backbone name for :func:`encode_adds`. Returns (the adds settled so far,
    the groups to encode). In federated mode another client's adds are skipped: never encode
    another owner's data (they are refused when judged)."""
    encoded = EncodedAdds()
    groups: dict[str, list[tuple[int, Any]]] = {}
    for i, r in enumerate(reqs):
        if not isinstance(r, Request) or r.op != "add" or r.input is None:
            continue
        if config.federated and r.client_id != config.client_id:
            continue
        try:
            name, key = resolve_backbone(r.head_id, r.input.kind, config.head_backbones.get(r.head_id))
        except FeatureRejected as rej:
            encoded.features[i] = rej
            continue
        encoded.backbones[i] = key
        if isinstance(r.input, FeaturesInput):
            encoded.features[i] = np.asarray(r.input.values, dtype=np.float64)
        elif isinstance(r.input, TextInput):
            groups.setdefault(name, []).append((i, r.input.text))
        elif isinstance(r.input, ImageInput):
            pixels = image_pixels(r.input.data)
            budget = config.featurizer.max_image_pixels
            if pixels is not None and pixels > budget:  # checked on the header, before anything is decoded
                encoded.features[i] = FeatureRejected(
                    "image_too_large", f"the image declares {pixels} pixels, above UNLEARN_MAX_IMAGE_PIXELS={budget}")
                continue
            groups.setdefault(name, []).append((i, r.input.data))
    return encoded, groups


def encode_adds(reqs: Sequence[Request | InvalidRequest], config: CoreConfig, encoder: Encoder) -> EncodedAdds:
    """Features of every add, encoded in one call per backbone before judging: encoding does not
    depend on the cache, and a model is fast on batches."""
    encoded, groups = route_adds(reqs, config)
    for name, items in groups.items():
        for (i, _), res in zip(items, encode_group(encoder, name, [p for _, p in items]), strict=True):
            encoded.features[i] = res
    return encoded


def encode_group(encoder: Encoder, name: str, items: list[Any]) -> list[np.ndarray | FeatureRejected]:
    """Encode items with one backbone; per-item rejects for bad inputs. A non-BackboneError from
    the model (a crash on one odd input, or an out-of-memory on the whole batch) is retried item
    by item to isolate the culprit; if every item still fails, it is systemic: re-raise."""
    try:
        res = encoder(name, items)
    except BackboneError as exc:
        if exc.index is None:
            return [FeatureRejected("backbone_unavailable", str(exc))] * len(items)
        raise
    except Exception as exc:
        if len(items) == 1:
            raise
        out: list[np.ndarray | FeatureRejected] = []
        for item in items:
            try:
                out.extend(encode_group(encoder, name, [item]))
            except Exception as inner:
                out.append(FeatureRejected("encode_failed", f"{name}: {type(inner).__name__}: {inner}"))
        if all(isinstance(o, FeatureRejected) and o.reason == "encode_failed" for o in out):
            raise exc
        return out
    out = [FeatureRejected("undecodable_input", f"{name}: no output for this input")] * len(items)
    for j, idx in enumerate(res.indices.tolist()):
        out[idx] = np.asarray(res.features[j], dtype=np.float64)
    for idx, err in res.errors.items():
        out[idx] = FeatureRejected("undecodable_input", f"{name}: {err.reason}")
    return out
