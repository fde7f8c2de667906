"""The one interface every unlearning strategy implements, and the retained-set store some need.

Why one interface: the point of this package is to run exact and approximate unlearning side by
side on the *same* add/delete stream of frozen features, and to compare each strategy with a
retrain of its own model family. So every strategy

- ``fit``s on an initial set (optionally partitioned over federated clients),
- applies ``add`` / ``delete`` batches identified by sample ids,
- exposes its head ``weights`` (d, c) and predictions,
- and names a ``retrain_counterpart``: the from-scratch retrain of the same model family (ridge
  with the same gamma and feature map, or softmax with the same training recipe), which the
  evaluation uses as the gold standard for parameter gaps, accuracy gaps, KL and speedups.

Strategies are pure compute: no files, no printing, no clocks (the experiment runner times them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

Family = Literal["ridge", "softmax"]
#: How close to a retrain a strategy is by construction (reported next to every metric).
Exactness = Literal["bit-exact", "bit-exact at resets", "exact arithmetic", "retrain", "approximate"]


class StrategyError(ValueError):
    """A request a strategy cannot serve (bad shapes, unknown ids, not fitted)."""


class UnsupportedOperation(StrategyError):
    """The method, as published, does not define this operation (e.g. adds for NegGrad)."""


def as_features(F: ArrayLike, dim: int | None = None) -> NDArray[np.float64]:
    """Validate a feature batch: finite float rows of the expected width, returned as float64."""
    X = np.asarray(F)
    if X.dtype.kind not in "fiu":
        raise StrategyError(f"features must be numeric, got dtype {X.dtype}")
    X = X.astype(np.float64, copy=False)
    if X.ndim == 1:
        X = X[None, :]
    if X.ndim != 2:
        raise StrategyError(f"features must be 2-d (r, d), got shape {X.shape}")
    if dim is not None and X.shape[1] != dim:
        raise StrategyError(f"features have {X.shape[1]} columns, the strategy was fitted on {dim}")
    if not np.isfinite(X).all():
        raise StrategyError("features contain NaN or Inf")
    return X


def as_labels(y: ArrayLike, r: int, n_classes: int | None = None) -> NDArray[np.int64]:
    """Validate class indices: int, shape (r,), in 0..n_classes-1."""
    arr = np.asarray(y)
    if arr.ndim == 0:
        arr = arr[None]
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise StrategyError(f"labels must be 1-d integer class indices, got dtype {arr.dtype} shape {arr.shape}")
    if arr.shape[0] != r:
        raise StrategyError(f"got {arr.shape[0]} labels for {r} feature rows")
    if r and arr.min() < 0:
        raise StrategyError("class indices must be >= 0")
    if n_classes is not None and r and arr.max() >= n_classes:
        raise StrategyError(f"class index {int(arr.max())} >= n_classes={n_classes}")
    return arr.astype(np.int64)


def as_ids(ids: ArrayLike | None, r: int) -> NDArray[np.int64]:
    """Validate sample ids: int64, shape (r,), unique within the batch."""
    if ids is None:
        raise StrategyError("ids are required to add or delete samples")
    arr = np.atleast_1d(np.asarray(ids))
    if arr.dtype.kind not in "iu" or arr.ndim != 1 or arr.shape[0] != r:
        raise StrategyError(f"ids must be {r} integers, got dtype {arr.dtype} shape {arr.shape}")
    arr = arr.astype(np.int64)
    if np.unique(arr).shape[0] != r:
        raise StrategyError("ids within one batch must be unique")
    return arr


def as_clients(clients: ArrayLike | None, r: int) -> NDArray[np.int64]:
    """Client index of every row (all zeros = one client when not federated)."""
    if clients is None:
        return np.zeros(r, np.int64)
    arr = np.atleast_1d(np.asarray(clients))
    if arr.dtype.kind not in "iu" or arr.ndim != 1 or arr.shape[0] != r:
        raise StrategyError(f"clients must be {r} integers, got dtype {arr.dtype} shape {arr.shape}")
    if r and arr.min() < 0:
        raise StrategyError("client indices must be >= 0")
    return arr.astype(np.int64)


def softmax(Z: NDArray[np.float64]) -> NDArray[np.float64]:
    """Row-wise softmax, stable for large logits."""
    Z = np.asarray(Z, dtype=np.float64)
    Z = Z - Z.max(axis=1, keepdims=True)
    E = np.exp(Z)
    return E / E.sum(axis=1, keepdims=True)


class RetainedSet:
    """The retained samples a data-dependent strategy keeps (retrain, fine-tune, HF-KCU's clients).

    Rows are kept in insertion order; a delete removes rows by id and refuses ids it does not
    hold (a delete of something never added must fail loudly, never be a silent no-op).
    """

    def __init__(self, dim: int) -> None:
        self.dim = int(dim)
        self._F: list[NDArray[np.float64]] = []
        self._y: list[NDArray[np.int64]] = []
        self._ids: list[NDArray[np.int64]] = []
        self._clients: list[NDArray[np.int64]] = []
        self._cache: tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]] | None = None
        self._members: set[int] = set()

    def __len__(self) -> int:
        return len(self._members)

    def add(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
            clients: NDArray[np.int64]) -> None:
        dup = self._members.intersection(ids.tolist())
        if dup:
            raise StrategyError(f"ids already retained: {sorted(dup)[:5]}")
        self._F.append(F)
        self._y.append(y)
        self._ids.append(ids)
        self._clients.append(clients)
        self._members.update(ids.tolist())
        self._cache = None

    def _arrays(self) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        if self._cache is None:
            if self._F:
                self._cache = (np.concatenate(self._F), np.concatenate(self._y), np.concatenate(self._ids),
                               np.concatenate(self._clients))
            else:
                self._cache = (np.zeros((0, self.dim)), np.zeros(0, np.int64), np.zeros(0, np.int64),
                               np.zeros(0, np.int64))
            self._set(self._cache)
        return self._cache

    def _set(self, arrays: tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]) -> None:
        self._cache = arrays
        self._F, self._y, self._ids, self._clients = [arrays[0]], [arrays[1]], [arrays[2]], [arrays[3]]

    def remove(self, ids: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
        """Remove rows by id; returns their (F, y, clients). Unknown ids raise, nothing changes."""
        missing = set(ids.tolist()) - self._members
        if missing:
            raise StrategyError(f"delete of ids that are not retained: {sorted(missing)[:5]}")
        F, y, all_ids, cl = self._arrays()
        gone = np.isin(all_ids, ids)
        out = (F[gone], y[gone], cl[gone])
        keep = ~gone
        self._set((F[keep], y[keep], all_ids[keep], cl[keep]))
        self._members.difference_update(ids.tolist())
        return out

    @property
    def F(self) -> NDArray[np.float64]:
        return self._arrays()[0]

    @property
    def y(self) -> NDArray[np.int64]:
        return self._arrays()[1]

    @property
    def ids(self) -> NDArray[np.int64]:
        return self._arrays()[2]

    @property
    def clients(self) -> NDArray[np.int64]:
        return self._arrays()[3]


class Strategy(ABC):
    """Common interface: fit on an initial set, then add/delete batches; expose head and predictions.

    Class attributes describe the method so reports can say what a number means:
    ``family`` (which retrain it is compared with), ``exactness``, ``supports_add`` (the published
    method defines additions), ``uses_retained_data`` (touches retained samples when unlearning,
    which the continual-unlearning papers count as a privacy cost), ``federated`` (uses clients).
    """

    name: ClassVar[str] = "strategy"
    family: ClassVar[Family] = "ridge"
    exactness: ClassVar[Exactness] = "approximate"
    supports_add: ClassVar[bool] = True
    uses_retained_data: ClassVar[bool] = False
    federated: ClassVar[bool] = False

    def __init__(self) -> None:
        self.dim: int | None = None
        self.n_classes: int | None = None

    # ------------------------------------------------------------------ lifecycle
    def fit(self, F: ArrayLike, y: ArrayLike, *, ids: ArrayLike | None = None, clients: ArrayLike | None = None,
            n_classes: int | None = None, init_weights: NDArray[np.float64] | None = None) -> Strategy:
        """Train on the initial set. ``clients`` (row -> client index) is used by federated strategies;
        ``init_weights`` lets softmax strategies start from an already-trained base model (so every
        approximate method unlearns from the *same* model, as the seeds' protocols require)."""
        X = as_features(F)
        lab = as_labels(y, X.shape[0])
        c = int(n_classes) if n_classes is not None else (int(lab.max()) + 1 if lab.size else 0)
        if c < 1:
            raise StrategyError("need at least one class")
        lab = as_labels(lab, X.shape[0], c)
        row_ids = np.arange(X.shape[0], dtype=np.int64) if ids is None else as_ids(ids, X.shape[0])
        cl = as_clients(clients, X.shape[0])
        self.dim, self.n_classes = X.shape[1], c
        self._fit(X, lab, row_ids, cl, init_weights)
        return self

    def add(self, F: ArrayLike, y: ArrayLike, *, ids: ArrayLike, clients: ArrayLike | None = None) -> None:
        """Learn a batch of new samples."""
        if not self.supports_add:
            raise UnsupportedOperation(f"{self.name} does not define additions (delete-only method)")
        X, lab, row_ids, cl = self._check_batch(F, y, ids, clients)
        if X.shape[0]:
            self._add(X, lab, row_ids, cl)

    def delete(self, F: ArrayLike, y: ArrayLike, *, ids: ArrayLike, clients: ArrayLike | None = None) -> None:
        """Unlearn a batch of retained samples (their features, labels, ids and clients)."""
        X, lab, row_ids, cl = self._check_batch(F, y, ids, clients)
        if X.shape[0]:
            self._delete(X, lab, row_ids, cl)

    def _check_batch(self, F: ArrayLike, y: ArrayLike, ids: ArrayLike, clients: ArrayLike | None
                     ) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        if self.dim is None:
            raise StrategyError(f"{self.name}: call fit() first")
        X = as_features(F, self.dim)
        return X, as_labels(y, X.shape[0], self.n_classes), as_ids(ids, X.shape[0]), as_clients(clients, X.shape[0])

    # ------------------------------------------------------------------ model
    @property
    @abstractmethod
    def weights(self) -> NDArray[np.float64]:
        """The current head W (d', c) in float64 (d' = d, or the expanded width for a feature map)."""

    def transform(self, F: NDArray[np.float64]) -> NDArray[np.float64]:
        """The features the head is applied to (identity unless the strategy has a feature map)."""
        return F

    def decision_function(self, F: ArrayLike) -> NDArray[np.float64]:
        """Scores (ridge outputs or softmax logits), shape (n, c)."""
        if self.dim is None:
            raise StrategyError(f"{self.name}: call fit() first")
        return self.transform(as_features(F, self.dim)) @ self.weights

    def predict(self, F: ArrayLike) -> NDArray[np.int64]:
        return np.argmax(self.decision_function(F), axis=1).astype(np.int64)

    #: Ridge scores are not probabilities; metrics that need a distribution (KL, MIA features) use
    #: softmax(scores / temperature). 0.1 maps the one-hot regression scale (~0..1) to a peaked
    #: distribution; softmax heads use temperature 1 (their own probabilities).
    proba_temperature: ClassVar[float] = 1.0

    def predict_proba(self, F: ArrayLike) -> NDArray[np.float64]:
        return softmax(self.decision_function(F) / self.proba_temperature)

    def retrain_counterpart(self) -> Strategy:
        """An unfitted strategy that retrains from scratch in this strategy's model family."""
        raise NotImplementedError

    def params(self) -> Mapping[str, Any]:
        """Hyperparameters, for reports (JSON-serializable values)."""
        return {}

    def reference_key(self) -> str:
        """Strategies whose counterparts share this key have identical retrain references."""
        cp = self.retrain_counterpart()
        return f"{cp.family}:{sorted(cp.params().items())!r}"

    # ------------------------------------------------------------------ implementation hooks
    @abstractmethod
    def _fit(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64], clients: NDArray[np.int64],
             init_weights: NDArray[np.float64] | None) -> None: ...

    def _add(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
             clients: NDArray[np.int64]) -> None:
        raise UnsupportedOperation(f"{self.name} does not define additions")

    @abstractmethod
    def _delete(self, F: NDArray[np.float64], y: NDArray[np.int64], ids: NDArray[np.int64],
                clients: NDArray[np.int64]) -> None: ...

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({ps})"


class ArrayHeadStrategy(Strategy):
    """A strategy whose head is the array ``_W`` that ``_fit`` sets (``weights`` raises until then)."""

    def __init__(self) -> None:
        super().__init__()
        self._W: NDArray[np.float64] | None = None

    @property
    def weights(self) -> NDArray[np.float64]:
        if self._W is None:
            raise ValueError("not fitted")
        return self._W
