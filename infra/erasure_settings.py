"""Erasure settings more than one package reads (docs/erasure.md): topic retention and trimming
(infra/topics.py), subject-key generations, transit-key grace, dead-letter redaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unlearn.infra.settings import Section, setting


@dataclass(frozen=True)
class ErasureSettings(Section):
    """How long erased bytes may live anywhere."""

    title: ClassVar[str] = "erasure"

    keys_retire_seconds: float = setting(10.0, "a superseded subject-keys generation lives this long")
    requests_retention_ms: int = setting(-1, "retention.ms of requests topics when created (-1: broker default)")
    trim_every_seconds: float = setting(5.0, "delete consumed raw inputs at most this often (0 = never)")
    segment_ms: int = setting(60_000, "segment.ms of trimmed/compacted topics: longest a deleted record waits")
    transit_grace_seconds: float = setting(15.0, "a transit key outlives its use_until this long")
    deadletter_inputs: str = setting("redact", "redact | keep: plaintext inputs/rows in dead letters")

    def check(self) -> None:
        if self.keys_retire_seconds < 3.0:
            raise ValueError("UNLEARN_KEYS_RETIRE_SECONDS must be at least 3 (readers must be off a superseded "
                             "subject-keys generation before it is deleted)")
        if self.requests_retention_ms < -1 or self.requests_retention_ms == 0:
            raise ValueError("UNLEARN_REQUESTS_RETENTION_MS must be -1 (broker default) or > 0")
        if self.trim_every_seconds < 0:
            raise ValueError("UNLEARN_TRIM_EVERY_SECONDS must be >= 0 (0 = never)")
        if self.segment_ms < 1000:
            raise ValueError("UNLEARN_SEGMENT_MS must be at least 1000")
        if self.transit_grace_seconds < 2.0:
            raise ValueError("UNLEARN_TRANSIT_GRACE_SECONDS must be at least 2 (the SDK's delivery timeout "
                             "stays below it)")
        if self.deadletter_inputs not in ("redact", "keep"):
            raise ValueError(f"UNLEARN_DEADLETTER_INPUTS must be redact | keep, got {self.deadletter_inputs!r}")
