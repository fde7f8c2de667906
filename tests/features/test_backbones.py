"""Backbone registry tests: real shipped weights, offline hub behaviour, per-item errors.

No broker needed. Heavy models are loaded once per module (the registry caches them).
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from unlearn.features.backbones import (
    Backbone,
    BackboneError,
    available_backbones,
    backbone_cache_key,
    backbone_info,
    get_backbone,
    resolve_device,
)

REPO = Path(__file__).resolve().parents[2]


def _png(arr: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


# ------------------------------------------------------------------------------- registry


def test_importing_registry_does_not_import_models() -> None:
    """The ledger/schema side imports the registry; it must not pay for torch or transformers."""
    code = textwrap.dedent(
        """
        import sys
        import unlearn.features.backbones.registry
        from unlearn.features.backbones import get_backbone
        b = get_backbone("features:3")
        assert b.encode([[1, 2, 3]]).shape == (1, 3)
        heavy = [m for m in ("torch", "sentence_transformers", "transformers", "PIL") if m in sys.modules]
        print(heavy)
        assert not heavy, heavy
        """
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_registry_names_info_and_keys() -> None:
    names = available_backbones()
    for n in ("features", "minilm", "efficientnet-lite0", "dinov2-vits14", "dinov2-small-hf"):
        assert n in names
    assert backbone_info("minilm").kind == "text" and backbone_info("minilm").dim == 384
    assert backbone_info("all-MiniLM-L6-v2").name == "minilm"  # alias, case-insensitive
    assert backbone_info("efficientnet-lite0").dim == 1280 and backbone_info("efficientnet-lite0").bundled
    assert not backbone_info("dinov2-vits14").bundled
    assert backbone_cache_key("efficientnet-lite0") == "efficientnet-lite0@112px"
    assert backbone_cache_key("efficientnet-lite0", image_size=224) == "efficientnet-lite0@224px"
    assert backbone_cache_key("features:64") == "features:64"
    with pytest.raises(BackboneError, match=r"unknown backbone 'resnet9000'.*efficientnet-lite0"):
        get_backbone("resnet9000")
    with pytest.raises(BackboneError, match="features:<positive int>"):
        get_backbone("features:0")


def test_resolve_device() -> None:
    import torch

    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    with pytest.raises(BackboneError, match="unknown device"):
        resolve_device("toaster")
    if not torch.cuda.is_available():
        with pytest.raises(BackboneError, match="CUDA is not available"):
            resolve_device("cuda")


# ----------------------------------------------------------------------------- passthrough


def test_features_passthrough_rejects_bad_items_by_index() -> None:
    b = get_backbone("features", dim=3)
    assert b is get_backbone("features:3")  # same (name, device, options) -> same instance
    good = [0.1, -0.2, 0.3]
    res = b.encode_checked([good, [1.0, float("nan"), 0.0], [1.0, 2.0], "1,2,3", [1e39, 0.0, 0.0],
                            [1, float("-inf"), 2], good])
    assert res.indices.tolist() == [0, 6]
    assert res.features.dtype == np.float32 and res.features.shape == (2, 3)
    np.testing.assert_array_equal(res.features[0], np.float32(good))
    assert sorted(res.errors) == [1, 2, 3, 4, 5]
    assert res.errors[1].index == 1 and "component 1" in str(res.errors[1]) and "input 1" in str(res.errors[1])
    assert "length 2, expected 3" in str(res.errors[2])
    assert "outside float32" in str(res.errors[4])  # finite in float64, inf in float32
    with pytest.raises(BackboneError) as ei:
        b.encode([good, good, [np.nan, 0, 0]])
    assert ei.value.index == 2 and isinstance(ei.value, ValueError)


def test_features_passthrough_infers_dim_and_is_not_shared() -> None:
    a = get_backbone("features")
    assert a.dim is None
    res = a.encode_checked([[1, 2], [1, 2, 3], [3, 4]])
    assert a.dim == 2 and res.indices.tolist() == [0, 2] and list(res.errors) == [1]
    assert get_backbone("features") is not a and get_backbone("features").dim is None


# ---------------------------------------------------------------------------- EfficientNet


@pytest.fixture(scope="module")
def effnet() -> Backbone:
    return get_backbone("efficientnet-lite0", device="cpu")


def test_efficientnet_weights_load_strict() -> None:
    import torch

    from unlearn.features.backbones.efficientnet_lite0 import EfficientNetLite0, weights_path

    state = torch.load(weights_path(), map_location="cpu", weights_only=True)
    model = EfficientNetLite0()
    ours = model.state_dict()
    assert set(ours) == set(state)
    assert all(ours[k].shape == state[k].shape for k in state)
    model.load_state_dict(state, strict=True)
    broken = dict(state)
    broken.pop("_blocks.15._bn2.running_var")
    with pytest.raises(RuntimeError, match="Missing key"):
        EfficientNetLite0().load_state_dict(broken, strict=True)


def test_efficientnet_imagenet_predictions_are_sane() -> None:
    """Padding/activation/scaling mistakes still load strict but ruin predictions: check two
    real photos (shipped with scikit-learn) against ImageNet classes at the native 224 px."""
    import torch
    from sklearn.datasets import load_sample_images

    from unlearn.features.backbones.efficientnet_lite0 import load_efficientnet_lite0, to_model_input
    from unlearn.features.backbones.images import decode_image

    imgs = np.stack([decode_image(im, 224) for im in load_sample_images().images])  # china, flower
    with torch.inference_mode():
        top5 = load_efficientnet_lite0("cpu")(to_model_input(imgs, "cpu")).topk(5).indices.tolist()
    # china.jpg: a temple roof -> bell cote 442 / palace 698 / castle 483 / monastery 663 / stupa 832
    assert {442, 698, 483, 663, 832} & set(top5[0][:2]), top5[0]
    # flower.jpg: a flower -> daisy 985 first (bee 309 also plausible)
    assert top5[1][0] in {985, 309}, top5[1]


def test_efficientnet_fashion_mnist_ridge_beats_chance(effnet: Backbone) -> None:
    from unlearn.services.demo.datasets import load_fashion_mnist

    Xtr, ytr = load_fashion_mnist("train", limit=400)
    Xte, yte = load_fashion_mnist("test", limit=200)
    Ftr, Fte = effnet.encode(Xtr), effnet.encode(Xte)
    assert Ftr.shape == (400, 1280) and Ftr.dtype == np.float32 and np.isfinite(Ftr).all()

    def norm(F: np.ndarray) -> np.ndarray:
        return F / np.linalg.norm(F, axis=1, keepdims=True)

    # closed-form ridge, as the ledger does it: W = (F^T F + gamma I)^-1 F^T Y
    A, B = norm(Ftr).astype(np.float64), norm(Fte).astype(np.float64)
    Y = np.eye(10)[ytr]
    W = np.linalg.solve(A.T @ A + 1.0 * np.eye(A.shape[1]), A.T @ Y)
    acc = float(((B @ W).argmax(1) == yte).mean())
    print(f"fashion-mnist ridge accuracy (400 train / 200 test, 112 px): {acc:.3f}")
    assert acc > 0.6  # chance is 0.1; measured ~0.82


def test_bad_image_is_a_per_item_error(effnet: Backbone) -> None:
    rng = np.random.default_rng(0)
    gray = rng.integers(0, 256, size=(28, 28), dtype=np.uint8)
    rgb = rng.integers(0, 256, size=(40, 30, 3), dtype=np.uint8)
    png = _png(gray)
    batch = [png, b"definitely not a png", png[: len(png) // 2], rgb, gray.astype(np.float32), "cat.png", gray]
    res = effnet.encode_checked(batch)
    assert res.indices.tolist() == [0, 3, 6]
    assert sorted(res.errors) == [1, 2, 4, 5]
    assert all(e.index == i for i, e in res.errors.items())
    assert "undecodable image bytes" in str(res.errors[1]) and "input 1" in str(res.errors[1])
    assert "dtype must be uint8" in str(res.errors[4])
    assert res.features.shape == (3, 1280) and np.isfinite(res.features).all()
    # PNG bytes and the raw array decode to the same pixels -> the same features
    np.testing.assert_allclose(res.features[0], res.features[2], rtol=0, atol=1e-5)
    # grayscale is replicated to RGB: identical to passing the 3-channel version
    np.testing.assert_allclose(
        effnet.encode([np.repeat(gray[:, :, None], 3, axis=2)])[0], res.features[2], rtol=0, atol=1e-4
    )  # (different batch composition -> different conv kernels -> ~1e-5 float noise)
    with pytest.raises(BackboneError) as ei:
        effnet.encode(batch)
    assert ei.value.index == 1


def test_padded_sizes_are_few_and_at_most_twice() -> None:
    from unlearn.features.backbones.base import padded_size

    sizes = [padded_size(m, 64) for m in range(1, 65)]
    assert sorted(set(sizes)) == [1, 2, 4, 8, 16, 32, 64]
    assert all(m <= p < 2 * m for m, p in zip(range(1, 65), sizes, strict=True))
    assert padded_size(90, 100) == 100  # capped at the batch size, even when that is no power of two


def test_padding_feeds_the_model_few_shapes_and_returns_only_the_real_rows(effnet: Backbone,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA image models run only a few batch shapes (each new one costs cuDNN plans); here the
    padding is forced on the CPU model, whose output for the real rows must not change."""
    rng = np.random.default_rng(1)
    imgs = [rng.integers(0, 256, size=(28, 28, 3), dtype=np.uint8) for _ in range(11)]
    plain = effnet.encode(imgs)
    seen: list[int] = []
    real = effnet.encode_prepared

    def recording(items: list[np.ndarray]) -> np.ndarray:
        seen.append(len(items))
        return real(items)

    monkeypatch.setattr(effnet, "encode_prepared", recording)
    monkeypatch.setattr(effnet, "pads_batches", lambda: True)
    monkeypatch.setattr(effnet, "batch_size", 8)
    padded = effnet.encode(imgs)
    assert seen == [8, 4]  # 8 + 3 real rows, the 3 padded to 4
    assert padded.shape == plain.shape == (11, 1280)
    np.testing.assert_allclose(padded, plain, rtol=0, atol=1e-4)  # batch composition: float noise only
    seen.clear()
    effnet.warm_shapes()
    assert seen == [1, 2, 4, 8]  # every shape a chunk of at most 8 can run as, once


