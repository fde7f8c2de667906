"""What the ledger's broker tests share: a random add/delete stream over several heads with its
from-scratch reference, producing it, worker settings with short periods, and the check that
every head ends exact."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Producer

from unlearn.infra.settings import HeadSettings, Settings
from unlearn.ledger import ExactLedger, MultisetHash, Quantizer, l2_normalize, solve_head
from unlearn.runtime.clients import producer_config
from unlearn.schemas.delta_codec import Delta, RowsEntry, encode_delta
from unlearn.services.client.head_reader import wait_for_head

__all__ = ["Stream", "assert_final_heads_exact", "produce", "run_in_thread", "worker_settings"]


class Stream:
    """A random add/delete stream over several heads, with its from-scratch reference."""

    def __init__(self, heads: list[str], d: int, seed: int, delete_p: float = 0.35) -> None:
        self.rng = np.random.default_rng(seed)
        self.delete_p = delete_p
        self.d = d
        self.heads = heads
        self.retained: dict[str, dict[str, tuple[np.ndarray, int]]] = {h: {} for h in heads}
        self.messages: list[tuple[str, bytes]] = []
        self.n_msgs = {h: 0 for h in heads}
        self.counter = 0

    def next_message(self, head: str | None = None, adds: int | None = None) -> tuple[str, bytes]:
        """The next message of ``head`` (a random head when None), with ``adds`` rows added (1-5
        at random when None)."""
        h = self.heads[int(self.rng.integers(len(self.heads)))] if head is None else head
        members = self.retained[h]
        entries = []
        if members and self.rng.random() < self.delete_p:
            size = min(len(members), int(self.rng.integers(1, 4)))
            ids = list(self.rng.choice(sorted(members), size=size, replace=False))
            Q = np.stack([members[i][0] for i in ids])
            y = np.array([members[i][1] for i in ids])
            entries.append(RowsEntry(-1, [f"del-{i}" for i in ids], ids, ["u"] * len(ids), y, Q))
            for i in ids:
                del members[i]
        n = int(self.rng.integers(1, 6)) if adds is None else adds
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

    def delete_message(self, h: str, k: int) -> tuple[str, bytes]:
        """A message that only deletes ``k`` retained samples of ``h``."""
        members = self.retained[h]
        ids = sorted(members)[:k]
        Q = np.stack([members[i][0] for i in ids])
        y = np.array([members[i][1] for i in ids])
        for i in ids:
            del members[i]
        self.n_msgs[h] += 1
        entry = RowsEntry(-1, [f"del-{i}" for i in ids], ids, ["u"] * len(ids), y, Q)
        msg = (h, encode_delta(Delta(h, "test", self.d, 30, 0, (entry,))))
        self.messages.append(msg)
        return msg

    def reference(self, h: str) -> ExactLedger:
        led = ExactLedger(self.d, 0)
        m = self.retained[h]
        if m:
            led.add(np.stack([q for q, _ in m.values()]), np.array([lab for _, lab in m.values()]))
        return led

    def reference_retained_hash(self, h: str) -> str:
        m = self.retained[h]
        Q = np.stack([q for q, _ in m.values()]) if m else np.zeros((0, self.d), np.int64)
        return MultisetHash.of_rows(Q, np.array([lab for _, lab in m.values()], np.int64)).fingerprint()


def produce(settings: Settings, msgs: list[tuple[str, bytes]], timeout: float = 30.0) -> None:
    p = Producer(producer_config(settings))
    for h, raw in msgs:
        p.produce(settings.topic("deltas"), key=h.encode(), value=raw)
    assert p.flush(timeout) == 0


def worker_settings(settings: Settings, tmp_path: Path) -> Settings:
    return settings.with_(data_dir=str(tmp_path / "data"), checkpoint_every_messages=7,
                          checkpoint_every_seconds=1.0, reset_every_seconds=1.0, reset_every_events=50)


def assert_final_heads_exact(s: Settings, stream: Stream, timeout: float = 90.0) -> None:
    for h in stream.heads:
        ref = stream.reference(h)
        want = stream.n_msgs[h]
        got = wait_for_head(s, h, lambda u, want=want: u.version >= want and u.mode == "exact", timeout=timeout)
        assert got.version == want, f"{h}: every delta applied exactly once"
        assert got.digest == ref.digest(), f"{h}: ledger digest equals the from-scratch ledger"
        assert got.n_retained == ref.count
        assert got.retained_hash == stream.reference_retained_hash(h), f"{h}: retained-rows hash from scratch"
        ref.grow_outputs(got.weights.shape[1])
        gamma = HeadSettings.of(s).gamma
        assert np.array_equal(np.asarray(got.weights), solve_head(ref, gamma)), f"{h}: canonical head bit for bit"


def run_in_thread(w: Any) -> tuple[threading.Thread, list[BaseException]]:
    """An in-process ``LedgerWorker`` running in a thread, and the list that gets what its
    ``run`` raised (a crash under test, or a real failure for the test to report)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            w.run()
        except BaseException as exc:  # reported by the test
            failed.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, failed
