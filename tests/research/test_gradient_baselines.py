"""The baselines (research/strategies/gradient_baselines.py and the federated partitions): softmax
retrain, FedAvg, NegGrad and fine-tuning."""

from __future__ import annotations

import numpy as np
import pytest

from research.strategies import (
    CentralTrainer,
    FedAvgRetrain,
    FedAvgTrainer,
    Finetune,
    NegGrad,
    NoUnlearning,
    SoftmaxRetrain,
    client_weights,
    dirichlet_partition,
    iid_partition,
)
from research.strategies._softmax import ce_loss_grad
from tests.research.test_strategies import C, make_data


# ------------------------------------------------------------------------------ baselines
def test_softmax_retrain_equals_its_counterpart_and_the_central_optimum() -> None:
    F, y = make_data(5, n=100, d=5)
    s = SoftmaxRetrain(CentralTrainer(l2=1e-2)).fit(F, y, n_classes=C)
    s.delete(F[:10], y[:10], ids=np.arange(10))
    ref = s.retrain_counterpart().fit(F[10:], y[10:], ids=np.arange(10, 100), n_classes=C)
    np.testing.assert_allclose(s.weights, ref.weights, rtol=1e-12, atol=1e-12)
    _, g = ce_loss_grad(s.weights, F[10:], y[10:], 1e-2)
    assert np.linalg.norm(g) < 1e-7  # L-BFGS reached the optimum


def test_fedavg_is_deterministic_and_skips_emptied_clients() -> None:
    F, y = make_data(6, n=120, d=5)
    clients = dirichlet_partition(y, 4, 0.5, seed=3)
    tr = FedAvgTrainer(n_rounds=3, local_epochs=1, seed=7)
    a = FedAvgRetrain(tr).fit(F, y, clients=clients, n_classes=C)
    b = FedAvgRetrain(tr).fit(F, y, clients=clients, n_classes=C)
    assert np.array_equal(a.weights, b.weights)
    gone = np.flatnonzero(clients == 1)
    a.delete(F[gone], y[gone], ids=gone)
    keep = np.flatnonzero(clients != 1)
    ref = FedAvgRetrain(tr).fit(F[keep], y[keep], ids=keep, clients=clients[keep], n_classes=C)
    assert np.array_equal(a.weights, ref.weights)


def test_neggrad_ascends_and_finetune_descends() -> None:
    F, y = make_data(7, n=150, d=5)
    tr = CentralTrainer(l2=1e-2)
    W0 = tr.train(F, y, np.zeros(150, np.int64), C)
    gone = np.arange(20)
    ng = NegGrad(tr).fit(F, y, ids=np.arange(150), n_classes=C, init_weights=W0)
    ng.delete(F[gone], y[gone], ids=gone)
    assert ce_loss_grad(ng.weights, F[gone], y[gone])[0] > ce_loss_grad(W0, F[gone], y[gone])[0]
    ft = Finetune(tr, lr=0.5).fit(F, y, ids=np.arange(150), n_classes=C, init_weights=W0 * 0.5)
    ft.delete(F[gone], y[gone], ids=gone)
    assert len(ft.store) == 130
    assert ce_loss_grad(ft.weights, F[20:], y[20:], 1e-2)[0] < ce_loss_grad(W0 * 0.5, F[20:], y[20:], 1e-2)[0]
    nu = NoUnlearning(tr).fit(F, y, n_classes=C, init_weights=W0)
    nu.delete(F[gone], y[gone], ids=gone)
    assert np.array_equal(nu.weights, W0)


def test_partitions() -> None:
    y = np.repeat(np.arange(5), 40)
    a = dirichlet_partition(y, 10, 0.5, seed=1)
    assert np.array_equal(a, dirichlet_partition(y, 10, 0.5, seed=1))
    assert np.bincount(a, minlength=10).min() >= 1
    assert not np.array_equal(a, dirichlet_partition(y, 10, 0.5, seed=2))
    b = iid_partition(200, 7, seed=0)
    assert set(np.bincount(b).tolist()) <= {28, 29}
    np.testing.assert_allclose(client_weights(np.array([0, 0, 1, 2])), [0.5, 0.25, 0.25])
    with pytest.raises(ValueError):
        dirichlet_partition(y[:5], 10)
