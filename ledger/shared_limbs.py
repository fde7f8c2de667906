"""S's int64 limbs, shared by a ledger and its copies until one of them writes
(:class:`SharedLimbs`).

Why: the ledger worker snapshots a head for every checkpoint and every timed reset while its poll
thread goes on, and a copy of S's limbs (three d x d int64, 14 MB at d = 768) cost that thread
5-7 ms idle and 4-128 ms under a flow of adds (bench/results/pipeline_bench.md sections 28-29).
Shared, they are made read-only (a write in place would change every holder: it fails loudly
instead), and the next write of a holder goes into other arrays: the same memory traffic as the
write in place it replaces. Those arrays are the ones a holder of the same shape gave up at its
last such write, once nothing else refers to them any more (no copy, no view: CPython's reference
count says so), which saves the page faults of new arrays (~3 ms at d = 768); else new ones. One
such spare per shape and process, not per ledger: a spare per head would double every head's
memory (14 MB at d = 768, 100 MB at d = 2048).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from unlearn.ledger.limb_products import Limbs, PendingProducts

__all__ = ["SharedLimbs"]

#: ``sys.getrefcount`` of a spare limb only ``_writable`` refers to: the spare tuple, the loop
#: variable and the call's argument.
_ONLY_IN_SPARE = 3

#: Per shape, the limbs last given up by a write after a share (module docstring).
_SPARES: dict[tuple[int, ...], Limbs] = {}


class SharedLimbs:
    """S's limbs (AA, X, BB) of one ledger, possibly shared with its copies (module docstring)."""

    def __init__(self, limbs: Limbs) -> None:
        self.limbs = limbs
        self._shared = False  # another holder may have these arrays: write elsewhere

    @classmethod
    def zeros(cls, d: int) -> SharedLimbs:
        return cls((np.zeros((d, d), np.int64), np.zeros((d, d), np.int64), np.zeros((d, d), np.int64)))

    def share(self) -> SharedLimbs:
        """Another holder of the same arrays, for a copy of the ledger (no data copied)."""
        aa, x, bb = self.limbs
        for limb in self.limbs:
            limb.flags.writeable = False
        other = SharedLimbs((aa, x, bb))  # a tuple of its own: each holder counts in the references
        self._shared = other._shared = True
        return other

    def fold(self, pending: PendingProducts) -> None:
        """S += the pending products (``PendingProducts.fold_into``)."""
        if not (self._shared and pending.empty):  # nothing to write: keep sharing
            limbs, out = self._writable()
            pending.fold_into(limbs, None if out is limbs else out)

    def combine(self, op: Callable[..., NDArray[np.int64]], other: Limbs) -> None:
        """S = op(S, other) limb by limb (``np.add`` or ``np.subtract``: absorbing a ledger)."""
        limbs, out = self._writable()
        for mine, theirs, dest in zip(limbs, other, out, strict=True):
            op(mine, theirs, out=dest)

    def _writable(self) -> tuple[Limbs, Limbs]:
        """(S's limbs now, the arrays their next values go to, which hold S from now on): the same
        arrays unless shared (module docstring)."""
        limbs = self.limbs
        if not self._shared:
            return limbs, limbs
        spare = _SPARES.pop(limbs[0].shape, None)
        if spare is not None and all(sys.getrefcount(a) <= _ONLY_IN_SPARE for a in spare):
            for a in spare:
                a.flags.writeable = True
            out = spare
        else:
            out = (np.empty_like(limbs[0]), np.empty_like(limbs[1]), np.empty_like(limbs[2]))
        self.limbs, self._shared = out, False
        _SPARES[limbs[0].shape] = limbs
        return limbs, out
