"""Settings of the featurizer (``unlearn featurizer --help``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unlearn.infra.settings import Section, setting


@dataclass(frozen=True)
class FeaturizerSettings(Section):
    """Micro-batching, request admission (auth, remove wins) and the keys the featurizer rotates."""

    title: ClassVar[str] = "featurizer"

    batch_max_events: int = setting(256, "most events in one micro-batch")
    batch_max_ms: int = setting(50, "batch window after the first add (a delete closes it at once)")
    delete_lane: bool = setting(True, "judge and send a batch's deletes before the adds ahead of them")
    auth_replay_window_seconds: float = setting(300.0, "signed mode: |now - ts| bound, event ids kept this long")
    max_clock_skew_seconds: float = setting(300.0, "an add dated more than this ahead is refused")
    tombstone_retention_seconds: float = setting(604_800.0, "a delete's tombstone is kept this long (0: for ever)")
    seal_rows: bool = setting(True, "seal rows per subject (crypto-shredding); off = plaintext rows")
    require_sealed_input: bool = setting(False, "refuse plaintext adds")
    shred_every_seconds: float = setting(2.0, "at most one subject-key rotation per partition per period")
    transit_rotate_seconds: float = setting(20.0, "a new transit key per partition this often")
    max_image_pixels: int = setting(4_000_000, "an image add declaring more pixels (width x height) is refused")

    def check(self) -> None:
        if self.batch_max_events < 1 or self.batch_max_ms < 0:
            raise ValueError("UNLEARN_BATCH_MAX_EVENTS must be >= 1 and UNLEARN_BATCH_MAX_MS >= 0")
        if not 1.0 <= self.auth_replay_window_seconds <= 86_400.0:
            raise ValueError("UNLEARN_AUTH_REPLAY_WINDOW_SECONDS must be in 1..86400")
        if not 0.0 <= self.max_clock_skew_seconds <= 86_400.0:
            raise ValueError("UNLEARN_MAX_CLOCK_SKEW_SECONDS must be in 0..86400")
        if not (self.tombstone_retention_seconds == 0
                or self.max_clock_skew_seconds < self.tombstone_retention_seconds < float("inf")):
            raise ValueError("UNLEARN_TOMBSTONE_RETENTION_SECONDS must be 0 (kept for ever) or a finite number of "
                             "seconds above UNLEARN_MAX_CLOCK_SKEW_SECONDS")
        if self.shred_every_seconds < 0:
            raise ValueError("UNLEARN_SHRED_EVERY_SECONDS must be >= 0")
        if not 1 <= self.max_image_pixels <= 64_000_000:
            raise ValueError("UNLEARN_MAX_IMAGE_PIXELS must be in 1..64000000 (the decoder's own ceiling)")
        if self.transit_rotate_seconds < 4.0:
            raise ValueError("UNLEARN_TRANSIT_ROTATE_SECONDS must be at least 4 (a successor is published ahead "
                             "of use_until)")
