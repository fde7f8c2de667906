"""The ledger's durable state in Kafka: the ``ledger-state`` changelog topic.

Partition p of ``ledger-state`` holds the state of the heads whose deltas are on ``deltas``
partition p: snapshot pieces (see snapshot.py) and checkpoint records (checkpoint.py). Any worker
on any host rebuilds a partition from here, so a worker has no local state to lose or to get
wrong. Recovery reads only what the latest checkpoint names: it scans the partition backwards
from its end for the last checkpoint record, then seeks to each head's pieces, so it costs the
size of the state, not the age of the log.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from unlearn.infra.profiles import consumer_config, producer_config
from unlearn.infra.settings import Settings
from unlearn.ledger import ExactLedger

from .checkpoint import Checkpoint, HeadPointer, StaleStateError, checkpoint_key, latest_checkpoint, piece_key
from .snapshot import HeadMeta, SnapshotError, decode_state, encode_state, join_pieces, split_pieces, state_sha

log = logging.getLogger("unlearn.ledger")

#: First backward-scan window when looking for the last checkpoint record (records).
_SCAN_WINDOW = 256


class StateStoreError(RuntimeError):
    """The changelog could not be written or read (broker down past the timeout, ...)."""


Record = tuple[int, bytes | None, bytes | None]  # (offset, key, value)


class ChangelogStore:
    """Writes snapshots and checkpoints of ``deltas`` partitions; reads them back."""

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import Producer

        self.settings = settings
        self.topic = settings.topic("ledger-state")
        # One record per batch: the embedded broker's ListOffsets(latest) is only right then, and
        # the backward scan starts from it (infra.profiles.BrokerQuirks.list_offsets_latest_exact).
        self.producer = Producer(producer_config(settings, **{"batch.num.messages": 1, "linger.ms": 0}))
        self._generations: dict[str, int] = {}

    def close(self) -> None:
        self.producer.flush(self.settings.admin_timeout)

    # ---------------------------------------------------------------- writing
    def _produce_all(self, partition: int, records: list[tuple[bytes, bytes]]) -> list[int]:
        """Produce ``records`` to ``partition`` and wait until each is durable; their offsets."""
        offsets: list[int | None] = [None] * len(records)
        errors: list[str] = []

        def on_delivery(i: int) -> Callable[[Any, Any], None]:
            def cb(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    offsets[i] = msg.offset()
            return cb

        for i, (key, value) in enumerate(records):
            self._produce(partition, key, value, on_delivery(i))
        remaining = self.producer.flush(self.settings.admin_timeout)
        if remaining or errors or any(o is None for o in offsets):
            raise StateStoreError(f"writing {self.topic}/{partition} failed: "
                                  f"{errors[:3] or f'{remaining} records not delivered'}")
        return [int(o) for o in offsets if o is not None]

    def _produce(self, partition: int, key: bytes, value: bytes, cb: Callable[[Any, Any], None]) -> None:
        while True:
            try:
                self.producer.produce(self.topic, key=key, value=value, partition=partition, on_delivery=cb)
                return
            except BufferError:  # local queue full: let deliveries drain
                self.producer.poll(0.1)

    def write_snapshot(self, partition: int, meta: HeadMeta, ledger: ExactLedger,
                       previous: HeadPointer | None) -> HeadPointer:
        """Write a head's snapshot into the slot the previous checkpoint does not name."""
        generation = (previous.generation if previous is not None else 0) + 1
        state = encode_state(meta, ledger)
        pieces = split_pieces(state, generation, meta.applied_offset, self.settings.changelog_max_bytes)
        slot = generation % 2
        offsets = self._produce_all(partition, [(piece_key(meta.head_id, slot, i), p) for i, p in enumerate(pieces)])
        return HeadPointer(generation, meta.applied_offset, state_sha(state).hex(), tuple(offsets))

    def write_checkpoint(self, cp: Checkpoint) -> None:
        self._produce_all(cp.partition, [(checkpoint_key(cp.partition), cp.encode())])

    # ---------------------------------------------------------------- reading
    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        group = f"{self.settings.topic_prefix}ledger-recovery-{uuid.uuid4().hex}"  # never joined
        return Consumer(consumer_config(self.settings, group, **{"enable.partition.eof": True}))

    def recover(self, partition: int) -> tuple[Checkpoint | None, dict[str, tuple[HeadMeta, ExactLedger]]]:
        """The latest checkpoint of ``partition`` and the heads it names (verified snapshots)."""
        c = self._consumer()
        try:
            cp = self._find_checkpoint(c, partition)
            heads: dict[str, tuple[HeadMeta, ExactLedger]] = {}
            if cp is not None:
                for head_id, ptr in cp.heads.items():
                    heads[head_id] = self._read_head(c, partition, head_id, ptr)
            return cp, heads
        finally:
            c.close()

    def _find_checkpoint(self, c: Any, partition: int) -> Checkpoint | None:
        from confluent_kafka import TopicPartition

        tp = TopicPartition(self.topic, partition)
        low, high = c.get_watermark_offsets(tp, timeout=self.settings.admin_timeout)
        low, high = max(0, int(low)), max(0, int(high))
        stop: int | None = None  # None: to the partition's end
        window = _SCAN_WINDOW
        start = max(low, high - window)
        while True:
            cp = latest_checkpoint(self._read_range(c, partition, start, stop), partition)
            if cp is not None or start <= low:
                return cp
            stop, window = start, window * 4
            start = max(low, start - window)

    def _read_range(self, c: Any, partition: int, start: int, stop: int | None) -> list[Record]:
        """Records at offsets [start, stop) of our partition (``stop`` None: to its end)."""
        from confluent_kafka import KafkaError, TopicPartition

        c.assign([TopicPartition(self.topic, partition, start)])
        out: list[Record] = []
        deadline = time.monotonic() + self.settings.admin_timeout
        while time.monotonic() < deadline:
            for m in c.consume(num_messages=500, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return out
                    raise StateStoreError(f"reading {self.topic}/{partition}: {err}")
                if stop is not None and m.offset() >= stop:
                    return out
                out.append((m.offset(), m.key(), m.value()))
        raise StateStoreError(f"reading {self.topic}/{partition} from {start} did not finish in "
                              f"{self.settings.admin_timeout:g}s")

    def _read_head(self, c: Any, partition: int, head_id: str, ptr: HeadPointer) -> tuple[HeadMeta, ExactLedger]:
        want = set(ptr.piece_offsets)
        found: dict[int, bytes | None] = {}
        for lo, hi in _runs(sorted(want)):
            for offset, _key, value in self._read_range(c, partition, lo, hi + 1):
                if offset in want:
                    found[offset] = value
        try:
            meta, ledger = decode_state(join_pieces(ptr.generation, ptr.applied_offset, ptr.sha256,
                                                    [found.get(o) for o in ptr.piece_offsets]))
        except (SnapshotError, ValueError) as exc:
            raise StaleStateError(f"snapshot of head {head_id!r} in {self.topic}/{partition} does not verify: {exc}"
                                  ) from None
        if meta.head_id != head_id:
            raise StaleStateError(f"snapshot named for head {head_id!r} holds head {meta.head_id!r}")
        return meta, ledger


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted offsets -> inclusive (first, last) runs, so contiguous pieces are read in one pass."""
    runs: list[tuple[int, int]] = []
    for o in offsets:
        if runs and o <= runs[-1][1] + 64:  # small gaps (other heads' pieces) are cheaper to read through
            runs[-1] = (runs[-1][0], o)
        else:
            runs.append((o, o))
    return runs
