"""Opening sealed ``deltas`` rows before the ledger applies them (docs/erasure.md).

A thin transform in front of ``HeadRuntime.apply``: a SEALED entry becomes the ROWS entry it
sealed (``schemas.sealed_delta.open_delta``) with the keys of the ``subject-keys`` family
(``infra.key_family.KeyRing``). A key not known yet makes the ring read the family to its current
end once (the featurizer acknowledged every key before producing a row under it); a key still
unknown then is destroyed: its rows are *erased* and left out. An erased add and its erased delete
carry the same (sample, key id, commitment) and contribute ``+x - x = 0``, so a ledger rebuilt
from scratch after an erasure ends at the digest of the retained set. A live ledger never meets a
destroyed key: the featurizer destroys a key only once this ledger's durable checkpoint floor is
past the delete (``streams/featurizer/shredder.py``).
"""

from __future__ import annotations

import logging
import time

from unlearn.infra.key_family import KeyRing
from unlearn.infra.settings import Settings
from unlearn.schemas.delta_codec import Delta
from unlearn.schemas.sealed import SampleKey
from unlearn.schemas.sealed_delta import Opened, is_sealed, open_delta

__all__ = ["RowOpener"]

log = logging.getLogger("unlearn.ledger")


class RowOpener:
    """Opens sealed deltas for one process (ledger worker or verifier).

    A key is looked for again only if the key family was not read to its end since the message
    was read: every key of a ciphertext was acknowledged before the ciphertext existed, so a
    refresh that started after the message was read sees the key unless it is destroyed.
    ``batch=True`` (the verifier, audits): every message was read before this opener was made,
    so one refresh covers them all; otherwise (a live ledger) the message counts as read when
    :meth:`open` is called."""

    def __init__(self, settings: Settings, ring: KeyRing | None = None, batch: bool = False,
                 role: str = "ledger") -> None:
        self.settings = settings
        self.role = role
        self.ring = ring
        self.batch = batch
        self.erased = 0
        self._read_at = time.monotonic()  # when the message being opened was read (at the latest)
        self._refreshed_at = float("-inf")  # when the last complete refresh started

    def lookup(self, head_id: str, sample_id: str, key_id: str) -> SampleKey | None:
        if self.ring is None:
            self.ring = KeyRing(self.settings, role=self.role)
        ref = (head_id, sample_id, key_id)
        key = self.ring.get(ref)
        if key is None and self._refreshed_at < self._read_at:
            started = time.monotonic()
            self.ring.refresh()  # KeysUnavailable unless read to its end
            self._refreshed_at = started
            key = self.ring.get(ref)
        return key

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
