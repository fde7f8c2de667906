"""Which gamma a new head gets in the ledger (:class:`ContractGammas`): its contract's (docs/registry.md).

A declared head's contract (``unlearn heads create --gamma``) and an auto-created head's
(the featurizer's settings) both name the head's ridge gamma; the ledger takes it from there, so
a ledger worker with other ``UNLEARN_GAMMA`` / ``UNLEARN_HEAD_GAMMAS`` settings solves the same
head. The registry is followed; a head the follower has not seen yet (its contract is written
before its first delta, but the follower may lag by a poll) makes one synchronous read of the
registry, once per new head. A head whose contract cannot be found (no registry topic, or deltas
written without the featurizer) falls back to the settings, with a warning. A head's gamma is
fixed at its creation in the ledger and then travels with its state (``HeadMeta.gamma``).
"""

from __future__ import annotations

import logging

from unlearn.common.registry import RegistryView, read_contracts
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.runtime.retry import RetryPolicy
from unlearn.runtime.topic_reader import TopicReadError
from unlearn.schemas.head_contract import HeadContract

__all__ = [
    "ContractGammas",
]

log = logging.getLogger("unlearn.ledger")


class ContractGammas:
    """Head id -> gamma from the head registry (module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.view = RegistryView(settings)
        self._read: dict[str, HeadContract] = {}

    def start(self) -> None:
        """Start following the registry (does not wait: a missing topic only means fallbacks)."""
        self.view.start()

    def stop(self) -> None:
        """Stop following."""
        self.view.stop()

    def contract(self, head_id: str) -> HeadContract | None:
        """The head's latest contract: the follower's, else one synchronous read of the registry."""
        c = self.view.get(head_id) or self._read.get(head_id)
        if c is None:
            timeout = min(self.settings.admin_timeout, 10.0)
            try:  # a broker restarting is waited for (runtime.retry): only a missing registry falls back
                self._read = RetryPolicy.of(self.settings).call(
                    "reading the head registry", lambda: read_contracts(self.settings, timeout=timeout))
            except TopicReadError as exc:
                log.warning("head registry not readable (%s)", exc)
            c = self._read.get(head_id)
        return c

    def gamma(self, head_id: str) -> float:
        """The gamma of a new head: its contract's, else the settings' (with a warning)."""
        c = self.contract(head_id)
        if c is not None:
            return c.gamma
        log.warning("head %r has no contract in the head registry: gamma from the settings (%g)", head_id,
                    HeadSettings.of(self.settings).gamma_for(head_id))
        return HeadSettings.of(self.settings).gamma_for(head_id)
