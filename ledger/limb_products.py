"""The limb products of the exact ledger: S = AA*2^30 + X*2^15 + BB (and G likewise) from rows
split as q = a*2^15 + b, multiplied exactly through float64 BLAS (``dsyrk``) and folded into int64.

Why float64 BLAS: every partial sum of at most ``EXACT_ROWS`` rows stays an integer below 2^53, so
the products are exact whatever the BLAS's order, blocking or FMA use (docs/design.md section 2,
"Exact products through float64 BLAS"). The accumulators live *pending* in float64
(``PendingProducts``) and are folded into the int64 limbs only when a reader needs exact values or
the row budget is spent; updates of fewer than ``DEFER_ROWS`` rows wait and are multiplied
together. A holder that has idle time (the ledger worker) may let more rows wait (``hold``) and
multiply them a step at a time while idle (``multiply_some``): the products leave the path of
the next message. Every product is an exact integer whatever the grouping, so the limbs are the
same bits.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.linalg.blas import dsyr, dsyrk

#: Rows one float64 accumulator may hold: products sum below 2.25*2^50 (exact), limbs below 2^50.
EXACT_ROWS = 1 << 20
#: Rows split and multiplied per BLAS call: keeps the float halves of a chunk in cache.
ROW_BLOCK = 512
#: Updates of fewer rows are deferred, and the deferred rows multiplied once this many wait: one
#: rank-64 ``dsyrk`` at d = 768 costs about what 3-4 rank-1 updates do (each a pass over 3 x 4.7 MB).
DEFER_ROWS = 64

# x + 1.5*2^52 has the integer x in its low mantissa bits for |x| < 2^51: the float->int64
# conversion becomes one float add and one int subtract (SIMD), instead of a scalar cast.
_MAGIC = 1.5 * 2.0**52
_MAGIC_BITS = np.array(_MAGIC).view(np.int64)

#: S's int64 limbs (AA, X, BB).
Limbs = tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]


def split_rows(Q: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """The halves a, b and s = a + b of int64 rows, as float64 (exact small integers).

    a = floor((q + 2^14) / 2^15) is computed in float64: q + 2^14 is an integer below 2^31 and the
    scaling by 2^-15 is exact, so the floor equals the integer shift ``(q + 2^14) >> 15``.
    """
    b = Q.astype(np.float64)
    a = np.add(b, 16384.0)
    np.multiply(a, 2.0**-15, out=a)
    np.floor(a, out=a)
    s = np.multiply(a, 32768.0)
    np.subtract(b, s, out=b)
    np.add(a, b, out=s)
    return a, b, s


#: A chunk's float halves (a, b, s = a + b), as ``split_rows`` gives them.
_Split = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]


def _split_diagonals(a: NDArray[np.float64], b: NDArray[np.float64], s: NDArray[np.float64]) -> NDArray[np.int64]:
    """The diagonals of a^T a, b^T b and s^T s as int64 (3, d): each term is below 2.25*2^30, so
    the float sums are exact integers for up to 2^22 rows (any update fits: ``ROW_BLOCK``)."""
    return np.stack([exact_int(np.einsum("ij,ij->j", v, v)) for v in (a, b, s)])


def split_labels(Y: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The halves of an integer label matrix, as float64 (same split as the rows)."""
    a, b, _ = split_rows(Y)
    return a, b


def exact_int(M: NDArray[np.float64]) -> NDArray[np.int64]:
    """int64 of a float64 array holding integers below 2^51 in magnitude (exact, no scalar cast)."""
    v = np.add(M, _MAGIC).view(np.int64)
    v -= _MAGIC_BITS
    return v


def _fold_exact(target: NDArray[np.int64], P: NDArray[np.float64], out: NDArray[np.int64]) -> NDArray[np.int64]:
    """target + P into ``out`` (which may be ``target``) for P holding integers below 2^51; P is
    clobbered (used as the int buffer)."""
    P += _MAGIC
    v = P.view(np.int64)
    v -= _MAGIC_BITS
    return np.add(target, v, out=out)