def test_padding_is_off_on_the_cpu(effnet: Backbone) -> None:
    assert not effnet.pads_batches()


def test_cache_keys_match_loaded_instances(effnet: Backbone) -> None:
    assert effnet.cache_key == backbone_cache_key("efficientnet-lite0")
    assert get_backbone("efficientnet-lite0", device="cpu") is effnet  # cached per (name, device)
    assert get_backbone("features:5").cache_key == backbone_cache_key("features", dim=5)


# ---------------------------------------------------------------------------------- MiniLM


@pytest.fixture(scope="module")
def minilm() -> Backbone:
    return get_backbone("minilm", device="cpu")


def test_minilm_embeddings(minilm: Backbone) -> None:
    texts = [
        "The cat is sleeping on the sofa.",
        "A kitten naps on the couch.",
        "Quarterly revenue grew by eight percent.",
    ]
    F = minilm.encode(texts)
    assert F.shape == (3, 384) and F.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(F, axis=1), 1.0, atol=1e-4)
    sim = F @ F.T
    assert sim[0, 1] > sim[0, 2] + 0.3, sim


def test_minilm_per_item_errors(minilm: Backbone) -> None:
    res = minilm.encode_checked(["hello world", "", 42, b"hello world", b"\xff\xfe bad"])
    assert res.indices.tolist() == [0, 3]
    assert sorted(res.errors) == [1, 2, 4]
    assert "empty text" in str(res.errors[1]) and "UTF-8" in str(res.errors[4])
    np.testing.assert_allclose(res.features[0], res.features[1], atol=1e-5)


