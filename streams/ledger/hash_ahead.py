"""The retained rows' multiset hash of a head, its costly part computed beside the fold
(:class:`HashAhead`).

Why: hashing a row (SHAKE-128 of ~6 KiB at d = 768, ~35 µs) was a third of the ledger's fold of
an adds delta, and a delete that arrives during that fold waits for all of it (issue 29). The
rows' elements depend on nothing but the rows, so a helper thread sums them while the poll
thread applies the same rows to the exact ledger and the fast head (BLAS and OpenSSL both
release the GIL), and the sum is folded in, in log order, when the hash is next read: a receipt,
a head update, a snapshot. The value is the same as folding each entry at once; an entry the
ledger refuses is never folded (its sum is dropped). Small entries (a delete lane's few rows)
are hashed at once: a thread's hand-off costs more than it saves.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from numpy.typing import NDArray

from unlearn.ledger import MultisetHash
from unlearn.ledger.errors import LedgerError
from unlearn.schemas.delta_codec import Entry, RowsEntry
from unlearn.streams.ledger.delta_rules import fold_multiset

__all__ = [
    "AHEAD_MIN_ROWS",
    "HashAhead",
]

#: Rows from which an entry's hashing goes to the helper thread (~35 µs a row against ~0.1 ms for
#: the hand-off and the join).
AHEAD_MIN_ROWS = 16

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _hasher() -> ThreadPoolExecutor:
    """One helper thread per process, made on first use: the sums of every head queue on it."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="multiset-hash")
        return _pool


class HashAhead:
    """A head's multiset hash (None: unknown) with the sums of entries still being hashed.

    ``start(entry)`` before the ledger applies a rows entry, then ``applied(entry, started)`` once
    it took it (or ``dropped(started)`` when it refused it); ``value`` folds what is waiting."""

    def __init__(self, value: MultisetHash | None) -> None:
        self._value = value
        self._waiting: list[tuple[Future[NDArray[np.uint32]], int]] = []

    @property
    def value(self) -> MultisetHash | None:
        """The hash with every applied entry folded in (waits for the helper's sums)."""
        h, waiting, self._waiting = self._value, self._waiting, []
        for sums, sign in waiting:
            lanes = sums.result()
            if h is not None:
                h.step(lanes, sign)
        return h

    def start(self, entry: Entry) -> Future[NDArray[np.uint32]] | None:
        """Start hashing a large rows entry's rows on the helper thread; None: ``applied`` hashes
        it at once (small, not rows, hash unknown, or rows the hash refuses: it raises then, as
        it always did, after the ledger)."""
        if self._value is None or not isinstance(entry, RowsEntry) or entry.n < AHEAD_MIN_ROWS:
            return None
        try:
            rows = self._value.rows(entry.q, entry.labels)
        except LedgerError:
            return None
        return _hasher().submit(rows.lanes)

    def applied(self, entry: Entry, started: Future[NDArray[np.uint32]] | None) -> None:
        """The ledger took ``entry``: its rows join (add) or leave (delete) the hash."""
        if started is not None:
            self._waiting.append((started, entry.sign))
        else:
            self._value = fold_multiset(self.value, entry)

    @staticmethod
    def dropped(started: Future[NDArray[np.uint32]] | None) -> None:
        """The ledger refused the entry: its sum, if being computed, is never folded."""
        if started is not None:
            started.cancel()
