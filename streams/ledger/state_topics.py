"""The ledger's own topics on the broker (:class:`StateTopics`): ``ledger-state`` and ``heads`` per
deltas partition, through one ``runtime.family_topics.FamilyTopics`` (creation, listing,
trims, end offsets, deletion after a grace). What is the ledger's here is the policy:

- generations are created compacted, and where the broker has DeleteRecords also
  ``cleanup.policy=compact,delete`` with ``retention.ms=-1``
  (``runtime.topics.trimmed_changelog_config``): Kafka refuses DeleteRecords on a
  compact-only topic;
- a superseded generation lives ``UNLEARN_HEADS_RETIRE_SECONDS``: the featurizer's shredder and
  the heads' followers read these topics too.

Why the store trims or rotates: ``changelog_store``'s docstring.
"""

from __future__ import annotations

from unlearn.infra.settings import Settings
from unlearn.runtime.family_topics import FamilyTopics
from unlearn.runtime.topics import trimmed_changelog_config
from unlearn.streams.ledger.settings import LedgerSettings

__all__ = [
    "StateTopics",
]


class StateTopics(FamilyTopics):
    """The ledger's ``FamilyTopics``: its topic config and retire grace (module docstring)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, grace_s=LedgerSettings.of(settings).heads_retire_seconds,
                         config=trimmed_changelog_config(settings))
