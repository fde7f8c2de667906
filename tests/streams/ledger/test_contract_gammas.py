"""``ContractGammas`` (streams/ledger/contract_gammas.py): a new head's gamma in the ledger is its
contract's (docs/registry.md), not the worker's settings: declared before or after the worker
started; an undeclared head falls back to the settings. Real broker, real ledger worker process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.streams.ledger.support import Stream, produce, worker_settings
from unlearn.common.registry import publish_contract
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.ledger import solve_head
from unlearn.schemas.head_contract import HeadContract
from unlearn.services.client.head_reader import wait_for_head

pytestmark = pytest.mark.broker


def contract(head: str, gamma: float, d: int) -> HeadContract:
    return HeadContract(head_id=head, version=1, dimension=d, backbone="features", input_kind="features",
                        normalization="l2", feature_bound=1.0, frac_bits=30, label_frac_bits=0, label_kind="class",
                        gamma=gamma, n_classes=4)


def test_new_heads_take_gamma_from_their_contract(settings: Settings, tmp_path: Path) -> None:
    s = worker_settings(settings, tmp_path).with_(gamma=1.0, head_gammas="declared=3.0")
    d = 6
    publish_contract(s, contract("declared", 0.25, d))
    stream = Stream(["declared", "late", "undeclared"], d=d, seed=3)
    ledger = ServiceProcess("ledger", ["ledger"], s, tmp_path / "logs").start()
    try:
        publish_contract(s, contract("late", 4.0, d))  # declared after the worker started
        produce(s, [stream.next_message() for _ in range(12)])
        for head, gamma in (("declared", 0.25), ("late", 4.0), ("undeclared", 1.0)):
            want = stream.n_msgs[head]
            got = wait_for_head(s, head, lambda u, want=want: u.version >= want and u.mode == "exact", timeout=90)
            assert got.gamma == gamma, head
            ref = stream.reference(head)
            ref.grow_outputs(got.weights.shape[1])
            assert np.array_equal(np.asarray(got.weights), solve_head(ref, gamma)), head
    finally:
        ledger.stop()
