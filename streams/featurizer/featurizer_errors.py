"""The featurizer's errors: what stops the process (it should exit non-zero and be restarted:
:class:`FeaturizerError`) and what stops a batch's commit (:class:`KeyStoreError`).
"""

from __future__ import annotations

__all__ = [
    "FeaturizerError",
    "KeyStoreError",
    "LostCacheError",
]


class FeaturizerError(RuntimeError):
    """The featurizer cannot go on (the process should exit non-zero and be restarted)."""




class KeyStoreError(RuntimeError):
    """A key could not be made durable (the batch must not be committed)."""


class LostCacheError(FeaturizerError):
    """A partition's cache (local and changelog) is empty but the group already committed offsets
    for it."""
