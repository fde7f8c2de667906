"""Remove wins, in event time, on a REAL broker (issue 20): adds and deletes from different
producers in any order. A ``requests`` partition is made to lag (the router's consumer paused on
it) while deletes race ahead on others; a delete_subject races its subject's adds in flight; a
later re-add enters; a featurizer killed with -9 between a tombstone and the late add (on the
same data dir, or an empty one: the tombstone comes back from the changelog) still refuses it."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Producer, TopicPartition

from tests.sealed_support import plain_delta
from tests.services.verifier.test_remove_wins import certify_messages
from tests.streams.featurizer.test_partitioner_independence import reference_digest
from tests.streams.featurizer.test_service import Reader, Running, ledgers_from
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import producer_config
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.receipts import Receipt, decode_receipt
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.streams.featurizer.feature_cache import FeatureCache
from unlearn.streams.featurizer.settings import FeaturizerSettings

pytestmark = pytest.mark.broker

DIM = 4
HEAD = "rw"


class Mixed:
    """Upstream apps with their own clients: Java's murmur2_random and librdkafka's
    consistent_random partitioners, keyed by subject, by sample id or not at all, each
    request at an explicit partition when asked (a lagging one, or one away from it)."""

    def __init__(self, s: Settings) -> None:
        self.topic = s.topic("requests")
        self.producers = [Producer(producer_config(s, partitioner="murmur2_random")),
                          Producer(producer_config(s, partitioner="consistent_random"))]
        self.n = 0

    def send(self, req: Request, partition: int | None = None) -> None:
        self.n += 1
        p = self.producers[self.n % 2]
        key = (req.subject_id.encode(), (req.sample_id or req.subject_id).encode(), None)[self.n % 3]
        kw: dict[str, Any] = {} if partition is None else {"partition": partition}
        p.produce(self.topic, encode_request(req), key, **kw)

    def flush(self) -> None:
        assert all(p.flush(30) == 0 for p in self.producers)  # acknowledged by the broker


def features(seed: int) -> tuple[float, ...]:
    return tuple(float(x) for x in np.random.default_rng(seed).normal(size=DIM))


def add_req(ev: str, subject: str, sample: str, seed: int, ts: float | None = None) -> Request:
    return Request(ev, "add", HEAD, "ingest-app", subject, sample, seed % 3, FeaturesInput(features(seed)), ts)


def n_requests_partitions(s: Settings) -> int:
    from confluent_kafka.admin import AdminClient

    from unlearn.runtime.clients import admin_config

    md = AdminClient(admin_config(s)).list_topics(timeout=10)
    return len(md.topics[s.topic("requests")].partitions)


def receipts_of(got: dict[str, list]) -> dict[str, Receipt]:
    return {r.event_id: r for r in (decode_receipt(m.value()) for m in got["receipts"])}


def dead_letters_of(got: dict[str, list]) -> dict[str, str]:
    return {d.event_id or "": d.reason for d in (decode_deadletter(m.value()) for m in got["deadletter"])}


def assert_head_is(got: dict[str, list], s: Settings, rows: dict[str, tuple[tuple[float, ...], int]]) -> None:
    """The head's ledger, summed from its deltas as the ledger processor does, equals a
    from-scratch ledger of exactly ``rows``."""
    ledgers, _ = ledgers_from(got["deltas"])
    led = ledgers[HEAD]
    ref = {k: (list(v), y) for k, (v, y) in rows.items()}
    assert led.count == len(rows)
    assert led.digest() == reference_digest(ref, s, led.n_outputs)


def assert_certified(got: dict[str, list]) -> None:
    """The verifier's replay of these deltas and receipts (no ledger ran: no live head) passes,
    remove-wins re-judged from the rows' event times included."""
    cert = certify_messages(got, HEAD)
    assert cert.ok and {c.name: c.status for c in cert.checks}["remove_wins"] == "pass", cert.summary()


def removed_by(got: dict[str, list], event_id: str) -> list[str]:
    """The samples whose -q rows carry ``event_id`` in the deltas."""
    out = []
    for m in got["deltas"]:
        for e in plain_delta(m.value(), m.topic()).entries:
            out += [smp for ev, smp in zip(e.event_ids, e.sample_ids, strict=True) if e.sign < 0 and ev == event_id]
    return sorted(out)


