"""Hub image backbones (DINOv2 via torch.hub or Hugging Face) behind the same interface.

Their weights are not shipped on PyPI, so on the offline dev/CI machines they are unavailable.
The loaders therefore never download implicitly: they look in the local cache and, if the
weights are not there, raise a ``BackboneError`` that says how to pre-populate the cache on a
machine with internet. ``allow_download=True`` opts in to the normal online download.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from .base import Backbone, BackboneError
from .images import decode_image

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class HubSpec:
    """Where a hub model lives and what it outputs."""

    name: str
    source: Literal["torchhub", "hf"]
    repo: str  # "owner/name" on GitHub (torchhub) or the Hugging Face Hub (hf)
    entry: str  # torch.hub entry point (torchhub only)
    dim: int
    image_size: int = 224  # multiple of the ViT patch size 14
    checkpoint_url: str = ""  # torchhub weights (loaded by us, strict)


HUB_SPECS: dict[str, HubSpec] = {
    s.name: s
    for s in (
        HubSpec("dinov2-vits14", "torchhub", "facebookresearch/dinov2", "dinov2_vits14", 384,
                checkpoint_url="https://dl.fbaipublicfiles.com/dinov2/dinov2_vits14/dinov2_vits14_pretrain.pth"),
        HubSpec("dinov2-vitb14", "torchhub", "facebookresearch/dinov2", "dinov2_vitb14", 768,
                checkpoint_url="https://dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/dinov2_vitb14_pretrain.pth"),
        HubSpec("dinov2-small-hf", "hf", "facebook/dinov2-small", "", 384),
        HubSpec("dinov2-base-hf", "hf", "facebook/dinov2-base", "", 768),
    )
}


def _offline_error(spec: HubSpec, missing: str, how: str) -> BackboneError:
    return BackboneError(
        f"weights are not available offline ({missing}). Hub models are never downloaded "
        f"implicitly; on a machine with internet run {how} and copy the cache here, or pass "
        "allow_download=True where downloads are allowed.",
        backbone=spec.name,
    )


def _load_torchhub(spec: HubSpec, hub_dir: str | None, allow_download: bool) -> torch.nn.Module:
    """torch.hub model; offline it needs the cached repo and checkpoint under the hub dir."""
    if allow_download:
        return torch.hub.load(spec.repo, spec.entry, trust_repo=True)
    root = Path(hub_dir) if hub_dir is not None else Path(torch.hub.get_dir())
    repo_dir = root / (spec.repo.replace("/", "_") + "_main")
    ckpt = root / "checkpoints" / spec.checkpoint_url.rsplit("/", 1)[-1]
    how = f"`python -c \"import torch; torch.hub.load('{spec.repo}', '{spec.entry}')\"`"
    if not (repo_dir / "hubconf.py").is_file():
        raise _offline_error(spec, f"no torch.hub repo at {repo_dir}", how)
    if not ckpt.is_file():
        raise _offline_error(spec, f"no checkpoint at {ckpt}", how)
    # Build the architecture from the cached repo, then load weights ourselves (strict), so
    # nothing in hubconf can reach for the network.
    model = torch.hub.load(str(repo_dir), spec.entry, source="local", pretrained=False)
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model


def _load_hf(spec: HubSpec, hf_cache_dir: str | None, allow_download: bool) -> torch.nn.Module:
    """Hugging Face model; offline it needs a cached snapshot (local_files_only)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise BackboneError("huggingface_hub is not installed", backbone=spec.name) from exc
    try:
        local = snapshot_download(spec.repo, cache_dir=hf_cache_dir, local_files_only=not allow_download)
    except Exception as exc:  # LocalEntryNotFoundError offline; network errors online
        how = f"`huggingface-cli download {spec.repo}`"
        raise _offline_error(spec, f"no cached snapshot of {spec.repo} ({type(exc).__name__})", how) from exc
    from transformers import AutoModel

    return AutoModel.from_pretrained(local, local_files_only=True)


class HubImageBackbone(Backbone):
    """Image backbone over a hub ViT: CLS embedding of an ImageNet-normalized square image."""

    kind = "image"

    def __init__(
        self,
        spec: HubSpec,
        device: torch.device | str = "cpu",
        batch_size: int = 32,
        cache_dir: str | None = None,
        allow_download: bool = False,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.dim = spec.dim
        self.image_size = spec.image_size
        self.batch_size = int(batch_size)
        self._torch_device = torch.device(device)
        self.device = str(self._torch_device)
        self.cache_key = spec.name
        if spec.source == "torchhub":
            model = _load_torchhub(spec, cache_dir, allow_download)
        else:
            model = _load_hf(spec, cache_dir, allow_download)
        self.model = model.eval().to(self._torch_device)
        self._mean = torch.tensor(_IMAGENET_MEAN, device=self._torch_device).view(1, 3, 1, 1)
        self._std = torch.tensor(_IMAGENET_STD, device=self._torch_device).view(1, 3, 1, 1)

    def prepare_item(self, item: Any) -> np.ndarray:
        return decode_image(item, self.image_size)

    def encode_prepared(self, items: Sequence[np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            x = torch.from_numpy(np.stack(list(items))).to(self._torch_device)
            x = (x.permute(0, 3, 1, 2).float() / 255.0 - self._mean) / self._std
            # DINOv2 hub forward = normalized CLS token; HF: the layer-normed CLS token
            out = self.model(x) if self.spec.source == "torchhub" else self.model(pixel_values=x).pooler_output
            return out.float().cpu().numpy()
