"""Rebuilding an assigned ``deltas`` partition from its ``ledger-state`` (:class:`Recovery`,
docs/design.md section 4).

The partition's latest checkpoint and the snapshots it names are read back
(``ChangelogStore.recover``); ``check_recovery`` makes sure they belong to the log the worker
reads (invariant 2 of ``checkpoint_rules``) and gives the floor to resume at. Every restored head
is republished as an exact update (into a new heads generation, or the same topic where the store
trims), and the older updates go once those are durable (``changelog_store``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from unlearn.infra.settings import Settings
from unlearn.runtime.log_position import log_bounds
from unlearn.runtime.retry import RetryPolicy
from unlearn.streams.ledger.changelog_store import ChangelogStore
from unlearn.streams.ledger.checkpoint_rules import check_recovery
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime
from unlearn.streams.ledger.outputs import Outputs
from unlearn.streams.ledger.owned_partitions import PartitionState
from unlearn.streams.ledger.settings import LedgerSettings

__all__ = [
    "Recovery",
]

log = logging.getLogger("unlearn.ledger")


class Recovery:
    """Rebuilds partitions for one worker (module docstring)."""

    def __init__(self, settings: Settings, consumer: Any, store: ChangelogStore, outputs: Outputs,
                 config: HeadConfig) -> None:
        self.settings = settings
        self.consumer = consumer  # asks the deltas partition's bounds
        self.store = store
        self.outputs = outputs
        self.config = config  # a restored head's runtime settings (its gamma is in its state)
        self.deltas_topic = settings.topic("deltas")
        self.tuning = LedgerSettings.of(settings)

    def recover(self, partition: int, topic_id: str) -> PartitionState:
        """Rebuild ``partition`` from its checkpoint and check it belongs to the log whose topic id
        is ``topic_id`` (StaleStateError naming the mismatch if not)."""
        cp, heads = self.store.recover(partition)
        log_start, log_end = RetryPolicy.of(self.settings).call(
            f"reading the bounds of deltas partition {partition}",
            lambda: log_bounds(self.settings, self.consumer, self.deltas_topic, partition,
                               cp.floor if cp is not None else 0))
        floor = check_recovery(cp, topic_id, log_start, log_end)
        ps = PartitionState(partition, floor)
        rewrite = self.store.begin_heads_rewrite(partition, fresh=True)
        for head_id, state in heads.items():
            head = HeadRuntime.from_snapshot(state, self.config)
            if head.multiset is None:
                log.warning("head %r: the multiset hash of its retained rows is unknown (a packed entry without "
                            "one): head updates and receipts carry none", head_id)
            ps.heads[head_id] = head
            # The last update a reader saw may be a fast one that its writer never got to reset:
            # republish the restored version as canonical (same version, same digest).
            if head.mode == "fast":
                head.reset("restored")
            self.outputs.publish_head(partition, head, "exact")
        # The older updates hold nothing a reader still needs once the republished ones are durable.
        self.outputs.flush("recovery")
        self.store.end_heads_rewrite(rewrite)
        if cp is not None:
            ps.pointers = dict(cp.heads)
            if cp.erasure_pending and self.tuning.erasure_rotate_seconds > 0:
                # A delete made durable before the crash, not yet rotated away: its window restarts
                # now (a delete past the floor is replayed, and marks the partition again).
                ps.erasure_since = time.monotonic()
        log.info("deltas partition %d: %d heads restored, resuming at offset %d", partition, len(ps.heads), floor)
        return ps
