"""Settings of the ledger processor (``unlearn ledger --help``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unlearn.infra.settings import Section, Settings, setting


@dataclass(frozen=True)
class LedgerSettings(Section):
    """Factor resets, checkpoints, state-topic rotation and head-update contents."""

    title: ClassVar[str] = "ledger"

    reset_every_events: int = setting(1000, "refactor a head's Cholesky factor after this many events")
    reset_every_seconds: float = setting(5.0, "... or after this many seconds")
    reset_in_thread: bool = setting(True, "compute the timer's resets in a thread (false: on the poll thread)")
    drift_threshold: float = setting(1e-9, "... or when the drift estimate passes this")
    checkpoint_every_messages: int = setting(500, "snapshot period in messages")
    checkpoint_every_seconds: float = setting(5.0, "snapshot period in seconds")
    state_rotate_bytes: int = setting(64_000_000, "ledger-state / heads bytes before a rewrite (trim, or rotation)")
    heads_retire_seconds: float = setting(10.0, "a superseded heads / ledger-state generation lives this long")
    erasure_rotate_seconds: float = setting(20.0, "rewrite state topics holding erased rows this often (0 = off)")
    publish_posterior: bool = setting(True, "head updates carry T = H^-1")
    head_sparse_weights: bool = setting(True, "head updates leave W's all-zero columns out (false: for "
                                        "readers older than flag bit 5, docs/formats.md)")
    ledger_blas_threads: int = setting(1, "BLAS threads of the ledger process")
    product_hold_rows: int = setting(256, "rows of a head whose exact products may wait for the worker's idle "
                                     "time (64: multiply at once)")
    factor_hold_rows: int = setting(256, "rows a head's fast Cholesky factor may take at the worker's idle time, "
                                    "W kept exact meanwhile (0: update the factor at once)")

    def check(self) -> None:
        if self.checkpoint_every_messages < 1 or self.checkpoint_every_seconds <= 0:
            raise ValueError("UNLEARN_CHECKPOINT_EVERY_MESSAGES must be >= 1 and _SECONDS > 0")
        if self.heads_retire_seconds < 3.0:
            raise ValueError("UNLEARN_HEADS_RETIRE_SECONDS must be at least 3 (readers move to a new heads "
                             "generation within about a second and must be off the old one before it is deleted)")
        if self.product_hold_rows < 1:
            raise ValueError(f"UNLEARN_PRODUCT_HOLD_ROWS must be >= 1, got {self.product_hold_rows}")
        if self.factor_hold_rows < 0:
            raise ValueError(f"UNLEARN_FACTOR_HOLD_ROWS must be >= 0, got {self.factor_hold_rows}")
        if self.erasure_rotate_seconds < 0:
            raise ValueError(f"UNLEARN_ERASURE_ROTATE_SECONDS must be >= 0 (0 = off), "
                             f"got {self.erasure_rotate_seconds}")

    def check_with(self, settings: Settings) -> None:
        if self.state_rotate_bytes < settings.changelog_max_bytes:
            raise ValueError("UNLEARN_STATE_ROTATE_BYTES must be at least UNLEARN_CHANGELOG_MAX_BYTES")
