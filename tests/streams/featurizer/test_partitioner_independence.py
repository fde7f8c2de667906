"""Partitioner independence on a REAL broker (issue 10): requests produced with any partitioner,
any key, no key or explicit partitions are routed by head, so a delete always meets its add;
``subject_mismatch`` and a delete of a sample never added (tombstoned) do not depend on partitions; and the router's
re-forwarded copies (a crash between its delivery and its commit, or a zombie) never double an
event."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Producer

from tests.streams.featurizer.test_service import Reader, Running, ledgers_from
from unlearn.common.by_head import head_partition
from unlearn.features.contract import quantize_feature_row
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.ledger import ExactLedger
from unlearn.runtime.clients import producer_config
from unlearn.runtime.topic_reader import read_topic
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.receipts import decode_receipt
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.services.client.head_reader import wait_for_head
from unlearn.services.client.sdk import UnlearnClient
from unlearn.streams.featurizer.routing import read_origin

pytestmark = pytest.mark.broker

DIM = 4


class Producers:
    """Every way an upstream app may produce: the SDK (librdkafka's consistent_random, key =
    subject), raw producers with Java's murmur2_random or consistent_random, explicit partitions,
    no key, and a key that is not the subject. Remembers each request's requests partition."""

    KINDS = ("sdk", "murmur2", "consistent", "explicit", "no_key", "other_key")

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.topic = s.topic("requests")
        # plaintext like the raw producers: the SDK adds go out before any featurizer publishes a
        # transit key, which UNLEARN_TRANSIT_SEAL=auto would wait for (docs/client.md)
        self.sdk = UnlearnClient(s.with_(transit_seal="off"), "app")
        self.murmur = Producer(producer_config(s, partitioner="murmur2_random"))
        self.crc = Producer(producer_config(s, partitioner="consistent_random"))
        self.partition: dict[str, int] = {}  # event id -> requests partition it landed on
        self._handles: list[Any] = []

    def send(self, kind: str, req: Request, partition: int | None = None) -> None:
        value = encode_request(req)

        def landed(err: Any, msg: Any) -> None:
            assert err is None, err
            self.partition[req.event_id] = msg.partition()

        subject = req.subject_id.encode()
        if kind == "sdk":
            self._handles.append(self.sdk.send(req))
        elif kind == "murmur2":
            self.murmur.produce(self.topic, value, subject, on_delivery=landed)
        elif kind == "consistent":
            self.crc.produce(self.topic, value, subject, on_delivery=landed)
        elif kind == "explicit":
            assert partition is not None
            self.crc.produce(self.topic, value, subject, partition=partition, on_delivery=landed)
        elif kind == "no_key":
            self.murmur.produce(self.topic, value, on_delivery=landed)
        else:
            self.crc.produce(self.topic, value, f"other-{req.event_id}".encode(), on_delivery=landed)

    def flush(self) -> None:
        assert self.murmur.flush(30) == 0 and self.crc.flush(30) == 0 and self.sdk.flush(30) == 0
        for h in self._handles:
            h.wait_delivered(30)
            self.partition[h.event_id] = h.partition
        self._handles = []

    def close(self) -> None:
        self.sdk.close()


def heads_on_two_partitions(n: int) -> tuple[str, str]:
    """Two head ids the router puts on different by-head partitions."""
    first = "mix-a"
    other = next(h for h in (f"mix-{i}" for i in range(100)) if head_partition(h, n) != head_partition(first, n))
    return first, other


def reference_digest(rows: dict[str, tuple[list[float], int]], settings: Settings, n_outputs: int) -> str:
    heads = HeadSettings.of(settings)
    led = ExactLedger(DIM, n_outputs, heads.frac_bits, heads.label_frac_bits)
    if rows:
        Q = np.stack([quantize_feature_row(np.asarray(v), heads.frac_bits, heads.feature_bound)
                      for v, _ in rows.values()])
        led.add(Q, np.array([y for _, y in rows.values()]))
    led.grow_outputs(n_outputs)
    return led.digest()


