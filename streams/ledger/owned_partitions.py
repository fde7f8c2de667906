"""The ``deltas`` partitions one ledger worker owns (:class:`OwnedPartitions`): each one's state
(:class:`PartitionState`: its heads, durable snapshot pointers, what waits for a checkpoint) and
where each head lives, so that a head met on another partition is refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from unlearn.common.checkpoint_record import HeadPointer
from unlearn.streams.ledger.head_runtime import HeadRuntime

__all__ = [
    "OwnedPartitions",
    "PartitionState",
]


@dataclass
class PartitionState:
    """What the worker holds for one ``deltas`` partition it owns."""

    partition: int
    next_offset: int  # next deltas offset to process
    heads: dict[str, HeadRuntime] = field(default_factory=dict)
    pointers: dict[str, HeadPointer] = field(default_factory=dict)  # latest durable snapshot per head
    last_touched: dict[str, int] = field(default_factory=dict)  # head -> offset of its last message since checkpoint
    pending: int = 0  # messages processed since the last checkpoint
    last_checkpoint: float = field(default_factory=time.monotonic)
    # When the first delete since the partition's last erasure rotation was applied (monotonic;
    # None: none). UNLEARN_ERASURE_ROTATE_SECONDS later, one rotation covers every delete since.
    erasure_since: float | None = None


class OwnedPartitions:
    """Partition -> its state, and head id -> its partition: a head's deltas must share one
    partition, so a head met on another one is refused (``owner``)."""

    def __init__(self) -> None:
        self.states: dict[int, PartitionState] = {}
        self._head_partition: dict[str, int] = {}

    def add(self, ps: PartitionState) -> None:
        self.states[ps.partition] = ps
        for head_id in ps.heads:
            self._head_partition[head_id] = ps.partition

    def place(self, ps: PartitionState, head: HeadRuntime) -> None:
        """A new head, on the partition its first delta came from."""
        ps.heads[head.head_id] = head
        self._head_partition[head.head_id] = ps.partition

    def drop(self, partition: int) -> None:
        ps = self.states.pop(partition, None)
        if ps is not None:
            for head_id in ps.heads:
                self._head_partition.pop(head_id, None)

    def owner(self, head_id: str) -> int | None:
        """The partition ``head_id`` lives on (None: no partition this worker owns)."""
        return self._head_partition.get(head_id)

    def get(self, partition: int) -> PartitionState | None:
        return self.states.get(partition)

    def __getitem__(self, partition: int) -> PartitionState:
        return self.states[partition]

    def __iter__(self) -> Iterator[PartitionState]:
        """The states in the order they were added (a copy: a checkpoint may revoke as it goes)."""
        return iter(list(self.states.values()))

    def __len__(self) -> int:
        return len(self.states)
