"""Frozen backbones (phi): passthrough features, MiniLM text, EfficientNet-Lite0 images, hub models.

Importing this package does not import torch or any model library; ``get_backbone`` loads lazily.
"""

from .base import Backbone, BackboneError, BackboneKind, EncodeResult
from .registry import (
    BackboneInfo,
    available_backbones,
    backbone_cache_key,
    backbone_info,
    clear_backbone_cache,
    get_backbone,
    resolve_device,
)

__all__ = [
    "Backbone",
    "BackboneError",
    "BackboneInfo",
    "BackboneKind",
    "EncodeResult",
    "available_backbones",
    "backbone_cache_key",
    "backbone_info",
    "clear_backbone_cache",
    "get_backbone",
    "resolve_device",
]
