"""Reading the feature cache's changelog back from Kafka (the only I/O of the changelog): the
last position of a partition, found by scanning back from its end, and the whole partition,
folded (:func:`~streams.featurizer.changelog_restore.fold_changelog`).
"""

from __future__ import annotations

import uuid
from typing import Any

from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.log_position import watermarks
from unlearn.runtime.topic_reader import TopicReadError, read_range
from unlearn.streams.featurizer.changelog_records import OpenSample, Position, delivered_key, position_key
from unlearn.streams.featurizer.changelog_restore import FoldedChangelog, fold_changelog

__all__ = ["ChangelogReadError", "ChangelogReader"]

_SCAN_WINDOW = 512  # records of the first backward window when looking for the last position


class ChangelogReadError(RuntimeError):
    """A changelog partition could not be read in time."""


class ChangelogReader:
    """Reads one changelog topic with a group-less consumer (never joins a group)."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.settings = settings
        self.topic = topic

    def _consumer(self) -> Any:

        group = f"{self.settings.topic_prefix}featurizer-restore-{uuid.uuid4().hex}"
        return clients.consumer(self.settings, group, **{"enable.partition.eof": True})

    def latest_position(self, partition: int) -> tuple[Position | None, int]:
        """The last ``position/<p>`` record and the highest generation a ``delivered`` record after
        it names (0: none), scanning back from the end in growing windows (cheap: both are within
        the last batch's records)."""
        want, done_key = position_key(partition), delivered_key(partition)
        delivered = 0
        c = self._consumer()
        try:
            low, high = watermarks(c, self.topic, partition, self.settings.admin_timeout)
            low, high = max(0, int(low)), max(0, int(high))
            stop: int | None = None  # None: to the partition's true end (EOF), whatever ListOffsets said
            window = _SCAN_WINDOW
            start = max(low, high - window)
            while True:
                for _, k, v in reversed(self._read(c, partition, start, stop)):
                    if k == done_key and v is not None:
                        delivered = max(delivered, int(v))
                    elif k == want and v is not None:
                        return Position.decode(v), delivered
                if start <= low:
                    return None, 0
                stop, window = start, window * 4
                start = max(low, start - window)
        finally:
            c.close()

    def restore(self, partition: int, open_sample: OpenSample | None = None) -> FoldedChangelog:
        """Read the whole partition and fold it (last value per key, tombstones delete; sealed
        sample records opened with ``open_sample``)."""
        c = self._consumer()
        try:
            records = self._read(c, partition, 0, None)
        finally:
            c.close()
        return fold_changelog(((k, v) for _, k, v in records if k is not None), partition, open_sample)

    def _read(self, c: Any, partition: int, start: int, stop: int | None) -> list[tuple[int, bytes | None,
                                                                                    bytes | None]]:
        """(offset, key, value) of offsets [start, stop) (``stop`` None: to the partition's end)."""
        try:  # a large cache takes long: time out on no progress only
            return read_range(c, self.topic, partition, start, stop, max(30.0, self.settings.admin_timeout))
        except TopicReadError as exc:
            raise ChangelogReadError(str(exc)) from None