# ------------------------------------------------------------------------------------ hub


@pytest.mark.parametrize("name", ["dinov2-vits14", "dinov2-small-hf"])
def test_hub_backbone_offline_gives_clear_error(name: str, tmp_path: Path) -> None:
    with pytest.raises(BackboneError) as ei:
        get_backbone(name, device="cpu", cache_dir=str(tmp_path))
    msg = str(ei.value)
    assert "not available offline" in msg and name in msg and ei.value.index is None
    # failures are not cached: a second call tries again (and fails the same way)
    with pytest.raises(BackboneError, match="not available offline"):
        get_backbone(name, device="cpu", cache_dir=str(tmp_path))


_FAKE_HUBCONF = '''
import torch
from torch import nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 384, 14, stride=14)
    def forward(self, x):
        return self.patch(x).mean(dim=(2, 3))

def dinov2_vits14(pretrained=True):
    assert not pretrained, "the registry must load weights itself, offline"
    return Tiny()
'''


def test_hub_backbone_loads_from_a_populated_offline_cache(tmp_path: Path) -> None:
    """Exercise the real torch.hub loading path with a stand-in repo and checkpoint."""
    import torch

    repo = tmp_path / "facebookresearch_dinov2_main"
    repo.mkdir()
    (repo / "hubconf.py").write_text(_FAKE_HUBCONF)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(BackboneError, match="no checkpoint"):
        get_backbone("dinov2-vits14", device="cpu", cache_dir=str(tmp_path))
    ns: dict = {}
    exec(_FAKE_HUBCONF, ns)
    torch.manual_seed(0)
    torch.save(ns["Tiny"]().state_dict(), tmp_path / "checkpoints" / "dinov2_vits14_pretrain.pth")
    b = get_backbone("dinov2-vits14", device="cpu", cache_dir=str(tmp_path))
    assert (b.kind, b.dim) == ("image", 384)
    res = b.encode_checked([np.zeros((50, 60, 3), np.uint8), b"junk"])
    assert res.features.shape == (1, 384) and list(res.errors) == [1]
