"""The papers' float ledgers: the same ridge protocol with S and G kept in float64 or float32.

This is the exact-federated-unlearning paper as published (and ACU's arithmetic): sufficient
statistics accumulated by float adds and subtracts, Variant A solving S + gamma I by Cholesky,
Variant B tracking T = H^-1 by SMW (paper eq. 7-10, Algorithm 2) with a fallback to Variant A
when a downdate's I - U T U^T is not positive definite (Lemma 1). *All* arithmetic (statistics,
aggregation, factorization, SMW) runs in the ledger's dtype, which is what the paper's fp32 vs
fp64 comparison (Table 4) varies. Rounding residue never cancels: that is what these strategies
exist to measure against the exact ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import scipy.linalg as sla
from numpy.typing import DTypeLike, NDArray

from unlearn.ledger import FloatLedger

from .base import Exactness, Family, Strategy
from .retrain import RidgeRetrain

SMW_BLOCK_ROWS = 512


def _one_hot(y: NDArray[np.int64], c: int, dtype: np.dtype) -> NDArray:
    Y = np.zeros((y.shape[0], c), dtype)
    Y[np.arange(y.shape[0]), y] = 1
    return Y


def _factor(F: NDArray, dtype: np.dtype) -> NDArray:
    """A U with U^T U = F^T F: the rows themselves, or R of a thin QR when r > d (Algorithm 2's
    client message; it is (d x d) instead of (r x d))."""
    X = F.astype(dtype, copy=False)
    if X.shape[0] > X.shape[1]:
        return np.asarray(np.linalg.qr(X, mode="r"), dtype=dtype)
    return X


class FloatRidge(Strategy):
    """Ridge head from a float ledger (dtype float64 or float32), Variant "A" or "B"."""

    family: ClassVar[Family] = "ridge"
    exactness: ClassVar[Exactness] = "exact arithmetic"
    proba_temperature: ClassVar[float] = 0.1
    dtype: ClassVar[DTypeLike] = np.float64
    variant: ClassVar[str] = "A"

    def __init__(self, gamma: float = 1.0, federated_fit: bool = True, reset_every: int | None = None) -> None:
        super().__init__()
        if not gamma > 0:
            raise ValueError(f"gamma must be > 0, got {gamma}")
        self.gamma = float(gamma)
        self.federated_fit = bool(federated_fit)
        self.reset_every = reset_every  # Variant B only: None = never (the paper's default)
        self.dt = np.dtype(self.dtype)
        self._W: NDArray | None = None
        self.fallbacks = 0  # Variant B downdates refused by the Lemma-1 check

    @property
    def weights(self) -> NDArray[np.float64]:
        if self._W is None:
            raise ValueError("not fitted")
        return self._W.astype(np.float64)

    # ------------------------------------------------------------------ Variant A
    def _solve_a(self) -> None:
        H = self.ledger.S.copy()
        H[np.diag_indices_from(H)] += self.gamma  # a Python float is "weak": H stays in dtype (NEP 50)
        L = sla.cholesky(H, lower=True, check_finite=False)
        self._W = sla.cho_solve((L, True), self.ledger.G, check_finite=False).astype(self.dt, copy=False)
        if self.variant == "B":
            T = sla.cho_solve((L, True), np.eye(H.shape[0], dtype=self.dt), check_finite=False)
            self.T = ((T + T.T) * 0.5).astype(self.dt, copy=False)
        self.updates_since_reset = 0

    # ------------------------------------------------------------------ Variant B
    def _smw(self, U: NDArray, dG: NDArray, sign: int) -> bool:
        """One SMW step in dtype (eq. 7-8 for sign=+1, eq. 9-10 for sign=-1). False = refused."""
        dt = self.dt
        K = self.T @ U.T
        M = np.eye(U.shape[0], dtype=dt) + sign * (U @ K)
        try:
            L = np.linalg.cholesky(M)
        except np.linalg.LinAlgError:
            return False  # Lemma 1: I - U T U^T not PD -> the downdate would be wrong
        Z = sla.solve_triangular(L, K.T, lower=True, check_finite=False).astype(dt, copy=False)
        self.T = (self.T - sign * (Z.T @ Z)).astype(dt, copy=False)
        TU = self.T @ U.T
        step = TU @ (U @ self._W) - self.T @ dG
        self._W = (self._W - sign * step).astype(dt, copy=False)
        return True

    def _apply_b(self, F: NDArray[np.float64], y: NDArray[np.int64], sign: int) -> None:
        assert self.n_classes is not None
        for s in range(0, F.shape[0], SMW_BLOCK_ROWS):
            Fb = F[s:s + SMW_BLOCK_ROWS].astype(self.dt)
            dG = Fb.T @ _one_hot(y[s:s + SMW_BLOCK_ROWS], self.n_classes, self.dt)
            if not self._smw(_factor(Fb, self.dt), dG, sign):
                self.fallbacks += 1
                self._solve_a()  # ledger already holds this request: Variant A from it
                return
        self.updates_since_reset += 1
        if self.reset_every is not None and self.updates_since_reset >= self.reset_every:
            self._solve_a()

    # ------------------------------------------------------------------ lifecycle
    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None:
        assert self.n_classes is not None
        d, c = F.shape[1], self.n_classes
        # Federated aggregation: each client's statistics in dtype, summed by the server in dtype.
        self.ledger = FloatLedger(d, c, self.dt)
        for k in np.unique(clients):
            m = clients == k
            part = FloatLedger(d, c, self.dt)
            part.add(F[m], y[m])
            self.ledger.S += part.S
            self.ledger.G += part.G
            self.ledger.count += part.count
        self.updates_since_reset = 0
        if self.variant == "B" and self.federated_fit and np.unique(clients).size > 1:
            # Algorithm 2: T0 = (gamma I)^-1, W0 = 0, one SMW add per client factor R_k.
            self.T = (np.eye(d, dtype=self.dt) / self.gamma).astype(self.dt, copy=False)
            self._W = np.zeros((d, c), self.dt)
            for k in np.unique(clients):
                m = clients == k
                Fk = F[m].astype(self.dt)
                if not self._smw(_factor(Fk, self.dt), Fk.T @ _one_hot(y[m], c, self.dt), +1):
                    raise AssertionError("an SMW add cannot be refused (I + U T U^T is SPD)")
        else:
            self._solve_a()

    def _add(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
             clients: NDArray[np.int64]) -> None:
        self.ledger.add(F, y)
        self._solve_a() if self.variant == "A" else self._apply_b(F, y, +1)

    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None:
        self.ledger.delete(F, y)
        self._solve_a() if self.variant == "A" else self._apply_b(F, y, -1)

    def retrain_counterpart(self) -> RidgeRetrain:
        return RidgeRetrain(self.gamma)

    def params(self) -> Mapping[str, Any]:
        p: dict[str, Any] = {"gamma": self.gamma, "dtype": self.dt.name, "variant": self.variant}
        if self.variant == "B":
            p["reset_every"] = self.reset_every
        return p


class Float64RidgeA(FloatRidge):
    name: ClassVar[str] = "float64-a"
    dtype: ClassVar[DTypeLike] = np.float64
    variant: ClassVar[str] = "A"


class Float64RidgeB(FloatRidge):
    name: ClassVar[str] = "float64-b"
    dtype: ClassVar[DTypeLike] = np.float64
    variant: ClassVar[str] = "B"


class Float32RidgeA(FloatRidge):
    name: ClassVar[str] = "float32-a"
    dtype: ClassVar[DTypeLike] = np.float32
    variant: ClassVar[str] = "A"


class Float32RidgeB(FloatRidge):
    name: ClassVar[str] = "float32-b"
    dtype: ClassVar[DTypeLike] = np.float32
    variant: ClassVar[str] = "B"
