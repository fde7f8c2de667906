"""The featurizer's side of signed requests that does I/O: it follows the client registry and
keeps each by-head partition's :class:`~streams.featurizer.auth.AuthState` (the decisions are in
``auth.py``). With ``UNLEARN_AUTH_MODE=off`` it does nothing and hands out no authorizer."""

from __future__ import annotations

from unlearn.infra.registry import ClientRegistryView
from unlearn.infra.settings import Settings
from unlearn.streams.featurizer.auth import Authorizer, AuthState
from unlearn.streams.featurizer.settings import FeaturizerSettings

__all__ = ["AuthGate"]


class AuthGate:
    """Registry follower plus per-partition replay windows and token buckets."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.signed = settings.auth_mode == "signed"
        self.view: ClientRegistryView | None = None
        self.states: dict[int, AuthState] = {}

    def start(self) -> None:
        """In signed mode, read the client registry to its end before judging anything (a
        request is never refused as ``unknown_client`` only because the registry was not read)."""
        if self.signed:
            self.view = ClientRegistryView(self.settings).start(wait_caught_up=self.settings.admin_timeout)

    def stop(self) -> None:
        """Stop following the registry."""
        if self.view is not None:
            self.view.stop()
            self.view = None

    def authorizer(self, partition: int) -> Authorizer | None:
        """The authorizer for one batch of ``partition`` (one registry snapshot), or None when off."""
        if not self.signed:
            return None
        assert self.view is not None, "AuthGate.start() first"
        state = self.states.setdefault(partition, AuthState())
        return Authorizer(self.view.snapshot(), state, FeaturizerSettings.of(self.settings).auth_replay_window_seconds)