def settle(reader: Reader, run: Running) -> dict[str, list]:
    """Everything the featurizer wrote (anything else, there must be nothing, would arrive within
    half a second), after stopping it cleanly."""
    time.sleep(0.5)
    got = reader.until(lambda g: True)
    assert run.stop() == 0
    return got


def pause(run: Running, s: Settings, partition: int) -> None:
    """The router stops reading one requests partition (its consumer paused there): every
    request produced on it from now on is in flight until :func:`resume`."""
    run.service._consumer.pause([TopicPartition(s.topic("requests"), partition)])


def resume(run: Running, s: Settings, partition: int) -> None:
    run.service._consumer.resume([TopicPartition(s.topic("requests"), partition)])


# --------------------------------------------------------------------------- deletes race ahead
def test_deletes_racing_ahead_of_a_lagging_partition_win(settings: Settings, tmp_path: Path) -> None:
    """Adds acknowledged by the broker on a lagging partition, then deletes (keyed by sample id,
    other partitioners, other partitions) judged first: each delete is answered honestly
    (``tombstoned``: nothing removed, nothing of it can enter), the late adds are refused
    (``deleted_before_arrival``), a re-add dated after its delete enters, and the head is exactly
    a from-scratch ledger of the adds without a later delete."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    n = n_requests_partitions(s)
    lag = 0
    run = Running(s, group="rw-race")
    mixed = Mixed(s)
    reader = Reader(s)
    try:
        assert run.service.ready.wait(60)
        pause(run, s, lag)
        rows: dict[str, tuple[tuple[float, ...], int]] = {}
        adds = []
        for i in range(16):  # half dated by ts, half by the producer's record timestamp
            r = add_req(f"add-{i}", f"u{i % 4}", f"x{i}", i, ts=time.time() if i % 2 else None)
            mixed.send(r, partition=lag)
            adds.append(r)
            rows[f"x{i}"] = (features(i), i % 3)
        mixed.flush()
        time.sleep(0.05)  # the deletes below are later in event time (their records' ms end after)
        deletes = {}
        for j, i in enumerate(range(0, 16, 3)):  # x0, x3, ..., x15: never on the lagging partition
            d = Request(f"del-{i}", "delete", HEAD, "erasure-svc", f"u{i % 4}", f"x{i}",
                        ts=time.time() if j % 2 else None)
            mixed.send(d, partition=(lag + 1 + j % (n - 1)) % n)
            deletes[d.event_id] = f"x{i}"
            del rows[f"x{i}"]
        forget = Request("forget-u1", "delete_subject", HEAD, "erasure-svc", "u1", ts=time.time())
        mixed.send(forget, partition=(lag + 1) % n)
        gone_u1 = sorted(k for k in rows if int(k[1:]) % 4 == 1)
        for k in gone_u1:
            del rows[k]
        mixed.flush()
        got = reader.until(lambda g: set(deletes) | {"forget-u1"} <= set(receipts_of(g)), timeout=60)
        receipts = receipts_of(got)
        # the race happened: the deletes were judged while their adds were still in flight, and
        # each says so (before issue 20: 'rejected: unknown_sample', and the adds entered later)
        for ev in [*deletes, "forget-u1"]:
            r = receipts[ev]
            assert r.status == "tombstoned" and not r.removed and r.tombstone_ts is not None, r
            retention = FeaturizerSettings.of(s).tombstone_retention_seconds
            assert r.tombstone_expires == pytest.approx(r.tombstone_ts + retention)
        assert receipts["del-3"].sample_ids == ("x3",) and receipts["forget-u1"].sample_ids == ()
        # a re-add of x3, dated after its delete, on another partition: it enters
        readd = add_req("readd-3", "u3", "x3", 99, ts=time.time())
        mixed.send(readd, partition=(lag + 1) % n)
        mixed.flush()
        rows["x3"] = (features(99), 99 % 3)
        reader.until(lambda g: "readd-3" in ledgers_from(g["deltas"])[1], timeout=60)
        resume(run, s, lag)
        refused = {a.event_id for a in adds if a.sample_id not in rows or a.sample_id == "x3"}
        got = reader.until(lambda g: refused <= set(dead_letters_of(g))
                           and {a.event_id for a in adds if a.sample_id in rows and a.sample_id != "x3"}
                           <= set(ledgers_from(g["deltas"])[1]), timeout=60)
        got = settle(reader, run)
    finally:
        reader.close()
        run.stop_event.set()
    dls = dead_letters_of(got)
    assert dls == {ev: "deleted_before_arrival" for ev in refused}, dls
    assert_head_is(got, s, rows)
    assert_certified(got)
    # nothing the deletes named entered; the later re-add did
    _, events = ledgers_from(got["deltas"])
    assert "readd-3" in events and not refused & set(events)


def test_delete_subject_racing_its_subjects_adds_in_flight(settings: Settings, tmp_path: Path) -> None:
    """A subject's first adds are in the head, more are in flight on a lagging partition when the
    erasure service's delete_subject overtakes them: it removes the samples in the head, the
    in-flight adds never enter, a re-add dated after the erasure does."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    n = n_requests_partitions(s)
    lag, other = 1, 2 % n
    run = Running(s, group="rw-subject")
    mixed = Mixed(s)
    reader = Reader(s)
    try:
        assert run.service.ready.wait(60)
        first = [add_req(f"erin-{i}", "erin", f"e{i}", i) for i in range(2)]
        keep = add_req("bob-0", "bob", "b0", 7)
        for r in [*first, keep]:
            mixed.send(r, partition=other)
        mixed.flush()
        reader.until(lambda g: {"erin-0", "erin-1", "bob-0"} <= set(ledgers_from(g["deltas"])[1]))
        pause(run, s, lag)
        in_flight = [add_req(f"erin-late-{i}", "erin", f"e{i + 2}", i + 2) for i in range(3)]
        for r in in_flight:
            mixed.send(r, partition=lag)
        mixed.flush()  # acknowledged: "the add happened" for the app that produced them
        time.sleep(0.05)
        mixed.send(Request("forget-erin", "delete_subject", HEAD, "erasure-svc", "erin"), partition=other)
        mixed.flush()
        # applied: it removed what was in the head (the ledger processor's applied receipt will
        # name these samples; no ledger runs here) and left its tombstone, nothing refused
        got = reader.until(lambda g: "forget-erin" in ledgers_from(g["deltas"])[1], timeout=60)
        assert removed_by(got, "forget-erin") == ["e0", "e1"] and "forget-erin" not in receipts_of(got)
        resume(run, s, lag)
        got = reader.until(lambda g: {r.event_id for r in in_flight} <= set(dead_letters_of(g)), timeout=60)
        assert {ev: dead_letters_of(got)[ev] for ev in ("erin-late-0", "erin-late-1", "erin-late-2")} == \
            dict.fromkeys(("erin-late-0", "erin-late-1", "erin-late-2"), "deleted_before_arrival")
        # erin comes back later (a new consent): a re-add dated after the erasure enters
        back = add_req("erin-back", "erin", "e2", 42, ts=time.time())
        mixed.send(back, partition=lag)
        mixed.flush()
        reader.until(lambda g: "erin-back" in ledgers_from(g["deltas"])[1], timeout=60)
        got = settle(reader, run)
    finally:
        reader.close()
        run.stop_event.set()
    assert_head_is(got, s, {"b0": (features(7), 7 % 3), "e2": (features(42), 42 % 3)})
    assert_certified(got)


