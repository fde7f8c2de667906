"""Settings of ``unlearn verify``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unlearn.infra.settings import Section, setting


@dataclass(frozen=True)
class VerifySettings(Section):
    """How hard the replay verifier tries and how close it must come to a retrain."""

    title: ClassVar[str] = "verify"

    verify_orders: int = setting(3, "shuffled replay orders")
    verify_partitionings: int = setting(3, "random re-partitionings")
    verify_tolerance: float = setting(1e-8, "max relative deviation from a sklearn retrain")

    def check(self) -> None:
        if self.verify_orders < 0 or self.verify_partitionings < 0:
            raise ValueError("UNLEARN_VERIFY_ORDERS and UNLEARN_VERIFY_PARTITIONINGS must be >= 0")
        if not self.verify_tolerance > 0:
            raise ValueError(f"UNLEARN_VERIFY_TOLERANCE must be > 0, got {self.verify_tolerance}")
