"""What ``featurize_batch`` needs besides the data: :class:`CoreConfig`, one featurizer's topics,
mode (federated or not), declared head contracts and admission settings, built from ``Settings``
by the shell and given the head registry's contracts per batch (``head_contracts.with_registry``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from unlearn.common.by_head import routed_topic_name
from unlearn.features.contract import quantizer
from unlearn.infra.settings import ErasureSettings, HeadSettings, Settings
from unlearn.schemas.head_contract import HeadContract
from unlearn.schemas.source_id import source_stream
from unlearn.streams.featurizer.settings import FeaturizerSettings
from unlearn.streams.featurizer.tombstones import TombstonePolicy

__all__ = [
    "CoreConfig",
]


@dataclass(frozen=True)
class CoreConfig:
    """Everything ``featurize_batch`` needs besides the data (built from Settings by the shell)."""

    requests_topic: str
    deltas_topic: str
    deadletter_topic: str
    receipts_topic: str
    stream: str = "requests"
    routed_topic: str = ""  # the by-head topic read; "" = requests_topic itself (no routing)
    federated: bool = False
    client_id: str | None = None
    contracts: Mapping[str, HeadContract] = field(default_factory=dict)  # declared heads (the registry, per batch)
    registry_topic: str = ""  # where auto contracts are published; "" = not published
    head_backbones: Mapping[str, str] = field(default_factory=dict)  # this batch's: the settings', then contracts'
    heads: HeadSettings = field(default_factory=HeadSettings)  # a new head's contract defaults
    featurizer: FeaturizerSettings = field(default_factory=FeaturizerSettings)  # admission: sealing, remove wins
    max_message_bytes: int = 100_000_000  # UNLEARN_MAX_MESSAGE_BYTES
    redact_deadletter_inputs: bool = True  # UNLEARN_DEADLETTER_INPUTS=redact (schemas/redaction.py)

    def __post_init__(self) -> None:
        if self.federated and not self.client_id:
            raise ValueError("federated mode needs a client_id (the data owner this site serves)")
        quantizer(self.heads.frac_bits, self.heads.feature_bound)  # raises on an impossible grid

    @cached_property
    def tombstones(self) -> TombstonePolicy:
        """Remove wins' clock bounds (``tombstones.TombstonePolicy``)."""
        return TombstonePolicy(self.featurizer.max_clock_skew_seconds, self.featurizer.tombstone_retention_seconds)

    @property
    def input_topic(self) -> str:
        """The topic this featurizer consumes: the by-head topic, or ``requests_topic``."""
        return self.routed_topic or self.requests_topic

    @classmethod
    def from_settings(cls, settings: Settings, *, requests_topic: str | None = None, federated: bool = False,
                      client_id: str | None = None) -> CoreConfig:
        """From the settings (``requests_topic`` default: ``<prefix>requests``); the featurizer
        reads ``routed_topic_name(requests_topic)`` and names its source ids after it."""
        topic = requests_topic or settings.topic("requests")
        routed = routed_topic_name(topic)
        return cls(
            requests_topic=topic,
            deltas_topic=settings.topic("deltas"),
            deadletter_topic=settings.topic("deadletter"),
            receipts_topic=settings.topic("receipts"),
            stream=source_stream(routed, settings.topic_prefix, client_id if federated else None),
            routed_topic=routed,
            head_backbones=HeadSettings.of(settings).backbone_overrides(),
            federated=federated,
            client_id=client_id if federated else None,
            max_message_bytes=settings.max_message_bytes,
            registry_topic=settings.topic("head-registry"),
            heads=HeadSettings.of(settings),
            featurizer=FeaturizerSettings.of(settings),
            redact_deadletter_inputs=ErasureSettings.of(settings).deadletter_inputs == "redact",
        )
