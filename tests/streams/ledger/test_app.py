"""The faust ledger processor against a real broker: exactness end to end, kill -9 recovery,
and two workers sharing heads through a rebalance."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer

from unlearn.infra.processes import ServiceProcess
from unlearn.infra.profiles import producer_config
from unlearn.infra.settings import Settings
from unlearn.ledger import ExactLedger, Quantizer, l2_normalize, solve_head
from unlearn.schemas.delta_codec import Delta, RowsEntry, encode_delta
from unlearn.services.client.head_reader import read_heads, wait_for_head

pytestmark = pytest.mark.broker


class Stream:
    """A random add/delete stream over several heads, with its from-scratch reference."""

    def __init__(self, heads: list[str], d: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.d = d
        self.heads = heads
        self.retained: dict[str, dict[str, tuple[np.ndarray, int]]] = {h: {} for h in heads}
        self.messages: list[tuple[str, bytes]] = []
        self.n_msgs = {h: 0 for h in heads}
        self.counter = 0

    def next_message(self) -> tuple[str, bytes]:
        h = self.heads[int(self.rng.integers(len(self.heads)))]
        members = self.retained[h]
        entries = []
        if members and self.rng.random() < 0.35:
            ids = list(self.rng.choice(sorted(members), size=min(len(members), int(self.rng.integers(1, 4))), replace=False))
            Q = np.stack([members[i][0] for i in ids])
            y = np.array([members[i][1] for i in ids])
            entries.append(RowsEntry(-1, [f"del-{i}" for i in ids], ids, ["u"] * len(ids), y, Q))
            for i in ids:
                del members[i]
        n = int(self.rng.integers(1, 6))
        Q = Quantizer().quantize(l2_normalize(self.rng.normal(size=(n, self.d))))
        y = self.rng.integers(0, 4, n)
        ids = [f"s{self.counter + j}" for j in range(n)]
        self.counter += n
        entries.insert(0, RowsEntry(+1, [f"add-{i}" for i in ids], ids, ["u"] * n, y, Q))
        for i, q, lab in zip(ids, Q, y):
            members[i] = (q, int(lab))
        self.n_msgs[h] += 1
        msg = (h, encode_delta(Delta(h, "test", self.d, 30, 0, tuple(entries))))
        self.messages.append(msg)
        return msg

    def reference(self, h: str) -> ExactLedger:
        led = ExactLedger(self.d, 0)
        m = self.retained[h]
        if m:
            led.add(np.stack([q for q, _ in m.values()]), np.array([lab for _, lab in m.values()]))
        return led


def produce(settings: Settings, msgs: list[tuple[str, bytes]]) -> None:
    p = Producer(producer_config(settings))
    for h, raw in msgs:
        p.produce(settings.topic("deltas"), key=h.encode(), value=raw)
    assert p.flush(30) == 0


def worker_settings(settings: Settings, tmp_path: Path) -> Settings:
    return settings.with_(data_dir=str(tmp_path / "data"), checkpoint_every_messages=7,
                          checkpoint_every_seconds=1.0, reset_every_seconds=1.0, reset_every_events=50)


def assert_final_heads_exact(s: Settings, stream: Stream, timeout: float = 90.0) -> None:
    for h in stream.heads:
        ref = stream.reference(h)
        want = stream.n_msgs[h]
        got = wait_for_head(s, h, lambda u: u.version >= want and u.mode == "exact", timeout=timeout)
        assert got.version == want, f"{h}: every delta applied exactly once"
        assert got.digest == ref.digest(), f"{h}: ledger digest equals the from-scratch ledger"
        assert got.n_retained == ref.count
        ref.grow_outputs(got.weights.shape[1])
        assert np.array_equal(np.asarray(got.weights), solve_head(ref, s.gamma)), f"{h}: canonical head bit for bit"


def test_end_to_end_several_heads_bit_exact(settings: Settings, tmp_path: Path) -> None:
    s = worker_settings(settings, tmp_path)
    stream = Stream(["alpha", "beta", "gamma"], d=12, seed=1)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0", "--loglevel", "info"], s, tmp_path).start()
    try:
        produce(s, [stream.next_message() for _ in range(120)])
        assert_final_heads_exact(s, stream)
    finally:
        worker.stop()
    assert worker.proc is not None and worker.proc.returncode == 0, worker.log_tail()


def test_kill_minus_nine_at_random_points_then_recover(settings: Settings, tmp_path: Path) -> None:
    s = worker_settings(settings, tmp_path)
    stream = Stream(["h1", "h2"], d=10, seed=2)
    rng = np.random.default_rng(3)
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0", "--loglevel", "info"], s, tmp_path).start()
    try:
        for round_ in range(4):
            produce(s, [stream.next_message() for _ in range(int(rng.integers(40, 90)))])
            time.sleep(float(rng.uniform(1.0, 6.0)))  # somewhere mid-processing / mid-checkpoint
            worker.kill9()
            worker.start()
        produce(s, [stream.next_message() for _ in range(30)])
        assert_final_heads_exact(s, stream, timeout=120)
    finally:
        worker.stop()
    assert worker.starts == 5


def test_two_workers_share_heads_through_a_rebalance(settings: Settings, tmp_path: Path) -> None:
    s = worker_settings(settings, tmp_path)
    stream = Stream([f"head{i}" for i in range(6)], d=8, seed=4)
    a = ServiceProcess("ledger-a", ["ledger", "--worker-id", "a", "--loglevel", "info"], s, tmp_path).start()
    b = ServiceProcess("ledger-b", ["ledger", "--worker-id", "b", "--loglevel", "info"], s, tmp_path)
    try:
        produce(s, [stream.next_message() for _ in range(80)])
        time.sleep(2.0)
        b.start()  # rebalance mid-stream: some partitions move to b
        produce(s, [stream.next_message() for _ in range(80)])
        time.sleep(4.0)
        a.stop()  # and back: b takes everything
        produce(s, [stream.next_message() for _ in range(40)])
        assert_final_heads_exact(s, stream, timeout=120)
        published = read_heads(s)
        assert set(published) == set(stream.heads)
    finally:
        a.stop()
        b.stop()
