"""One ``deltas`` message into its head's ledger (:class:`DeltaFold`): decode, open, check the
partition, apply.

Per message (key = head id, so one head's deltas are totally ordered): decode, check the key and
open sealed rows (``row_opener.RowOpener``) -> refuse a head that lives on another partition, or a
head whose first delta is not an add -> create the head on its first add (with its contract's
gamma, ``contract_gammas``) -> ``HeadRuntime.apply`` (one version) -> dead letters and rejected
receipts for refused entries. What the poll then owes (head updates, applied receipts) is
collected in a ``PollOutputs``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from unlearn.infra.settings import Settings
from unlearn.schemas.delta_codec import CodecError, decode_delta
from unlearn.schemas.sealed import SealError
from unlearn.streams.ledger.contract_gammas import ContractGammas
from unlearn.streams.ledger.delta_rules import creates_head
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime
from unlearn.streams.ledger.outputs import Outputs, PollOutputs
from unlearn.streams.ledger.owned_partitions import OwnedPartitions, PartitionState
from unlearn.streams.ledger.row_opener import RowOpener
from unlearn.streams.ledger.settings import LedgerSettings

__all__ = [
    "DeltaFold",
]

log = logging.getLogger("unlearn.ledger")


class DeltaFold:
    """Folds deltas messages into the heads of the partitions a worker owns (module docstring)."""

    def __init__(self, settings: Settings, owned: OwnedPartitions, outputs: Outputs, contracts: ContractGammas,
                 opener: RowOpener, config: HeadConfig) -> None:
        self.settings = settings
        self.owned = owned
        self.outputs = outputs
        self.contracts = contracts  # a new head's gamma: its contract's
        self.opener = opener  # sealed rows -> rows (docs/erasure.md)
        self.config = config  # a new head's runtime settings, but for its gamma
        self.tuning = LedgerSettings.of(settings)

    def fold(self, ps: PartitionState, offset: int, key: bytes | None, raw: bytes, poll: PollOutputs) -> None:
        """Fold one deltas message (already counted in ``ps``) into its head's ledger; its head
        update and receipts are owed in ``poll``, its dead letters go out now."""
        part = ps.partition
        try:
            delta = decode_delta(raw)
            if key and key.decode("utf-8", "replace") != delta.head_id:
                raise CodecError(f"message key {key!r} is not the head id {delta.head_id!r}: "
                                 "deltas must be keyed by head id to stay ordered")
            # Creation is decided on the message as sent: a first message whose adds are all erased
            # (keys destroyed since) still created the head, with the grid its header carries.
            creates = creates_head(delta)
            delta = self.opener.open(delta).delta
        except (CodecError, SealError) as exc:
            self.outputs.bad_delta(raw, part, offset, key, str(exc))
            return
        owner = self.owned.owner(delta.head_id)
        if owner is not None and owner != part:
            self.outputs.reject_all(delta, raw, part, offset, key, "wrong_partition",
                                    f"head {delta.head_id!r} lives on deltas partition {owner}, not {part}: "
                                    "a head's deltas must share one partition (key them by head id)",
                                    poll.record_events)
            return
        head = ps.heads.get(delta.head_id)
        if head is None:
            if not creates:
                self.outputs.reject_all(delta, raw, part, offset, key, "unknown_head",
                                        f"head {delta.head_id!r} does not exist yet: its first event must be an add",
                                        poll.record_events)
                return
            config = replace(self.config, gamma=self.contracts.gamma(delta.head_id))
            head = HeadRuntime.new(delta.head_id, delta, config)
            self.owned.place(ps, head)
            log.info("head %r created (d=%d)", delta.head_id, delta.d)
        outcome = head.apply(delta, offset, part)
        ps.last_touched[head.head_id] = offset
        if outcome.deletes and ps.erasure_since is None and self.tuning.erasure_rotate_seconds > 0:
            ps.erasure_since = time.monotonic()
        if outcome.skipped:
            log.info("head %r: offset %d/%d skipped (%s)", head.head_id, part, offset, outcome.skipped)
            return
        original = self.outputs.dead_original(raw) if outcome.rejections else raw
        for rej in outcome.rejections:
            self.outputs.rejected(head.head_id, rej, original, part, offset, key, poll.record_events)
        poll.add(part, head, outcome)
