"""The exact integer ledger (:class:`ExactLedger`): S = sum q q^T and G = sum q y^T over the
retained multiset, kept as int64 limbs.

Why integers: float ledgers never return to zero after add-then-delete and their residue grows
with the stream; integers cancel bit for bit, so the ledger after any interleaving, order or
partitioning of adds and deletes equals the ledger built from scratch on what is retained
(docs/design.md section 2). The products are ``limb_products``'; the digest and blobs
``ledger_encoding``'s; the grid checks ``quantization``'s.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from unlearn.ledger import wide
from unlearn.ledger.errors import LedgerError, NonMemberDelete, OverflowBudgetError
from unlearn.ledger.ledger_encoding import LedgerParts, decode_ledger, encode_ledger, ledger_digest, shifted
from unlearn.ledger.limb_products import (
    MAX_COUNT,
    ROW_BLOCK,
    PendingProducts,
    accumulate_moments,
    held_diagonals,
    row_diagonals,
    split_rows,
)
from unlearn.ledger.quantization import check_rows, label_matrix
from unlearn.ledger.shared_limbs import SharedLimbs

__all__ = [
    "ExactLedger",
    "SufficientStatistics",
]


class SufficientStatistics(Protocol):
    """What a head solver needs: float64 S and G at real scale."""

    @property
    def dim(self) -> int: ...

    def gram(self) -> NDArray[np.float64]: ...

    def moments(self) -> NDArray[np.float64]: ...


@lru_cache(maxsize=8)
def _strict_lower(d: int) -> NDArray[np.bool_]:
    """Mask of the strict lower triangle: where ``_mirror_upper`` copies S^T into S."""
    return np.tri(d, d, -1, dtype=bool)


def _mirror_upper(M: NDArray[Any], block: int = 32) -> NDArray[Any]:
    """The symmetric matrix whose upper triangle is M's (in place; bits copied, not recomputed).
    Block columns at a time: about 3x faster at d = 768 than one masked copy of M.T (a reset
    mirrors S and H^-1)."""
    n = M.shape[0]
    for i0 in range(0, n, block):
        i1 = min(n, i0 + block)
        sq = M[i0:i1, i0:i1]
        np.copyto(sq, sq.T, where=_strict_lower(i1 - i0))
        M[i1:, i0:i1] = M[i0:i1, i1:].T
    return M


def _check_grid(dim: int, n_outputs: int, frac_bits: int, label_frac_bits: int) -> None:
    if int(dim) < 1:
        raise LedgerError(f"dim must be >= 1, got {dim}")
    if int(n_outputs) < 0:
        raise LedgerError(f"n_outputs must be >= 0, got {n_outputs}")
    if not 0 <= int(frac_bits) <= 30 or not 0 <= int(label_frac_bits) <= 30:
        raise LedgerError("frac_bits and label_frac_bits must be in 0..30")


def _check_budget(count: int) -> None:
    if count > MAX_COUNT:
        raise OverflowBudgetError(
            f"ledger would hold {count} samples; the exactness budget is < 2^32 per ledger "
            "(split the head into partition ledgers)")


def _refuse_non_member(held: int, gone: int, held_classes: NDArray[np.int64], gone_classes: NDArray[np.int64] | None,
                       diagonal_after: list[tuple[NDArray[np.int64], int]]) -> None:
    """NonMemberDelete when removing ``gone`` samples (per class: ``gone_classes``, None for
    target-matrix labels) from ``held`` would leave a negative count, a class index never seen, a
    negative class count, or a negative diagonal of S (its limbs after the removal, with shifts):
    a delete of something never added."""
    if held - gone < 0:
        raise NonMemberDelete(f"delete of {gone} samples from a ledger holding {held}")
    if gone_classes is None:
        pass
    elif gone_classes[held_classes.shape[0]:].any():
        raise NonMemberDelete("delete names a class index this head has never seen")
    else:
        n = min(held_classes.shape[0], gone_classes.shape[0])
        left = held_classes.copy()
        left[:n] -= gone_classes[:n]
        if (left < 0).any():
            j = int(np.argmax(left < 0))
            raise NonMemberDelete(f"delete of {int(gone_classes[j])} samples of class {j}; "
                                  f"the ledger holds {int(held_classes[j])}")
    after = wide.combine(diagonal_after)
    if wide.is_negative(after).any():
        i = int(np.argmax(wide.is_negative(after)))
        raise NonMemberDelete(f"delete would make S[{i},{i}] negative: those rows were never added")


class ExactLedger:
    """Exact sufficient statistics of a ridge head, in integers.

    ``dim``: feature dimension d. ``n_outputs``: c, grows when a larger class index or a wider
    target matrix is added (class-incremental heads); it never shrinks, so a from-scratch
    reference must be built with the same ``n_outputs``. ``frac_bits``: k of the feature grid;
    ``label_frac_bits``: k_y of the label grid (0 = class indices / integer targets).
    """

    def __init__(self, dim: int, n_outputs: int = 0, frac_bits: int = 30, label_frac_bits: int = 0) -> None:
        _check_grid(dim, n_outputs, frac_bits, label_frac_bits)
        self.dim = int(dim)
        self.frac_bits = int(frac_bits)
        self.label_frac_bits = int(label_frac_bits)
        d, c = self.dim, int(n_outputs)
        # S's limbs (stored upper-triangular) and G's: S_int = AA*2^30 + X*2^15 + BB, G_int likewise
        self._S = SharedLimbs.zeros(d)  # (AA, X, BB), shared with copies until written
        self._GAA, self._GX, self._GBB = (np.zeros((d, c), np.int64) for _ in range(3))
        self._class_counts = np.zeros(c, np.int64)
        self._count = 0
        self._mutations = 0  # bumped by every change: keys the cache of derived values
        self._cache: dict[str, tuple[int, Any]] = {}
        # Products of rows not yet folded into S's limbs (allocated by the first row update).
        self._pending: PendingProducts | None = None
        self.hold_rows = 0  # rows whose products may wait unmultiplied, read by the first row update (``products``)

    # ------------------------------------------------------------------ introspection
    @property
    def n_outputs(self) -> int:
        return self._GAA.shape[1]

    @property
    def count(self) -> int:
        """Number of retained samples."""
        return self._count

    @property
    def class_counts(self) -> NDArray[np.int64]:
        """Retained samples per class index (samples added with class-index labels only)."""
        return self._class_counts.copy()

    def __repr__(self) -> str:
        return (f"ExactLedger(dim={self.dim}, n_outputs={self.n_outputs}, count={self.count}, "
                f"frac_bits={self.frac_bits}, label_frac_bits={self.label_frac_bits})")

    def copy(self) -> ExactLedger:
        """An independent ledger of the same value; S's limbs (14 MB at d = 768) are shared until
        either ledger writes them (``SharedLimbs``), the rest is copied."""
        self.fold()
        other = ExactLedger.__new__(ExactLedger)
        other.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in self.__dict__.items()})
        other._S = self._S.share()
        other._cache = dict(self._cache)
        other._pending = None
        return other

    def _cached(self, name: str, compute: Any) -> Any:
        hit = self._cache.get(name)
        if hit is not None and hit[0] == self._mutations:
            return hit[1]
        value = compute()
        self._cache[name] = (self._mutations, value)
        return value

    # ------------------------------------------------------------------ updates
    def add(self, Q: ArrayLike, y: ArrayLike) -> None:
        """Add the rows Q (int64 (r, d)) with labels y; all or nothing."""
        self.apply_prepared(*self.prepare_rows(Q, y), +1)

    def delete(self, Q: ArrayLike, y: ArrayLike) -> None:
        """Remove the rows Q with labels y. Refused atomically (NonMemberDelete) when it would make
        the count, a class count or a diagonal of S negative -- a delete of something never added."""
        self.apply_prepared(*self.prepare_rows(Q, y), -1)

    def prepare_rows(self, Q: ArrayLike, y: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.int64],
                                                                NDArray[np.int64] | None]:
        """Validate an update once: (rows, integer label matrix, class indices or None).
        Callers that also need Y (the fast head) validate here and then ``apply_prepared``."""
        Qc = check_rows(Q, self.dim)
        Y, idx = label_matrix(y, Qc.shape[0], self.n_outputs, self.label_frac_bits)
        return Qc, Y, idx

    def apply_prepared(self, Qc: NDArray[np.int64], Y: NDArray[np.int64], idx: NDArray[np.int64] | None,
                       sign: int) -> None:
        """Apply rows that came out of ``prepare_rows``; all or nothing (NonMemberDelete etc.)."""
        if sign not in (1, -1):
            raise LedgerError("sign must be +1 or -1")
        r = Qc.shape[0]
        if r == 0:
            return
        # Validate everything before touching state (atomic: a refused update changes nothing).
        c_new = max(self.n_outputs, Y.shape[1])
        batch_counts = np.bincount(idx, minlength=c_new).astype(np.int64) if idx is not None else None
        _check_budget(self._count + sign * r)
        if sign < 0:
            held, gone = held_diagonals(self._S.limbs, self._pending), row_diagonals(Qc)
            _refuse_non_member(self._count, r, self._class_counts, batch_counts,
                               [(held[0] - gone[0], 30), (held[1] - gone[1], 15), (held[2] - gone[2], 0)])
        if c_new > self.n_outputs:
            self._grow_outputs(c_new)
        Yp = Y if Y.shape[1] == c_new else np.hstack([Y, np.zeros((r, c_new - Y.shape[1]), np.int64)])
        if self._pending is None:
            self._pending = PendingProducts(self.dim, self.hold_rows)
        pending = self._pending
        s0 = 0
        while s0 < r:
            if not pending.room:
                self._S.fold(pending)
            n = min(ROW_BLOCK, pending.room, r - s0)
            a, b, s = split_rows(Qc[s0:s0 + n])
            pending.accumulate(a, b, s, sign)
            accumulate_moments((self._GAA, self._GX, self._GBB), a, b, s, Yp[s0:s0 + n], sign)
            s0 += n
        if batch_counts is not None:
            self._class_counts += sign * batch_counts
        self._count += sign * r
        self._mutations += 1

    @property
    def products(self) -> PendingProducts | None:
        """The products of rows not folded into S yet (None before the first row update): a
        holder with idle time multiplies the waiting ones then (``multiply_some``, ``hold_rows``)."""
        return self._pending

    def fold(self) -> None:
        """Fold the pending float64 products into the int64 limbs. No change of value: every reader
        (digest, gram, blobs, absorb, copy) does it first; call it to pay that cost up front."""
        if self._pending is not None:
            self._S.fold(self._pending)

    @classmethod
    def from_rows(cls, Q: ArrayLike, y: ArrayLike, n_outputs: int = 0, frac_bits: int = 30,
                  label_frac_bits: int = 0) -> ExactLedger:
        """The ledger of exactly these rows (e.g. a packed batch for federated mode)."""
        led = cls(np.shape(Q)[-1] if np.ndim(Q) else 0, n_outputs, frac_bits, label_frac_bits)
        led.add(Q, y)
        return led

    def absorb(self, other: ExactLedger, sign: int = +1) -> None:
        """In place: self += sign * other (the packed-statistics path). Validated before mutation."""
        if sign not in (1, -1):
            raise LedgerError("sign must be +1 or -1")
        if not isinstance(other, ExactLedger):
            raise LedgerError(f"can only absorb an ExactLedger, got {type(other).__name__}")
        if (other.dim, other.frac_bits, other.label_frac_bits) != (self.dim, self.frac_bits, self.label_frac_bits):
            raise LedgerError("incompatible ledgers: (dim, frac_bits, label_frac_bits) "
                              f"{(other.dim, other.frac_bits, other.label_frac_bits)} "
                              f"vs {(self.dim, self.frac_bits, self.label_frac_bits)}")
        new_count = self._count + sign * other._count
        _check_budget(new_count)
        c_new = max(self.n_outputs, other.n_outputs)
        self.fold()
        other.fold()
        if sign < 0:
            after = [(np.diagonal(mine) - np.diagonal(theirs), shift) for mine, theirs, shift in
                     zip(self._S.limbs, other._S.limbs, (30, 15, 0), strict=True)]
            _refuse_non_member(self._count, other._count, self._class_counts, other._class_counts, after)
        # Validation passed: mutate.
        if c_new > self.n_outputs:
            self._grow_outputs(c_new)
        c_o = other.n_outputs
        op = np.add if sign > 0 else np.subtract
        self._S.combine(op, other._S.limbs)
        for mine, theirs in ((self._GAA, other._GAA), (self._GX, other._GX), (self._GBB, other._GBB)):
            op(mine[:, :c_o], theirs, out=mine[:, :c_o])
        op(self._class_counts[:c_o], other._class_counts, out=self._class_counts[:c_o])
        self._count = new_count
        self._mutations += 1

    def _grow_outputs(self, c_new: int) -> None:
        pad = c_new - self.n_outputs
        z = np.zeros((self.dim, pad), np.int64)
        self._GAA, self._GX, self._GBB = (np.hstack([M, z]) for M in (self._GAA, self._GX, self._GBB))
        self._class_counts = np.concatenate([self._class_counts, np.zeros(pad, np.int64)])
        self._mutations += 1

    def grow_outputs(self, n_outputs: int) -> None:
        """Widen the head to ``n_outputs`` (zero columns); shrinking is refused."""
        if n_outputs < self.n_outputs:
            raise LedgerError(f"cannot shrink outputs from {self.n_outputs} to {n_outputs}")
        if n_outputs > self.n_outputs:
            self._grow_outputs(n_outputs)

    def merge(self, other: ExactLedger) -> ExactLedger:
        """A new ledger of the disjoint union: ledgers of partitions sum exactly."""
        out = self.copy()
        out.absorb(other, +1)
        return out

    def __add__(self, other: ExactLedger) -> ExactLedger:
        return self.merge(other)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExactLedger):
            return NotImplemented
        return self.digest() == other.digest() and np.array_equal(self._class_counts, other._class_counts)

    __hash__ = None  # type: ignore[assignment]  # mutable

    # ------------------------------------------------------------------ exact values
    def gram_int(self) -> NDArray[np.object_]:
        """S_int as Python ints (d, d) -- for audits and tests on small d."""
        S = wide.to_pyints(wide.combine(shifted(self.parts().gram)))
        return _mirror_upper(np.array(S, dtype=object).reshape(self.dim, self.dim))

    def moments_int(self) -> NDArray[np.object_]:
        """G_int as Python ints (d, c)."""
        G = wide.to_pyints(wide.combine(shifted(self.parts().moments)))
        return np.array(G, dtype=object).reshape(self.dim, self.n_outputs)

    def gram(self) -> NDArray[np.float64]:
        """Float64 S at real scale, S_int * 2^-2k, by a fixed sequence of operations (deterministic).
        Returns a fresh array (cached per state, copied out)."""
        scale = 2.0 ** (-2 * self.frac_bits)
        return self._cached("gram", lambda: _mirror_upper(
            wide.upper_to_float64(shifted(self.parts().gram), scale))).copy()

    def moments(self) -> NDArray[np.float64]:
        """Float64 G at real scale, G_int * 2^-(k + k_y)."""
        scale = 2.0 ** (-(self.frac_bits + self.label_frac_bits))
        return self._cached("moments", lambda: wide.to_float64(wide.combine(shifted(self.parts().moments))) * scale
                            ).copy()

    def digest(self) -> str:
        """Hex SHA-256 of the canonical encoding of the exact integers (:func:`ledger_digest`):
        equal digests = equal ledgers, whoever computes them."""
        return self._cached("digest", lambda: ledger_digest(self.parts()))

    def parts(self) -> LedgerParts:
        """The grid, counts and limbs (pending products folded in; the arrays are the ledger's own)."""
        self.fold()
        return LedgerParts(self.dim, self.n_outputs, self.frac_bits, self.label_frac_bits, self._count,
                           self._class_counts, self._S.limbs, (self._GAA, self._GX, self._GBB))

    # ------------------------------------------------------------------ serialization
    def to_bytes(self) -> bytes:
        """Versioned, checksummed snapshot (:func:`encode_ledger`)."""
        return encode_ledger(self.parts())

    @classmethod
    def from_bytes(cls, blob: bytes) -> ExactLedger:
        """Inverse of to_bytes; rejects truncated, corrupted or unknown-version input with LedgerError."""
        p = decode_ledger(blob)
        led = cls(p.dim, p.n_outputs, p.frac_bits, p.label_frac_bits)
        led._class_counts = p.class_counts
        led._S = SharedLimbs(p.gram)
        led._GAA, led._GX, led._GBB = p.moments
        led._count = p.retained
        return led