def test_any_producer_partitioner_or_key_meets_its_add(settings: Settings, tmp_path: Path) -> None:
    s = settings.with_(data_dir=str(tmp_path / "data"), checkpoint_every_seconds=1.0, reset_every_seconds=1.0)
    n = s.partitions
    heads = heads_on_two_partitions(n)
    rng = np.random.default_rng(10)
    prod = Producers(s)
    retained: dict[str, dict[str, tuple[list[float], int]]] = {h: {} for h in heads}
    owner: dict[tuple[str, str], str] = {}
    adds: list[str] = []
    for head in heads:
        for i in range(4):
            subject = f"{head}-s{i}"
            for k, kind in enumerate(Producers.KINDS):
                sample, v, y = f"x{i}{k}", [float(x) for x in rng.normal(size=DIM)], (i + k) % 3
                ev = f"add-{head}-{sample}"
                prod.send(kind, Request(ev, "add", head, "app", subject, sample, y, FeaturesInput(tuple(v))),
                          partition=(i + k) % n)
                retained[head][sample], owner[(head, sample)] = (v, y), subject
                adds.append(ev)
    prod.flush()
    ledger = ServiceProcess("ledger", ["ledger"], s, tmp_path / "logs").start()
    feat = Running(s, group="fz-mixed")
    reader = Reader(s)
    try:
        reader.until(lambda g: set(adds) <= set(ledgers_from(g["deltas"])[1]), timeout=60)
        # Deletes through ANOTHER producer than each add: another partitioner, key, or partition.
        applied: dict[str, list[str]] = {}
        moved = 0
        for head in heads:
            for i in range(3):  # subject 3 is removed whole below
                subject = f"{head}-s{i}"
                for k in range(3):
                    sample = f"x{i}{k}"
                    ev = f"del-{head}-{sample}"
                    kind = Producers.KINDS[(k + 1) % len(Producers.KINDS)]
                    away = (prod.partition[f"add-{head}-{sample}"] + 1) % n  # never the add's partition
                    prod.send(kind, Request(ev, "delete", head, "app", subject, sample), partition=away)
                    applied[ev] = [sample]
                    del retained[head][sample]
            gone = sorted(smp for smp in retained[head] if owner[(head, smp)] == f"{head}-s3")
            prod.send("murmur2", Request(f"forget-{head}", "delete_subject", head, "app", f"{head}-s3"))
            applied[f"forget-{head}"] = gone
            for smp in gone:
                del retained[head][smp]
        # Refusals, wherever the requests land: a sample named with another subject than its
        # owner's (once on a partition chosen away from the add's), and a sample never added.
        head = heads[0]
        away = (prod.partition[f"add-{head}-x05"] + 1) % n
        prod.send("sdk", Request("wrong-subject-1", "delete", head, "app", f"{head}-s1", "x04"))
        prod.send("explicit", Request("wrong-subject-2", "delete", head, "app", f"{head}-s2", "x05"), partition=away)
        prod.send("no_key", Request("ghost", "delete", head, "app", f"{head}-s0", "never-added"))
        prod.flush()
        for head in heads:
            for i in range(3):
                for k in range(3):
                    moved += prod.partition[f"del-{head}-x{i}{k}"] != prod.partition[f"add-{head}-x{i}{k}"]
        assert moved >= 6  # at least the explicit ones (k=2) landed away from their adds
        assert prod.partition["wrong-subject-2"] != prod.partition[f"add-{heads[0]}-x05"]
        rejected = {"wrong-subject-1": "subject_mismatch", "wrong-subject-2": "subject_mismatch"}
        tombstoned = {"ghost"}  # a sample never added: nothing removed, its tombstone keeps it out
        receipts: dict[str, Any] = {}

        def all_receipts(_: dict[str, list]) -> bool:
            for r in read_topic(s, s.topic("receipts"), timeout=30):
                rec = decode_receipt(r.value or b"")
                receipts[rec.event_id] = rec
            return set(applied) | set(rejected) | tombstoned <= set(receipts)

        deadline = time.monotonic() + 90
        while not all_receipts({}):
            assert time.monotonic() < deadline, \
                f"receipts missing: {set(applied) | set(rejected) | tombstoned - set(receipts)}"
            time.sleep(0.5)
        for ev, samples in applied.items():
            assert receipts[ev].status == "applied", receipts[ev]
            assert sorted(receipts[ev].sample_ids) == sorted(samples)
        for ev, reason in rejected.items():
            assert (receipts[ev].status, receipts[ev].reason) == ("rejected", reason), receipts[ev]
        assert all(receipts[ev].status == "tombstoned" and not receipts[ev].removed for ev in tombstoned)
        # the ledger is exact: each head equals a from-scratch ledger of what is retained
        for head in heads:
            ref_rows = retained[head]
            wait_for_head(s, head, lambda u, rows=ref_rows: u.mode == "exact"
                          and u.digest == reference_digest(rows, s, u.weights.shape[1]), timeout=90)
        got = reader.until(lambda g: set(applied) <= set(ledgers_from(g["deltas"])[1]) and len(g["deadletter"]) >= 2)
        time.sleep(0.5)  # anything else (there must be nothing) would arrive now
        got = reader.until(lambda g: True)
        # no event twice, nothing refused that should not be
        _, events = ledgers_from(got["deltas"], dedup=False)
        assert sorted(e for e in events if not e.startswith("forget-")) == sorted([*adds, *(
            e for e in applied if e.startswith("del-"))])
        reasons = sorted(decode_deadletter(m.value()).reason for m in got["deadletter"])
        assert reasons == sorted(rejected.values())
        assert feat.stop() == 0
        assert feat.service.stats["routed"] == len(adds) + len(applied) + len(rejected) + len(tombstoned)
    finally:
        reader.close()
        prod.close()
        feat.stop_event.set()
        ledger.stop()
    assert ledger.proc is not None and ledger.proc.returncode == 0, ledger.log_tail()