def syrk_upper(alpha: float, M: NDArray[np.float64], C: NDArray[np.float64], accumulate: bool) -> None:
    """C[upper] = alpha * M^T M (+ C[upper] when ``accumulate``), in place; C's lower part untouched.

    ``M`` is C-ordered (r, d) and ``C`` a C-ordered (d, d) buffer: BLAS sees C^T (Fortran order) and
    fills its lower triangle, which is C's upper one -- no copy of either operand. One row takes the
    level-2 ``dsyr`` (no GEMM set-up: 1.4x-3x faster than ``dsyrk`` with k = 1 at d = 768-1536).
    """
    if accumulate and M.shape[0] == 1:
        out = dsyr(alpha, M[0], a=C.T, lower=1, overwrite_a=1)
    else:
        out = dsyrk(alpha, M.T, beta=1.0 if accumulate else 0.0, c=C.T, trans=0, lower=1, overwrite_c=1)
    if not np.may_share_memory(out, C):  # pragma: no cover - f2py copies only for a wrongly laid out C
        raise RuntimeError("dsyrk did not update the accumulator in place")


class PendingProducts:
    """float64 upper triangles of AA, BB and KK over the rows not yet folded into the int64 limbs.

    The strict lower triangles are never written (they stay zero), so a fold adds zeros there and the
    int64 limbs stay upper-triangular. ``rows`` counts the rows accumulated since the last fold (adds
    and deletes alike, multiplied or deferred: the bound is on sum |product|). While no row has been
    multiplied since the last fold the buffers hold stale values, and the next product overwrites
    them (BLAS beta = 0) instead of paying for a reset.
    """

    def __init__(self, dim: int, hold: int = DEFER_ROWS) -> None:
        self.AA = np.zeros((dim, dim))
        self.BB = np.zeros((dim, dim))
        self.KK = np.zeros((dim, dim))
        self.rows = 0
        self.hold = int(hold)  # rows that may wait unmultiplied, at least DEFER_ROWS (module docstring)
        self._multiplied = 0  # rows whose products are in AA, BB, KK since the last fold
        self._deferred: dict[int, list[_Split]] = {1: [], -1: []}
        self._n_deferred = 0
        self._deferred_diag = np.zeros((3, dim), np.int64)  # the deferred rows' (aa, bb, kk) diagonals

    @property
    def room(self) -> int:
        """Rows that can still be accumulated exactly before a fold."""
        return EXACT_ROWS - self.rows

    @property
    def deferred(self) -> int:
        """Rows waiting to be multiplied (small updates since the last flush)."""
        return self._n_deferred

    def accumulate(self, a: NDArray[np.float64], b: NDArray[np.float64], s: NDArray[np.float64], sign: int) -> None:
        """Add sign * (a^T a, b^T b, s^T s) for at most ``room`` rows: now (upper triangles, in place),
        or, for fewer than ``DEFER_ROWS`` rows or while at most ``hold`` rows wait, with later rows
        (the arrays are kept, not copied); once ``hold`` rows wait they are all multiplied."""
        r = a.shape[0]
        if r > self.room:
            raise ValueError(f"{r} rows exceed the exact budget ({self.room} left): fold first")
        self.rows += r
        hold = max(self.hold, DEFER_ROWS)
        if r < DEFER_ROWS or self._n_deferred + r < hold:
            self._deferred[sign].append((a, b, s))
            self._n_deferred += r
            self._deferred_diag += sign * _split_diagonals(a, b, s)
            if self._n_deferred >= hold:
                self.flush()
            return
        self._multiply(a, b, s, sign)

    def multiply_some(self, most: int) -> int:
        """Multiply about ``most`` of the waiting rows (whole updates, the last one cut), oldest
        first; returns how many. No change of value: the diagonals stay exact."""
        done = 0
        for sign, parts in self._deferred.items():
            while parts and done < most:
                a, b, s = parts[0]
                n = min(a.shape[0], most - done)
                if n < a.shape[0]:
                    parts[0] = (a[n:], b[n:], s[n:])
                    a, b, s = a[:n], b[:n], s[:n]
                else:
                    parts.pop(0)
                self._multiply(a, b, s, sign)
                self._deferred_diag -= sign * _split_diagonals(a, b, s)
                self._n_deferred -= n
                done += n
        return done

    def _multiply(self, a: NDArray[np.float64], b: NDArray[np.float64], s: NDArray[np.float64], sign: int) -> None:
        acc = self._multiplied > 0
        alpha = float(sign)
        syrk_upper(alpha, a, self.AA, acc)
        syrk_upper(alpha, b, self.BB, acc)
        syrk_upper(alpha, s, self.KK, acc)
        self._multiplied += a.shape[0]

    def flush(self) -> None:
        """Multiply the deferred rows: one ``dsyrk`` per limb and sign."""
        for sign, parts in self._deferred.items():
            if parts:
                a, b, s = (np.concatenate([p[i] for p in parts]) for i in range(3))
                self._multiply(a, b, s, sign)
                parts.clear()
        self._n_deferred = 0
        self._deferred_diag[:] = 0

    def diagonals(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """Pending diagonals of (AA, X, BB) as int64, deferred rows included (zeros when nothing is
        pending): O(d), the deferred rows' diagonals are summed as they arrive."""
        aa, bb, kk = self._deferred_diag.copy()
        if self._multiplied:
            aa += exact_int(np.diagonal(self.AA))
            bb += exact_int(np.diagonal(self.BB))
            kk += exact_int(np.diagonal(self.KK))
        return aa, kk - aa - bb, bb

    @property
    def empty(self) -> bool:
        """Nothing to fold: no row since the last fold."""
        return self.rows == 0

    def fold_into(self, limbs: Limbs, out: Limbs | None = None) -> None:
        """``out`` (``limbs`` when None) = the int64 limbs (AA, X, BB) plus the pending products,
        exactly; then the buffers are marked stale."""
        self.flush()
        if self._multiplied:
            self.KK -= self.AA  # X = KK - AA - BB: integers below 2^51 at every step, so exact
            self.KK -= self.BB
            for target, P, dest in zip(limbs, (self.AA, self.KK, self.BB), out or limbs, strict=True):
                _fold_exact(target, P, dest)
        elif out is not None:
            for target, dest in zip(limbs, out, strict=True):
                np.copyto(dest, target)
        self.rows = 0
        self._multiplied = 0


def held_diagonals(limbs: Limbs, pending: PendingProducts | None) -> Limbs:
    """Diagonals of S's limbs (AA, X, BB) with the pending products (and the rows waiting to be
    multiplied) included, without folding them: what a delete's non-member check reads."""
    held = (np.diagonal(limbs[0]), np.diagonal(limbs[1]), np.diagonal(limbs[2]))
    if pending is None:
        return held
    pend = pending.diagonals()
    return held[0] + pend[0], held[1] + pend[1], held[2] + pend[2]


def row_diagonals(Q: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Diagonals of the limbs (AA, X, BB) of these rows alone: what a delete takes off S's diagonal."""
    out = [np.zeros(Q.shape[1], np.int64) for _ in range(3)]
    for s0 in range(0, Q.shape[0], ROW_BLOCK):
        a, b, s = split_rows(Q[s0:s0 + ROW_BLOCK])
        aa, bb, kk = (np.einsum("ij,ij->j", v, v) for v in (a, b, s))
        out[0] += exact_int(aa)
        out[1] += exact_int(kk - aa - bb)
        out[2] += exact_int(bb)
    return out[0], out[1], out[2]


def accumulate_moments(G: tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]], a: NDArray[np.float64],
                       b: NDArray[np.float64], s: NDArray[np.float64], Y: NDArray[np.int64], sign: int) -> None:
    """G's limbs (GAA, GX, GBB) += sign * (a^T ya, a^T yb + b^T ya, b^T yb) for one chunk of split
    rows (<= ROW_BLOCK), in place. The same Karatsuba split as S: the cross limb is
    s^T (ya + yb) minus the other two; every product sums at most ROW_BLOCK terms below
    2.25*2^30, so the float64 GEMMs are exact."""
    used = Y.any(axis=0)
    k = int(np.count_nonzero(used))
    if k == 0:
        return  # every label zero: G gets exactly nothing
    if 2 * k <= used.shape[0]:  # one-hot rows of a wide label space (an auto-created head has 100
        cols = np.flatnonzero(used)  # columns): the columns no row names get exactly nothing
        sub = tuple(g[:, cols] for g in G)
        accumulate_moments(sub, a, b, s, Y[:, cols], sign)  # type: ignore[arg-type]
        for g, part in zip(G, sub, strict=True):
            g[:, cols] = part
        return
    GAA, GX, GBB = G
    ya, yb = split_labels(Y)
    op = np.add if sign > 0 else np.subtract
    gbb = b.T @ yb
    if ya.any():
        gaa = a.T @ ya
        gx = s.T @ (ya + yb)
        gx -= gaa
        gx -= gbb
        op(GAA, exact_int(gaa), out=GAA)
    else:  # labels below 2^14 (class indices on a grid k_y <= 13): GAA gets nothing, GX = a^T yb
        gx = a.T @ yb
    op(GX, exact_int(gx), out=GX)
    op(GBB, exact_int(gbb), out=GBB)


#: Retained-sample budget per ledger; beyond it int64 limbs could overflow.
MAX_COUNT = (1 << 32) - 1
