"""The frozen-backbone interface (phi in docs/design.md section 1).

A backbone maps raw inputs (feature lists, texts, image bytes/arrays) to float32 feature rows.
It returns *raw* features: L2 normalization and integer quantization belong to the featurizer
(they are part of the ledger contract, not of the model), so they are deliberately not done here.

Encoding is split in two phases so that one bad input cannot fail a whole batch:

1. ``prepare_item`` validates/decodes one input on the host and raises ``BackboneError`` naming
   that input's index (the caller dead-letters just that item);
2. ``encode_prepared`` runs the model on a list of already-valid items, batched.

``encode`` is strict (first bad item raises); ``encode_checked`` reports per-item errors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

BackboneKind = Literal["features", "text", "image"]


class BackboneError(ValueError):
    """An input a backbone cannot encode, or a backbone that cannot be loaded.

    ``index`` is the position of the offending input in the batch (None when the error is not
    about one input, e.g. weights missing), so a caller can dead-letter exactly that item.
    """

    def __init__(self, reason: str, *, index: int | None = None, backbone: str | None = None):
        self.reason = reason
        self.index = index
        self.backbone = backbone
        where = f"input {index}: " if index is not None else ""
        who = f"{backbone}: " if backbone else ""
        super().__init__(f"{who}{where}{reason}")

    def with_index(self, index: int, backbone: str | None = None) -> BackboneError:
        """Same error re-targeted at batch position ``index`` (helpers raise without one)."""
        return BackboneError(self.reason, index=index, backbone=backbone or self.backbone)


@dataclass(frozen=True)
class EncodeResult:
    """Per-item outcome of ``Backbone.encode_checked``.

    ``features[j]`` belongs to input ``indices[j]``; every other input has an entry in ``errors``
    (keyed by its index). Rows of failed items are absent rather than NaN-filled so a failure can
    never leak into a ledger as a number.
    """

    features: np.ndarray  # float32 (n_ok, dim)
    indices: np.ndarray  # int64 (n_ok,), ascending
    errors: dict[int, BackboneError] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every input encoded."""
        return not self.errors


def padded_size(m: int, cap: int) -> int:
    """The batch a chunk of ``m`` rows runs as: the next power of two, at most ``cap`` (a few
    shapes in all, each at most twice the rows)."""
    return min(max(cap, m), 1 << max(0, m - 1).bit_length())


class Backbone(ABC):
    """A frozen feature extractor.

    Attributes:
        name: registry name (e.g. ``"efficientnet-lite0"``).
        dim: output feature dimension (``None`` only for a passthrough whose dim is inferred
            from its first input).
        kind: which input family it accepts.
        device: torch device string the model runs on (``"cpu"``, ``"cuda:0"``).
        cache_key: identifies everything that changes the output (name + preprocessing
            parameters); feature caches are keyed by it.
    """

    name: str
    dim: int | None
    kind: BackboneKind
    device: str
    cache_key: str
    batch_size: int = 64

    # -- phase 1: per-item host-side validation/decoding ------------------------------------
    @abstractmethod
    def prepare_item(self, item: Any) -> Any:
        """Validate/decode one input; raise ``BackboneError`` (no index needed) if it is bad."""

    # -- phase 2: batched model forward -------------------------------------------------------
    @abstractmethod
    def encode_prepared(self, items: Sequence[Any]) -> np.ndarray:
        """Encode already-prepared items; returns float32 (len(items), dim)."""

    # -- public entry points ------------------------------------------------------------------
    def _prepare(self, item: Any, index: int) -> Any:
        try:
            return self.prepare_item(item)
        except BackboneError as exc:
            raise exc.with_index(index, self.name) from exc

    def encode(self, inputs: Sequence[Any]) -> np.ndarray:
        """Encode all inputs or raise ``BackboneError`` naming the first bad one."""
        prepared = [self._prepare(item, i) for i, item in enumerate(inputs)]
        return self._encode_batched(prepared)

    def encode_checked(self, inputs: Sequence[Any]) -> EncodeResult:
        """Encode what can be encoded; report each bad input separately (for dead-lettering)."""
        prepared: list[Any] = []
        ok: list[int] = []
        errors: dict[int, BackboneError] = {}
        for i, item in enumerate(inputs):
            try:
                prepared.append(self._prepare(item, i))
                ok.append(i)
            except BackboneError as exc:
                errors[i] = exc
        feats = self._encode_batched(prepared)
        return EncodeResult(features=feats, indices=np.asarray(ok, dtype=np.int64), errors=errors)

    def _encode_batched(self, prepared: Sequence[Any]) -> np.ndarray:
        dim = self.dim if self.dim is not None else 0
        if len(prepared) == 0:
            return np.zeros((0, dim), dtype=np.float32)
        bs = max(1, int(self.batch_size))
        parts = [self._encode_chunk(prepared[s : s + bs], bs) for s in range(0, len(prepared), bs)]
        out = np.ascontiguousarray(np.concatenate(parts, axis=0), dtype=np.float32)
        if out.ndim != 2 or out.shape[0] != len(prepared) or (
            self.dim is not None and out.shape[1] != self.dim
        ):
            raise RuntimeError(
                f"{self.name}: model returned shape {out.shape}, expected ({len(prepared)}, {self.dim})"
            )
        return out

    def pads_batches(self) -> bool:
        """Whether chunks are padded to :func:`padded_size` rows: image models on CUDA, where
        each new batch shape costs cuDNN a new execution plan per convolution (bench/results/gpu.md:
        a featurizer whose micro-batches took ever new sizes spent ~15 ms of CPU per image)."""
        return self.kind == "image" and self.device.startswith("cuda")

    def warm_shapes(self) -> None:
        """Run every padded batch shape once on blank images, so that the cost of new shapes is paid
        when the backbone loads rather than by the first batches."""
        if not self.pads_batches():
            return
        side = int(getattr(self, "image_size"))  # noqa: B009 (every image backbone has one)
        blank = np.zeros((side, side, 3), dtype=np.uint8)
        cap = max(1, int(self.batch_size))
        for size in sorted({padded_size(m, cap) for m in range(1, cap + 1)}):
            self.encode_prepared([blank] * size)

    def _encode_chunk(self, chunk: Sequence[Any], cap: int) -> np.ndarray:
        m = len(chunk)
        size = padded_size(m, cap) if self.pads_batches() else m
        if size == m:
            return self.encode_prepared(chunk)
        return self.encode_prepared([*chunk, *[chunk[-1]] * (size - m)])[:m]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.cache_key} dim={self.dim} device={self.device}>"
