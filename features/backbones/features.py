"""Passthrough backbone for precomputed feature vectors (phi = identity).

Used when an upstream app already ran its own frozen model, and for feature datasets such as
sklearn digits. It needs neither torch nor a device, so it never imports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Backbone, BackboneError


class FeaturesBackbone(Backbone):
    """Validate and pass through float vectors of a fixed length.

    If ``dim`` is not given, the first valid vector fixes it (the instance is then stateful,
    which is why the registry does not share dim-less instances).
    """

    kind = "features"

    def __init__(self, dim: int | None = None, batch_size: int = 4096) -> None:
        if dim is not None and int(dim) <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.name = "features"
        self.dim = None if dim is None else int(dim)
        self.device = "cpu"
        self.batch_size = int(batch_size)
        self.cache_key = "features" if dim is None else f"features:{self.dim}"

    def prepare_item(self, item: Any) -> np.ndarray:
        if isinstance(item, (str, bytes, bytearray, memoryview)):
            raise BackboneError(f"feature vector must be a sequence of numbers, got {type(item).__name__}")
        try:
            raw = np.asarray(item)
        except (TypeError, ValueError) as exc:
            raise BackboneError(f"feature vector is not a numeric array ({exc})") from exc
        if raw.dtype.kind not in "iuf":
            raise BackboneError(f"feature vector must be real numbers, got dtype {raw.dtype}")
        if raw.ndim != 1:
            raise BackboneError(f"feature vector must be 1-D, got shape {raw.shape}")
        if raw.shape[0] == 0:
            raise BackboneError("empty feature vector")
        if self.dim is not None and raw.shape[0] != self.dim:
            raise BackboneError(f"feature vector has length {raw.shape[0]}, expected {self.dim}")
        with np.errstate(over="ignore"):  # overflow becomes inf, reported just below
            vec = raw.astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(vec))
        if bad.size:
            j = int(bad[0])
            raise BackboneError(
                f"non-finite feature at component {j} ({float(raw[j])!r}; NaN/Inf or outside float32 range)"
            )
        if self.dim is None:
            self.dim = int(vec.shape[0])
        return vec

    def encode_prepared(self, items: Sequence[np.ndarray]) -> np.ndarray:
        return np.stack(list(items)).astype(np.float32, copy=False)