def produce(s: Settings, reqs: list[Request]) -> None:
    p = Producer(producer_config(s, partitioner="murmur2_random"))
    for r in reqs:
        p.produce(s.topic("requests"), encode_request(r), r.subject_id.encode())
    assert p.flush(30) == 0


def workload(n_heads: int = 3) -> tuple[list[Request], list[Request], dict[str, dict[str, tuple[list[float], int]]]]:
    """Adds over several heads and subjects, then deletes of some of them."""
    rng = np.random.default_rng(4)
    adds, deletes = [], []
    retained: dict[str, dict[str, tuple[list[float], int]]] = {f"g{h}": {} for h in range(n_heads)}
    for i in range(30):
        head, subject = f"g{i % n_heads}", f"u{i % 7}"
        v, y = [float(x) for x in rng.normal(size=DIM)], i % 4
        adds.append(Request(f"a{i}", "add", head, "app", subject, f"x{i}", y, FeaturesInput(tuple(v))))
        retained[head][f"x{i}"] = (v, y)
    for i in range(0, 30, 3):
        head, subject = f"g{i % n_heads}", f"u{i % 7}"
        deletes.append(Request(f"d{i}", "delete", head, "app", subject, f"x{i}"))
        del retained[head][f"x{i}"]
    return adds, deletes, retained


def check_exact(delta_msgs: list, retained: dict[str, dict[str, tuple[list[float], int]]], s: Settings,
                events: list[str]) -> None:
    """Every event reached the deltas exactly once (no copy at all, not even one the ledger would
    skip) and every head's ledger equals the from-scratch one."""
    ledgers, got = ledgers_from(delta_msgs, dedup=False)
    assert sorted(got) == sorted(events)
    for head, rows in retained.items():
        assert ledgers[head].digest() == reference_digest(rows, s, ledgers[head].n_outputs)


