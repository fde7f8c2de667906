"""Ours: the ridge head over the exact integer ledger, Variant A (Cholesky) and Variant B (SMW).

Features are quantized once (q = rint(f * 2^k)); the ledger sums exact integers, so after any
stream of adds and deletes it is bit-identical to the ledger built from scratch on the retained
set, and Variant A's head is bit-identical to the from-scratch head (same machine/BLAS).
Variant B tracks T = H^-1 by SMW rank-r updates and is restored to the canonical head by
periodic Cholesky resets from the ledger (``ledger.TrackedHead``).

Features handed to these strategies must satisfy the quantizer's bound (|f_i| <= 1, e.g.
L2-normalized): out-of-bound features are rejected, never clipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from unlearn.ledger import ExactLedger, Quantizer, TrackedHead, solve_head

from .base import ArrayHeadStrategy, Exactness, Family
from .retrain import RidgeRetrain

#: Variant B applies SMW updates in blocks of at most this many rows (an r x r system per block).
SMW_BLOCK_ROWS = 512


class ExactRidgeA(ArrayHeadStrategy):
    """Variant A: exact ledger + a fresh Cholesky solve after every request."""

    name: ClassVar[str] = "exact-a"
    family: ClassVar[Family] = "ridge"
    exactness: ClassVar[Exactness] = "bit-exact"
    proba_temperature: ClassVar[float] = 0.1

    def __init__(self, gamma: float = 1.0, frac_bits: int = 30) -> None:
        super().__init__()
        if not gamma > 0:
            raise ValueError(f"gamma must be > 0, got {gamma}")
        self.gamma = float(gamma)
        self.quantizer = Quantizer(frac_bits=frac_bits)

    def _client_ledgers(self, Q: NDArray[np.int64], y: NDArray[np.int64], clients: NDArray[np.int64]) -> ExactLedger:
        """Federated fit: every client builds its own ledger, the server sums them (exactly)."""
        assert self.n_classes is not None
        total = ExactLedger(Q.shape[1], self.n_classes, self.quantizer.frac_bits)
        for k in np.unique(clients):
            m = clients == k
            total.absorb(ExactLedger.from_rows(Q[m], y[m], self.n_classes, self.quantizer.frac_bits))
        return total

    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None:
        self.ledger = self._client_ledgers(self.quantizer.quantize(F), y, clients)
        self._W = solve_head(self.ledger, self.gamma)

    def _add(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
             clients: NDArray[np.int64]) -> None:
        self.ledger.add(self.quantizer.quantize(F), y)
        self._W = solve_head(self.ledger, self.gamma)

    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None:
        self.ledger.delete(self.quantizer.quantize(F), y)
        self._W = solve_head(self.ledger, self.gamma)

    def digest(self) -> str:
        """Hex SHA-256 of the exact ledger (equal digests = equal retained multisets' statistics)."""
        return self.ledger.digest()

    def retrain_counterpart(self) -> RidgeRetrain:
        return RidgeRetrain(self.gamma)

    def params(self) -> Mapping[str, Any]:
        return {"gamma": self.gamma, "frac_bits": self.quantizer.frac_bits}


class ExactRidgeB(ExactRidgeA):
    """Variant B: exact ledger + SMW-tracked head with Cholesky resets (``ledger.TrackedHead``).

    A federated fit follows the paper's Algorithm 2: the server starts from T = (gamma I)^-1 and
    applies one SMW add per client (in blocks of <= 512 rows). Reset policy defaults are
    ``TrackedHead``'s: every 1000 updates, on a refused downdate, or when the residual drift
    estimate (checked every 64 updates) exceeds 1e-9. The tracker is SMW, as in the paper (the
    product's default fast head is the Cholesky factor: docs/design.md, "Fast head").
    """

    name: ClassVar[str] = "exact-b"
    exactness: ClassVar[Exactness] = "bit-exact at resets"

    def __init__(self, gamma: float = 1.0, frac_bits: int = 30, reset_every: int = 1000,
                 drift_threshold: float = 1e-9, federated_fit: bool = True) -> None:
        super().__init__(gamma, frac_bits)
        self.reset_every = int(reset_every)
        self.drift_threshold = float(drift_threshold)
        self.federated_fit = bool(federated_fit)

    @property
    def weights(self) -> NDArray[np.float64]:
        return self.head.weights

    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None:
        assert self.n_classes is not None
        Q = self.quantizer.quantize(F)
        if self.federated_fit and np.unique(clients).size > 1:
            # Algorithm 2: SMW adds from the empty ledger, one client (block) at a time.
            led = ExactLedger(F.shape[1], self.n_classes, self.quantizer.frac_bits)
            self.head = TrackedHead(led, self.gamma, self.reset_every, self.drift_threshold, tracker="smw")
            for k in np.unique(clients):
                rows = np.flatnonzero(clients == k)
                for s in range(0, rows.size, SMW_BLOCK_ROWS):
                    b = rows[s:s + SMW_BLOCK_ROWS]
                    self.head.add(Q[b], y[b])
        else:
            led = ExactLedger.from_rows(Q, y, self.n_classes, self.quantizer.frac_bits)
            self.head = TrackedHead(led, self.gamma, self.reset_every, self.drift_threshold, tracker="smw")
        self.ledger = self.head.ledger

    def _apply(self, F: NDArray[np.float64], y: NDArray[np.int64], sign: int) -> None:
        Q = self.quantizer.quantize(F)
        for s in range(0, Q.shape[0], SMW_BLOCK_ROWS):
            (self.head.add if sign > 0 else self.head.delete)(Q[s:s + SMW_BLOCK_ROWS], y[s:s + SMW_BLOCK_ROWS])

    def _add(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
             clients: NDArray[np.int64]) -> None:
        self._apply(F, y, +1)

    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None:
        self._apply(F, y, -1)

    def reset(self) -> float:
        """Force a Cholesky reset; returns the drift of the fast head before it."""
        return self.head.reset("requested").drift

    @property
    def mode(self) -> str:
        """"exact" right after a reset (canonical head), "fast" between resets."""
        return self.head.mode

    def params(self) -> Mapping[str, Any]:
        return {**super().params(), "reset_every": self.reset_every, "drift_threshold": self.drift_threshold}
