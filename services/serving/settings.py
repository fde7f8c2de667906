"""Settings of ``unlearn serve``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unlearn.infra.settings import Section, setting


@dataclass(frozen=True)
class ServeSettings(Section):
    """Where the prediction server listens and its predictive variance scale."""

    title: ClassVar[str] = "serve"

    serve_host: str = setting("127.0.0.1", "listen address")
    serve_port: int = setting(8080, "port (0 = any free port)")
    serve_sigma2: float = setting(1.0, "sigma^2 in the predictive variance sigma^2 f^T T f")

    def check(self) -> None:
        if not 0 <= self.serve_port <= 65535:
            raise ValueError(f"UNLEARN_SERVE_PORT must be in 0..65535, got {self.serve_port}")
        if not self.serve_sigma2 > 0:
            raise ValueError(f"UNLEARN_SERVE_SIGMA2 must be > 0, got {self.serve_sigma2}")
