"""Client partitions for the federated protocols (non-IID Dirichlet, as HF-KCU and the ridge paper)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def dirichlet_partition(y: ArrayLike, n_clients: int, alpha: float = 0.5, seed: int = 0,
                        min_size: int = 1, max_tries: int = 1000) -> NDArray[np.int64]:
    """Client index per sample: for every class, split its samples over clients in proportions
    drawn from Dirichlet(alpha * 1_K). Redrawn until every client holds >= ``min_size`` samples
    (the usual practice), so no client is empty. Deterministic for a seed."""
    labels = np.asarray(y, dtype=np.int64)
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if labels.shape[0] < n_clients * min_size:
        raise ValueError(f"{labels.shape[0]} samples cannot give {n_clients} clients >= {min_size} samples each")
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        out = np.empty(labels.shape[0], np.int64)
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(n_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * idx.size).astype(np.int64)
            for k, part in enumerate(np.split(idx, cuts)):
                out[part] = k
        if np.bincount(out, minlength=n_clients).min() >= min_size:
            return out
    raise ValueError(f"no Dirichlet(alpha={alpha}) partition with >= {min_size} samples per client "
                     f"in {max_tries} draws; lower n_clients or min_size")


def iid_partition(n: int, n_clients: int, seed: int = 0) -> NDArray[np.int64]:
    """Client index per sample, uniformly at random with equal sizes (+-1)."""
    if n_clients < 1 or n < n_clients:
        raise ValueError(f"cannot split {n} samples over {n_clients} clients")
    out = np.arange(n, dtype=np.int64) % n_clients
    return np.random.default_rng(seed).permutation(out)


def client_weights(clients: ArrayLike, n_clients: int | None = None) -> NDArray[np.float64]:
    """FedAvg aggregation weights w_i = |D_i| / sum_j |D_j| (HF-KCU eq. 1)."""
    cl = np.asarray(clients, dtype=np.int64)
    counts = np.bincount(cl, minlength=n_clients or 0).astype(np.float64)
    total = counts.sum()
    return counts / total if total > 0 else counts
