"""Offline data for the paper experiments: cached frozen features, prepared once for every strategy.

Datasets come from ``unlearn.services.demo.datasets`` (Fashion-MNIST through EfficientNet-Lite0, tweets through
MiniLM, sklearn digits as 64-d feature vectors), encoded once and cached on disk by
``cached_features``. ``auto`` prefers Fashion-MNIST and falls back to digits with a clear message
when the dataset or a backbone is missing, so the benchmark always runs.

Every strategy sees the same features: L2-normalized, with an intercept column of ones, and
snapped to the exact ledger's 2^-30 grid. Snapping makes the exact ledger's quantization lossless,
so float strategies and the exact ledger are compared on identical inputs (docs/design.md section 2:
quantization is part of phi, and the retrain reference uses the same values).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from unlearn.ledger import Quantizer, l2_normalize, with_intercept

#: dataset -> (backbone registry name, largest train split, largest test split)
DATASET_BACKBONES: dict[str, tuple[str, int, int]] = {
    "fashion-mnist": ("efficientnet-lite0", 60_000, 10_000),
    "tweets": ("minilm", 29_000, 7_000),
    "digits": ("features", 1_438, 359),
}


class DataUnavailable(RuntimeError):
    """The requested dataset cannot be loaded here; the message says why and what to install."""


@dataclass(frozen=True)
class PaperData:
    """Prepared train/test features (float64, on the 2^-30 grid) and labels."""

    name: str
    F_train: NDArray[np.float64]
    y_train: NDArray[np.int64]
    F_test: NDArray[np.float64]
    y_test: NDArray[np.int64]
    n_classes: int
    notes: list[str] = field(default_factory=list)

    @property
    def dim(self) -> int:
        return int(self.F_train.shape[1])


def prepare_features(F: NDArray[np.floating], frac_bits: int = 30) -> NDArray[np.float64]:
    """L2-normalize, append the intercept column, snap to the exact ledger's grid."""
    q = Quantizer(frac_bits=frac_bits)
    return q.dequantize(q.quantize(with_intercept(l2_normalize(F))))


def _load(dataset: str, n_train: int, n_test: int, cache_dir: Path | None, seed: int) -> PaperData:
    try:
        from unlearn.services.demo.datasets import cached_features
    except ImportError as exc:  # pragma: no cover - depends on the checkout
        raise DataUnavailable(f"unlearn.services.demo.datasets is not importable ({exc})") from exc
    if dataset not in DATASET_BACKBONES:
        raise DataUnavailable(f"unknown dataset {dataset!r}; known: {', '.join(DATASET_BACKBONES)}")
    backbone, max_train, max_test = DATASET_BACKBONES[dataset]
    if n_train > max_train or n_test > max_test:
        raise DataUnavailable(f"{dataset} has at most {max_train} train / {max_test} test samples "
                              f"(asked for {n_train} / {n_test})")
    try:
        Ftr, ytr = cached_features(dataset, backbone, "train", limit=n_train, cache_dir=cache_dir, seed=seed,
                                   progress=False)
        Fte, yte = cached_features(dataset, backbone, "test", limit=n_test, cache_dir=cache_dir, seed=seed,
                                   progress=False)
    except (FileNotFoundError, ImportError, OSError, ValueError) as exc:
        raise DataUnavailable(f"{dataset} via {backbone}: {exc}") from exc
    n_classes = int(max(ytr.max(), yte.max())) + 1
    return PaperData(f"{dataset}/{backbone}", prepare_features(Ftr), ytr.astype(np.int64),
                     prepare_features(Fte), yte.astype(np.int64), n_classes)


def load_paper_data(dataset: str = "auto", n_train: int = 1200, n_test: int = 400, cache_dir: Path | None = None,
                    seed: int = 0, log: Callable[[str], None] = print) -> PaperData:
    """Load and prepare a dataset. ``auto``: Fashion-MNIST (EfficientNet-Lite0 features), else digits.

    Digits has only 1,438 train / 359 test samples; sizes are capped to it on fallback.
    """
    if dataset != "auto":
        return _load(dataset, n_train, n_test, cache_dir, seed)
    try:
        return _load("fashion-mnist", n_train, n_test, cache_dir, seed)
    except DataUnavailable as exc:
        msg = f"fashion-mnist unavailable ({exc}); falling back to sklearn digits"
        log(msg)
        _, max_train, max_test = DATASET_BACKBONES["digits"]
        data = _load("digits", min(n_train, max_train), min(n_test, max_test), cache_dir, seed)
        data.notes.append(msg)
        return data