def test_a_crash_between_forwarding_and_committing_doubles_nothing(settings: Settings, tmp_path: Path) -> None:
    """The router forwards, the process dies before the requests offsets are committed, the next
    process forwards the same records again: the by-head topic holds two copies of each, and the
    featurizer judges each once."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    adds, deletes, retained = workload()
    produce(s, adds)

    class Crash(Exception):
        pass

    def crash_after_route(point: str) -> None:
        if point == "after_route":
            raise Crash(point)

    first = Running(s, group="fz-reforward", fault=crash_after_route)
    assert isinstance(first.wait_dead(40), Crash)
    reader = Reader(s)
    second = Running(s, group="fz-reforward")
    try:
        reader.until(lambda g: {r.event_id for r in adds} <= set(ledgers_from(g["deltas"])[1]))
        produce(s, deletes)
        reader.until(lambda g: {r.event_id for r in deletes} <= set(ledgers_from(g["deltas"])[1]))
        time.sleep(0.5)  # anything else (there must be nothing) would arrive now
        got = reader.until(lambda g: True)
        assert second.stop() == 0
    finally:
        reader.close()
        second.stop_event.set()
    copies = routed_records(s)
    assert len(copies) > len(adds) + len(deletes)  # the first process's forwards are there too
    assert second.service.stats["reforwarded"] == len(copies) - len(adds) - len(deletes)
    check_exact(got["deltas"], retained, s, [r.event_id for r in adds + deletes])
    assert not got["deadletter"]


def test_copies_from_a_zombie_router_are_dropped(settings: Settings, tmp_path: Path) -> None:
    """A router that lost its partitions but still forwards (or any duplicate delivery) writes
    records the featurizer already judged into the by-head topic, interleaved with new ones: they
    are dropped, and the new ones are judged."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    adds, deletes, retained = workload()
    produce(s, adds)
    reader = Reader(s)
    run = Running(s, group="fz-zombie")
    try:
        reader.until(lambda g: {r.event_id for r in adds} <= set(ledgers_from(g["deltas"])[1]))
        routed = routed_records(s)
        assert len(routed) == len(adds)
        assert all(read_origin(m.headers(), "requests") is not None for m in routed)
        zombie = Producer(producer_config(s))
        for m in routed:  # every record again, with its headers, where the router had put it
            zombie.produce(m.topic(), m.value(), m.key(), partition=m.partition(), headers=m.headers())
        assert zombie.flush(30) == 0
        produce(s, deletes)
        reader.until(lambda g: {r.event_id for r in deletes} <= set(ledgers_from(g["deltas"])[1]))
        wait_until(lambda: run.service.stats["reforwarded"] >= len(routed))
        time.sleep(0.5)
        got = reader.until(lambda g: True)
        assert run.stop() == 0
    finally:
        reader.close()
        run.stop_event.set()
    assert run.service.stats["reforwarded"] == len(routed)
    check_exact(got["deltas"], retained, s, [r.event_id for r in adds + deletes])


def routed_records(s: Settings) -> list[Any]:
    """Every record of the by-head topic, with its headers (``read_topic`` keeps none)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    from unlearn.runtime.clients import consumer_config

    topic = s.topic("requests.by-head")
    c = Consumer(consumer_config(s, f"{s.topic_prefix}headers", **{"enable.partition.eof": True}))
    try:
        parts = list(c.list_topics(timeout=10).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[Any] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + 30
        while len(at_end) < len(parts):
            assert time.monotonic() < deadline, "by-head topic not read to its end"
            for m in c.consume(100, 0.2):
                if m.error() is None:
                    out.append(m)
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
        return out
    finally:
        c.close()


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_cache_routed_by_another_partition_count_is_refused(settings: Settings, tmp_path: Path) -> None:
    """Heads routed by n partitions live in those partitions' caches: a by-head topic with another
    count (Kafka can add partitions; tansu cannot, so the cache's record is edited here) would look
    them up elsewhere. The featurizer stops (exit 2) instead."""
    from unlearn.runtime.log_position import StaleStateError
    from unlearn.streams.featurizer.feature_cache import FeatureCache

    s = settings.with_(data_dir=str(tmp_path / "data"))
    adds, _, _ = workload()
    produce(s, adds)
    reader = Reader(s)
    run = Running(s, group="fz-count")
    try:
        reader.until(lambda g: {r.event_id for r in adds} <= set(ledgers_from(g["deltas"])[1]))
        assert run.stop() == 0
    finally:
        reader.close()
        run.stop_event.set()
    files = list((tmp_path / "data").glob("featurizer/*/p*.sqlite"))
    assert files
    for f in files:
        with FeatureCache(f) as cache:
            assert cache.route_partitions == s.partitions
            cache._db.execute("UPDATE meta SET value = '8' WHERE key = 'route_partitions'")
    again = Running(s, group="fz-count")
    err = again.wait_dead(60)
    assert isinstance(err, StaleStateError) and "routed by 8 partitions" in str(err), err