# --------------------------------------------------------------------------- kill -9
@pytest.mark.parametrize("data_dir", ["kept", "empty"])
def test_a_tombstone_survives_kill_minus_nine_and_refuses_the_late_add(settings: Settings, tmp_path: Path,
                                                                       data_dir: str) -> None:
    """A featurizer process records a delete's tombstone (its receipt is out), is killed with -9,
    and the sample's add, older in event time, arrives only then. The next featurizer, on the
    same data dir or on an empty one (a partition moved to another host: the tombstone is rebuilt
    from the featurizer-cache changelog), refuses it; a re-add dated later enters."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    args = ["featurizer", "--group", "rw-kill", "--device", "cpu", "--max-ms", "10"]
    feat = ServiceProcess("featurizer", args, s, tmp_path / "logs").start()
    mixed = Mixed(s)
    reader = Reader(s)
    try:
        feat.wait_for_log("unlearn featurizer ready", timeout=90)
        t_add = time.time()  # the add happened first (its producer lags), the delete after
        t_del = t_add + 0.001
        mixed.send(Request("del-k", "delete", HEAD, "erasure-svc", "kim", "k1", ts=t_del))
        mixed.send(add_req("other-0", "lee", "l0", 3, ts=t_add))
        mixed.flush()
        got = reader.until(lambda g: "del-k" in receipts_of(g) and "other-0" in ledgers_from(g["deltas"])[1],
                           timeout=90)
        assert receipts_of(got)["del-k"].status == "tombstoned"
        feat.kill9()  # between the tombstone and the late add
        if data_dir == "empty":
            shutil.rmtree(tmp_path / "data")
        mixed.send(add_req("late-k", "kim", "k1", 5, ts=t_add))  # dated before the delete: refused
        mixed.send(add_req("tie-k", "kim", "k1", 6, ts=t_del))  # dated with it: refused (remove wins ties)
        # later: enters (1 ms later: float64 seconds resolve only ~0.24 us at this epoch, so a 1 us
        # step rounded to whole microseconds tied with the delete in some runs)
        mixed.send(add_req("readd-k", "kim", "k1", 8, ts=t_del + 0.001))
        mixed.flush()
        feat.start()
        feat.wait_for_log("unlearn featurizer ready", timeout=90)
        got = reader.until(lambda g: {"late-k", "tie-k"} <= set(dead_letters_of(g))
                           and "readd-k" in ledgers_from(g["deltas"])[1], timeout=90)
        assert feat.stop() == 0
    finally:
        reader.close()
        feat.stop()
    dls = dead_letters_of(got)
    assert (dls["late-k"], dls["tie-k"]) == ("deleted_before_arrival", "deleted_before_arrival")
    assert_head_is(got, s, {"l0": (features(3), 0), "k1": (features(8), 8 % 3)})
    caches = list((tmp_path / "data" / "featurizer").glob("*/p*.sqlite"))
    tombs = []
    for path in caches:
        with FeatureCache(path) as cache:
            tombs += cache.all_tombstones()
    assert [(t.kind, t.id, t.subject_id, t.event_id) for t in tombs] == [("sample", "k1", "kim", "del-k")]
    if data_dir == "empty":
        assert "tombstones" in feat.log_path.read_text(errors="replace")  # rebuilt from the changelog


def test_a_tombstone_moves_with_its_partition_on_a_rebalance(settings: Settings, tmp_path: Path) -> None:
    """Member A records a tombstone; B (another host: an empty data dir) joins and A leaves, so
    every partition moves to B, which rebuilds the cache, tombstone included, from the changelog:
    the late add is refused there, the later re-add enters."""
    s_a = settings.with_(data_dir=str(tmp_path / "host-a"))
    s_b = settings.with_(data_dir=str(tmp_path / "host-b"))
    mixed = Mixed(settings)
    reader = Reader(settings)
    a = Running(s_a, group="rw-move")
    b: Running | None = None
    try:
        assert a.service.ready.wait(60)
        t_del = time.time()
        mixed.send(Request("del-m", "delete", HEAD, "erasure-svc", "mo", "m1", ts=t_del))
        mixed.flush()
        got = reader.until(lambda g: "del-m" in receipts_of(g), timeout=60)
        assert receipts_of(got)["del-m"].status == "tombstoned"
        b = Running(s_b, group="rw-move")
        assert b.service.ready.wait(60)
        assert a.stop() == 0  # A leaves: B owns every partition now
        mixed.send(add_req("late-m", "mo", "m1", 1, ts=t_del - 1))
        mixed.send(add_req("readd-m", "mo", "m1", 2, ts=t_del + 1))
        mixed.flush()
        reader.until(lambda g: "late-m" in dead_letters_of(g) and "readd-m" in ledgers_from(g["deltas"])[1],
                     timeout=90)
        got = settle(reader, b)
    finally:
        reader.close()
        a.stop_event.set()
        if b is not None:
            b.stop_event.set()
    assert dead_letters_of(got) == {"late-m": "deleted_before_arrival"}
    assert_head_is(got, settings, {"m1": (features(2), 2)})
    tombs = []
    for path in (tmp_path / "host-b" / "featurizer").glob("*/p*.sqlite"):
        with FeatureCache(path) as cache:
            tombs += [(t.id, t.event_id) for t in cache.all_tombstones()]
    assert tombs == [("m1", "del-m")]
