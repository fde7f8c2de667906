"""What the featurizer's service shell (``service.py``, ``batch.py``) shares: the :class:`Topics`
one featurizer follows, its test hooks (:data:`FaultHook`, :data:`ReadyHook`) and the service's
per-batch counts (:func:`count_batch`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from unlearn.streams.featurizer.batch_io import BatchOutcome, InMessage

__all__ = [
    "Topics",
    "FaultHook",
    "ReadyHook",
    "count_batch",
]


@dataclass(frozen=True)
class Topics:
    """The topics one featurizer follows, and what it read about them at start (ids and
    partition counts: 0 and "" until then)."""

    requests: str  # what producers write
    by_head: str  # what the caches follow (``<requests>.by-head``)
    changelog: str | None  # ``featurizer-cache``; None: the cache has no changelog (federated, own requests topic)
    origin_stream: str  # the stream in origin headers: the requests topic without the prefix
    requests_id: str = ""
    by_head_id: str = ""
    by_head_partitions: int = 0  # what heads are routed by
    requests_partitions: int = 0  # what transit keys are followed by


FaultHook = Callable[[str], None]
"""Test hook, called at "judged" (a batch's records judged and sealed, not yet committed: the
deletes fetched meanwhile are looked at next), "after_route" (forwarded records acknowledged, after
the batch's by-head records were featurized, requests offsets not committed), "after_cache_commit",
"after_changelog"
(phase 0 acknowledged, nothing else sent), "after_produce" (phase 1 acknowledged: awaited before
the next batch's sqlite commit, or when idle), "after_outbox_ack" and "after_offset_commit";
raising there simulates a crash at that point."""


ReadyHook = Callable[[], object]
"""Called once, after the first partition assignment is in place (caches opened, seeks done)."""


def count_batch(stats: dict[str, int], p: int, msgs: Sequence[InMessage], outcome: BatchOutcome,
                judged_ahead: int = 0) -> None:
    """Add a batch's outcome to the service's ``stats``; log its dead letters and dropped copies.
    ``judged_ahead``: records of ``msgs`` a delete lane judged before a crash (not judged again)."""
    log = logging.getLogger("unlearn.featurizer")
    skipped = outcome.reforwarded + outcome.gaps
    stats["events"] += len(msgs) - skipped - judged_ahead
    stats["reforwarded"] += outcome.reforwarded
    stats["gaps"] += outcome.gaps
    stats["accepted"] += outcome.accepted
    stats["rows"] += outcome.rows
    stats["deltas"] += len(outcome.deltas)
    stats["deadletters"] += len(outcome.deadletters)
    stats["receipts"] += len(outcome.receipts)
    if outcome.deadletters:
        log.info("partition %d offsets %d..%d: dead letters %s", p, msgs[0].offset, outcome.last_offset,
                 outcome.reasons())
    if skipped:
        log.warning("partition %d offsets %d..%d: dropped %d re-forwarded cop%s and %d record(s) after a failed "
                    "forward (forwarded again)", p, msgs[0].offset, outcome.last_offset, outcome.reforwarded,
                    "y" if outcome.reforwarded == 1 else "ies", outcome.gaps)
