"""The defaults of head contracts: quantization, ridge gamma, backbones and size limits. The
featurizer, the ledger, the registry CLI and serving read them, so they live in infra."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unlearn.infra.settings import Section, setting


def _entries(spec: str) -> list[tuple[str, str, str]]:
    """``(head, sep, value)`` of each ``head=value`` item of a comma-separated setting."""
    out = []
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, value = item.partition("=")
        out.append((name.strip(), sep, value.strip()))
    return out


@dataclass(frozen=True)
class HeadSettings(Section):
    """How a new head is quantized, regularized and featurized, and how large it may be."""

    title: ClassVar[str] = "heads"

    frac_bits: int = setting(30, "feature quantization q = rint(f * 2^k), 1..30")
    label_frac_bits: int = setting(0, "label quantization (0 = class indices / one-hot)")
    feature_bound: float = setting(1.0, "|f_i| must not exceed it")
    gamma: float = setting(1.0, "default ridge regularizer of a new head")
    head_gammas: str = setting("", "per-head gamma, e.g. faces=0.5,tweets=2")
    head_backbones: str = setting("", "per-head backbone, e.g. tweets=minilm,faces=efficientnet-lite0")
    normalize_features: bool = setting(True, "L2-normalize rows before quantizing")
    max_feature_dim: int = setting(2048, "largest d of a new head (the ledger is O(d^2)); larger -> deadletter")
    auto_create_heads: bool = setting(True, "an add to an undeclared head creates its contract")
    default_classes: int = setting(100, "class count of an auto-created head's contract")
    max_classes: int = setting(1024, "most classes (or target width) a contract may declare")
    device: str = setting("auto", "auto | cpu | cuda: where backbones run")

    def check(self) -> None:
        if not 1 <= self.frac_bits <= 30:
            raise ValueError(f"UNLEARN_FRAC_BITS must be in 1..30, got {self.frac_bits}")
        if not 0 <= self.label_frac_bits <= 30:
            raise ValueError(f"UNLEARN_LABEL_FRAC_BITS must be in 0..30, got {self.label_frac_bits}")
        if self.gamma <= 0:
            raise ValueError(f"UNLEARN_GAMMA must be > 0, got {self.gamma}")
        for name, sep, value in _entries(self.head_gammas):
            try:
                ok = bool(sep and name) and float(value) > 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"UNLEARN_HEAD_GAMMAS entry {name}{sep}{value!s} is not 'head=gamma' with gamma > 0")
        for name, sep, value in _entries(self.head_backbones):
            if not (sep and name and value):
                raise ValueError(f"UNLEARN_HEAD_BACKBONES entry {name}{sep}{value!s} is not 'head=backbone'")
        if self.max_feature_dim < 1:
            raise ValueError(f"UNLEARN_MAX_FEATURE_DIM must be >= 1, got {self.max_feature_dim}")
        if not 1 <= self.default_classes <= self.max_classes <= 1 << 20:
            raise ValueError("UNLEARN_DEFAULT_CLASSES and UNLEARN_MAX_CLASSES need 1 <= default <= max <= 2^20")

    def gamma_for(self, head_id: str) -> float:
        """The ridge gamma of a head: its UNLEARN_HEAD_GAMMAS entry, else UNLEARN_GAMMA."""
        for name, _, value in _entries(self.head_gammas):
            if name == head_id:
                return float(value)
        return self.gamma

    def backbone_overrides(self) -> dict[str, str]:
        """Every ``head=backbone`` entry of UNLEARN_HEAD_BACKBONES (a repeated head: the last)."""
        return {name: value for name, _, value in _entries(self.head_backbones)}

    def backbone_for(self, head_id: str) -> str | None:
        """A head's backbone from UNLEARN_HEAD_BACKBONES, or None (then the input kind decides)."""
        for name, _, value in _entries(self.head_backbones):
            if name == head_id:
                return value
        return None
