"""Opening sealed ``deltas`` rows before the ledger applies them (:class:`RowOpener`, docs/erasure.md).

A thin transform in front of ``HeadRuntime.apply``: a SEALED entry becomes the ROWS entry it
sealed (``schemas.sealed.open_delta``) with the keys of the ``subject-keys`` family
(``common.key_ring.KeyRing``). A key not known yet makes the ring read its head's partition of
the family to its current end once (the featurizer that owns by-head partition P writes the keys
of P's heads into key partition P, having acknowledged each before producing a row under it),
and, if the key is not there either, the whole family; a key still unknown then is destroyed:
its rows are *erased* and left out. An erased add and its erased delete
carry the same (sample, key id, commitment) and contribute ``+x - x = 0``, so a ledger rebuilt
from scratch after an erasure ends at the digest of the retained set. A live ledger never meets a
destroyed key: the featurizer destroys a key only once this ledger's durable checkpoint floor is
past the delete (``streams/featurizer/erasure.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from unlearn.common.by_head import head_partition, routed_topic_name
from unlearn.common.key_ring import KeyRing, Locate
from unlearn.common.key_tail import KeyTail
from unlearn.infra.settings import Settings
from unlearn.schemas.delta_codec import Delta
from unlearn.schemas.sealed import Opened, SampleKey, is_sealed, open_delta

__all__ = [
    "RowOpener",
]

log = logging.getLogger("unlearn.ledger")

#: How long a live ledger waits for its key follower to show a key it has not read, before reading
#: the family itself: the key was acknowledged before its ciphertext was produced, so the follower
#: is normally a fetch behind at most (a few ms on Kafka, the 10 ms long-poll on tansu).
TAIL_WAIT_S = 0.1


class RowOpener:
    """Opens sealed deltas for one process (ledger worker or verifier).

    A key is looked for again only if the key family was not read to its end since the message
    was read: every key of a ciphertext was acknowledged before the ciphertext existed, so a
    refresh that started after the message was read sees the key unless it is destroyed.
    ``batch=True`` (the verifier, audits): every message was read before this opener was made,
    so one refresh of the whole family covers them all; otherwise (a live ledger) the message
    counts as read when :meth:`open` is called, and a key not known yet is looked for first in
    its head's key partition only: P = ``head_partition(head, partitions of the by-head topic)``
    from the same metadata listing, the partition whose featurizer sealed the head's rows. The
    whole family is read only when that cannot be told (no by-head topic, P not listed) or the
    key is not in P either (a destroyed key, or one written before the by-head partition count
    changed): a key is declared destroyed only after every partition was read to its end after
    the message was read (KeysUnavailable otherwise)."""

    def __init__(self, settings: Settings, ring: KeyRing | None = None, batch: bool = False,
                 role: str = "ledger", tail: KeyTail | None = None) -> None:
        self.settings = settings
        self.role = role
        self.ring = ring
        self.batch = batch
        self.tail = tail  # a live ledger's follower of the family (common/key_tail.py): looked in first
        self._tail_waited = float("-inf")  # the read time of the message the tail was last waited for
        self.erased = 0
        self.by_head = routed_topic_name(settings.topic("requests"))
        self._read_at = time.monotonic()  # when the message being opened was read (at the latest)
        self._refreshed_at = float("-inf")  # when the last complete refresh started
        self._head_read_at: dict[str, float] = {}  # head -> when the last read of its partition started

    def lookup(self, head_id: str, sample_id: str, key_id: str) -> SampleKey | None:
        """The key, reading the family as the class describes; None: destroyed."""
        if self.ring is None:
            self.ring = KeyRing(self.settings, role=self.role)
        ref = (head_id, sample_id, key_id)
        key = self.ring.get(ref)
        if key is None and self.tail is not None:
            # wait for the follower at most once per message: a key it never shows (destroyed,
            # or its generation incomplete) costs one wait, then the exact read below
            wait = TAIL_WAIT_S if self._tail_waited < self._read_at else 0.0
            self._tail_waited = self._read_at
            key = self.tail.get(ref, wait)
        if key is not None or self._refreshed_at >= self._read_at:
            return key
        if not self.batch and self._head_read_at.get(head_id, float("-inf")) < self._read_at:
            started = time.monotonic()
            if self.ring.refresh_partition(self.locate(head_id)) is not None:  # KeysUnavailable unless read
                self._head_read_at[head_id] = started
                key = self.ring.get(ref)
                if key is not None:
                    return key
        started = time.monotonic()
        self.ring.refresh()  # KeysUnavailable unless read to its end
        self._refreshed_at = started
        return self.ring.get(ref)

    def locate(self, head_id: str) -> Locate:
        """Where ``head_id``'s keys are, from a metadata listing (None: no usable by-head topic)."""
        def pick(topics: Mapping[str, Any]) -> int | None:
            md = topics.get(self.by_head)
            if md is None or md.error is not None or not md.partitions:
                return None
            return head_partition(head_id, len(md.partitions))
        return pick

    def open(self, delta: Delta) -> Opened:
        """``delta`` with its sealed rows opened (SealError: a row does not open or match its
        commitment); rows under destroyed keys are reported in ``erased``."""
        if not is_sealed(delta):
            return Opened(delta)
        if not self.batch:
            self._read_at = time.monotonic()
        opened = open_delta(delta, self.lookup)
        if opened.erased:
            self.erased += len(opened.erased)
            log.info("head %r: %d erased row(s) (key destroyed) left out", delta.head_id, len(opened.erased))
        return opened
