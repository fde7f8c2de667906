"""Settings of ``unlearn cdc`` (docs/cdc.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unlearn.infra.settings import Section, setting


@dataclass(frozen=True)
class CdcSettings(Section):
    """Where the Connect jars are and how the Connect worker runs."""

    title: ClassVar[str] = "cdc"

    connect_jars: str = setting("", "Kafka Connect + Debezium jars (\"\" = the checkout's `make connect` cache)")
    connect_flush_ms: int = setting(1000, "Connect's offset.flush.interval.ms: the most a kill -9 replays")
    connect_heap_mb: int = setting(256, "heap of the Connect JVM")

    def check(self) -> None:
        if self.connect_flush_ms < 100:
            raise ValueError(f"UNLEARN_CONNECT_FLUSH_MS must be >= 100, got {self.connect_flush_ms}")
        if self.connect_heap_mb < 64:
            raise ValueError(f"UNLEARN_CONNECT_HEAP_MB must be >= 64, got {self.connect_heap_mb}")
