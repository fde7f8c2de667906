"""The featurizer service against a REAL Kafka-protocol broker (conftest: tansu or KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import itertools
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.sealed_support import plain_delta
from unlearn.common.registry import read_contracts
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.ledger import ExactLedger, Quantizer, l2_normalize
from unlearn.runtime.clients import consumer_config, producer_config
from unlearn.runtime.topics import create_topics, delete_topics
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.delta_codec import PackedEntry, RowsEntry, decode_delta
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.receipts import decode_receipt
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.schemas.source_id import parse_source
from unlearn.services.cli import main
from unlearn.streams.featurizer.service import FeaturizerService, LostCacheError

pytestmark = pytest.mark.broker


# --------------------------------------------------------------------------- helpers
class Reader:
    """Reads the output topics from the beginning (its own group-less assignment)."""

    def __init__(self, settings: Settings, logical: tuple[str, ...] = ("deltas", "deadletter", "receipts")) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.c = Consumer(consumer_config(settings, f"reader-{uuid.uuid4().hex}"))
        self.names = {settings.topic(n): n for n in logical}
        md = self.c.list_topics(timeout=10)
        self.c.assign([TopicPartition(t, p, OFFSET_BEGINNING)
                       for t in self.names for p in md.topics[t].partitions])
        self.got: dict[str, list] = {n: [] for n in logical}

    def until(self, done: Callable[[dict[str, list]], bool], timeout: float = 40.0) -> dict[str, list]:
        deadline = time.monotonic() + timeout
        while not done(self.got):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; got { {k: len(v) for k, v in self.got.items()} }")
            for m in self.c.consume(100, 0.2):
                if m.error() is None:
                    self.got[self.names[m.topic()]].append(m)
        return self.got

    def close(self) -> None:
        self.c.close()


def produce(settings: Settings, values: list[tuple[str, bytes]], topic: str | None = None,
            traced: bool = False) -> None:
    """``traced``: each record with a fresh W3C traceparent header (infra/tracing.py)."""
    from confluent_kafka import Producer

    from unlearn.infra.tracing import new_traceparent

    p = Producer(producer_config(settings))
    for key, value in values:
        p.produce(topic or settings.topic("requests"), value=value, key=key.encode(),
                  **({"headers": [("traceparent", new_traceparent())]} if traced else {}))
    assert p.flush(30) == 0


def add(ev: str, head: str, subj: str, sample: str, values, label, client: str = "app") -> tuple[str, bytes]:
    return subj, encode_request(Request(ev, "add", head, client, subj, sample, label,
                                        FeaturesInput(tuple(float(v) for v in values))))


def delete(ev: str, head: str, subj: str, sample: str, client: str = "app") -> tuple[str, bytes]:
    return subj, encode_request(Request(ev, "delete", head, client, subj, sample))


def delete_subject(ev: str, head: str, subj: str, client: str = "app") -> tuple[str, bytes]:
    return subj, encode_request(Request(ev, "delete_subject", head, client, subj))


class Running:
    """A FeaturizerService in a thread; ``stop()`` returns run()'s result or raises its error."""

    def __init__(self, settings: Settings, **kw) -> None:
        self.service = FeaturizerService(settings, **{"max_ms": 20, **kw})
        self.stop_event = threading.Event()
        self.result: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.service.run(self.stop_event)
        except BaseException as exc:
            self.error = exc

    def stop(self, timeout: float = 30.0) -> object:
        self.stop_event.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "featurizer did not stop"
        if self.error is not None:
            raise self.error
        return self.result

    def wait_dead(self, timeout: float = 30.0) -> BaseException | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive()
        return self.error


def ledgers_from(delta_msgs: list, dedup: bool = True) -> tuple[dict[str, ExactLedger], list[str]]:
    """What the ledger processor does with a deltas log: skip a delta whose source offset is not
    beyond what was applied from its (stream, partition) for that head; apply rows or packed."""
    ledgers: dict[str, ExactLedger] = {}
    seen: dict[tuple[str, str, int], int] = {}
    events: list[str] = []
    for m in delta_msgs:
        d = plain_delta(m.value(), m.topic())
        assert m.key() == d.head_id.encode()
        stream, part, off = parse_source(d.source_id)
        key = (d.head_id, stream, part)
        if dedup and off <= seen.get(key, -1):
            continue
        seen[key] = off
        led = ledgers.setdefault(d.head_id, ExactLedger(d.d, 0, d.frac_bits, d.label_frac_bits))
        for e in d.entries:
            if isinstance(e, RowsEntry):
                (led.add if e.sign > 0 else led.delete)(e.q, e.labels)
            else:
                led.absorb(ExactLedger.from_bytes(e.ledger_blob), e.sign)
            events.extend(e.event_ids)
    return ledgers, events


def reference(retained: dict[tuple[str, str], tuple[list[float], int]], head: str, n_outputs: int) -> str:
    rows = [(v, y) for (h, _), (v, y) in sorted(retained.items()) if h == head]
    Q = np.stack([Quantizer(30).quantize(l2_normalize(np.asarray(v)))[0] for v, _ in rows])
    return ExactLedger.from_rows(Q, np.array([y for _, y in rows]), n_outputs=n_outputs).digest()


def workload(client: str = "app"):
    """~50 requests over two heads, 8 subjects: adds, deletes, delete_subject and 5 bad ones.
    Returns (requests, retained set, accepted event ids, expected dead-letter reasons)."""
    rng = np.random.default_rng(3)
    reqs, retained, accepted = [], {}, []
    subj_of = {}
    for i in range(36):
        head, d = ("h2", 3) if i % 3 == 0 else ("h1", 4)
        v = list(rng.normal(size=d))
        subj = f"s{i % 8}"
        subj_of[f"x{i}"] = subj
        reqs.append(add(f"a{i}", head, subj, f"x{i}", v, i % 3, client))
        retained[(head, f"x{i}")] = (v, i % 3)
        accepted.append(f"a{i}")
    for i in range(1, 5):  # x1..x4
        head = "h2" if i % 3 == 0 else "h1"
        reqs.append(delete(f"d{i}", head, subj_of[f"x{i}"], f"x{i}", client))
        del retained[(head, f"x{i}")]
        accepted.append(f"d{i}")
    reqs.append(delete_subject("forget-s5", "h1", "s5", client))
    reqs.append(delete_subject("forget-s6", "h2", "s6", client))
    for key in [k for k in retained if (k[0], subj_of[k[1]]) in {("h1", "s5"), ("h2", "s6")}]:
        del retained[key]
    accepted += ["forget-s5", "forget-s6"]
    reqs += [
        add("dup", "h1", "s2", "x10", [1, 2, 3, 4], 0, client),                   # duplicate_add
        delete("unknown", "h1", "s1", "nope", client),                            # tombstoned
        ("s3", b"{this is not json"),                                             # not_json
        add("dim", "h1", "s1", "w", [1, 2], 0, client),                           # dimension_mismatch
        ("s2", orjson.dumps({"schema": "unlearn.request/v1", "event_id": "soft", "op": "add", "head_id": "h1",
                             "client_id": client, "subject_id": "s2", "sample_id": "v",
                             "label": [0.5, 0.5], "input": {"kind": "features", "values": [1, 2, 3, 4]}})),
    ]
    reasons = sorted(["duplicate_add", "not_json", "dimension_mismatch",
                      "soft_label_needs_label_frac_bits"])
    return reqs, retained, accepted, reasons


def committed_offsets(settings: Settings, group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(consumer_config(settings, group))
    try:
        md = c.list_topics(timeout=10)
        tps = c.committed([TopicPartition(topic, p) for p in md.topics[topic].partitions], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def again_counts(data_dir: Path) -> list[int]:
    """Samples per cache file under a data dir."""
    from unlearn.streams.featurizer.feature_cache import FeatureCache

    out = []
    for f in sorted(data_dir.glob("featurizer/*/p*.sqlite")):
        with FeatureCache(f) as cache:
            out.append(cache.count())
    return out


def q_rows(delta_msgs: list) -> dict[tuple[int, str], list[tuple[int, ...]]]:
    """(sign, sample id) -> the q rows (and label) the deltas carried for it."""
    out: dict[tuple[int, str], list[tuple[int, ...]]] = {}
    for m in delta_msgs:
        for e in plain_delta(m.value(), m.topic()).entries:
            assert isinstance(e, RowsEntry)
            for i, sid in enumerate(e.sample_ids):
                out.setdefault((e.sign, sid), []).append((*map(int, e.q[i]), int(e.labels[i])))
    return out


# --------------------------------------------------------------------------- tests
def test_end_to_end_requests_to_deltas_deadletter_receipts(settings: Settings, tmp_path: Path) -> None:
    s = settings.with_(data_dir=str(tmp_path / "data"))
    reqs, retained, accepted, reasons = workload()
    produce(s, reqs)
    reader = Reader(s)
    points: list[str] = []
    run = Running(s, group="fz-e2e", fault=points.append, max_batch=16)
    try:
        got = reader.until(lambda g: len(g["deadletter"]) >= len(reasons) and len(g["receipts"]) >= 1
                           and set(accepted) <= set(ledgers_from(g["deltas"])[1]))
        assert run.stop() == 0
    finally:
        reader.close()
        run.stop_event.set()
    # a batch's phase 1 is awaited while the next batch is polled and judged, but always before
    # the next sqlite commit (so before the next phase 0), and every batch is settled by the stop
    commits = [i for i, p in enumerate(points) if p == "after_cache_commit"] + [len(points)]
    assert len(commits) > 2 and points.count("after_produce") == points.count("after_cache_commit")
    for a, b in itertools.pairwise(commits):
        one = points[a:b]
        assert one.index("after_changelog") < one.index("after_produce") < one.index("after_outbox_ack"), one
    ledgers, events = ledgers_from(got["deltas"], dedup=False)
    assert sorted(events) == sorted(accepted + ["forget-s5"] * 2 + ["forget-s6"] * 1)  # one row per sample
    for head in ("h1", "h2"):
        assert ledgers[head].digest() == reference(retained, head, ledgers[head].n_outputs)
    for m in got["deltas"]:
        assert parse_source(decode_delta(m.value()).source_id)[0] == "requests.by-head"
    dls = [decode_deadletter(m.value()) for m in got["deadletter"]]
    assert sorted(d.reason for d in dls) == reasons
    assert all(d.stage == "featurizer" and d.topic == s.topic("requests") and d.offset is not None for d in dls)
    (receipt,) = [decode_receipt(m.value()) for m in got["receipts"]]
    assert (receipt.event_id, receipt.status, receipt.reason) == ("unknown", "tombstoned", None)
    # input offsets were committed after the acks, up to the end of every partition (fresh topic:
    # offsets start at 0, so the committed offsets sum to the number of requests; the watermark
    # from ListOffsets is not used because tansu gets it wrong after multi-record batches)
    committed = committed_offsets(s, "fz-e2e", s.topic("requests"))
    assert sum(o for o in committed.values() if o > 0) == len(reqs)

    # The cache lives on in the featurizer-cache changelog: an empty data dir is rebuilt from it...
    shutil.rmtree(tmp_path / "data")
    again = Running(s, group="fz-e2e")
    assert again.service.ready.wait(30)
    assert again.stop() == 0
    assert sum(again_counts(tmp_path / "data")) == len(retained)  # every retained sample is back
    # ...and losing both copies while the group has committed offsets is refused.
    shutil.rmtree(tmp_path / "data")
    delete_topics(s, [s.topic("featurizer-cache")])
    time.sleep(1.0)
    create_topics(s)
    lost = Running(s, group="fz-e2e")
    err = lost.wait_dead(30)
    assert isinstance(err, LostCacheError) and "changelog" in str(err), err


def test_a_delete_closes_the_batch_window(settings: Settings, tmp_path: Path) -> None:
    """A batch holding a delete goes on once what was already fetched is in (routing and
    featurizing both), instead of waiting out the window: with a two-minute window the delete's
    receipt still comes within the reader's patience; with the hint off it would not."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    run = Running(s, group="fz-window", max_ms=120_000)
    reader = Reader(s)
    try:
        assert run.service.ready.wait(30)
        # the window lends its waits to settling the batch in flight (docs/featurizer.md)
        assert run.service.window.waiting == run.service.batches.settle_if_answered
        produce(s, [delete("d1", "h1", "alice", "never-added")])
        got = reader.until(lambda g: len(g["receipts"]) >= 1, timeout=40)
        (receipt,) = [decode_receipt(m.value()) for m in got["receipts"]]
        assert (receipt.event_id, receipt.status) == ("d1", "tombstoned")
        assert run.stop() == 0
    finally:
        reader.close()
        run.stop_event.set()


def test_a_batch_ends_at_its_last_delete(settings: Settings, tmp_path: Path) -> None:
    """Adds fetched behind a delete wait for the next batch (issue 29): the deltas message that
    carries the delete holds no add produced after it, and every add still arrives. With a large
    window and batch, the former window took all 81 records into one batch."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    before = [add(f"a{i}", "h1", "alice", f"s{i}", [1.0, float(i + 1)], i % 3) for i in range(40)]
    after = [add(f"a{i}", "h1", "alice", f"s{i}", [2.0, float(i + 1)], i % 3) for i in range(40, 80)]
    produce(s, [*before, delete("d10", "h1", "alice", "s10"), *after])  # one subject: one partition, in order
    reader = Reader(s)
    run = Running(s, group="fz-split", max_batch=1000, max_ms=2000)
    try:
        got = reader.until(lambda g: sum(len(plain_delta(m.value(), s.topic("deltas")).event_ids)
                                         for m in g["deltas"]) >= 81)
        assert run.stop() == 0
    finally:
        reader.close()
        run.stop_event.set()
    deltas = [plain_delta(m.value(), s.topic("deltas")) for m in got["deltas"]]
    (with_delete,) = [d for d in deltas if "d10" in d.event_ids]
    later = {f"a{i}" for i in range(40, 80)}
    assert not later & set(with_delete.event_ids)
    assert later <= {e for d in deltas for e in d.event_ids}


def test_a_delete_fetched_in_the_middle_of_a_window_closes_it(settings: Settings) -> None:
    """consume() returns only when full or timed out, so the window asks in short slices: a delete
    fetched half-way through a three-minute window ends the batch then, not at the window's end
    (before: the whole window). The bound below is a liveness check, not a measure of speed."""
    from confluent_kafka import Consumer

    from unlearn.streams.featurizer.batch_window import BatchWindow

    c = Consumer(consumer_config(settings, f"fz-window-{uuid.uuid4().hex[:6]}", **{"auto.offset.reset": "earliest"}))
    c.subscribe([settings.topic("requests")])
    produce(settings, [add("a1", "h1", "alice", "s1", [1.0, 2.0], 0)])
    window, stop = BatchWindow(max_batch=1000, max_ms=180_000), threading.Event()
    polled: list[list] = []

    def poll_once() -> None:
        polled.append(window.poll(c, stop, lambda: None))

    try:
        while not any(polled):  # the first poll that holds the add opens the window; the delete follows
            poller = threading.Thread(target=poll_once, daemon=True)
            poller.start()
            time.sleep(1.0)
            produce(settings, [delete("d1", "h1", "alice", "s1")])
            poller.join(60)
            assert not poller.is_alive(), "the delete did not close the window"
        (batch,) = [b for b in polled if b]
        assert [orjson.loads(m.value())["event_id"] for m in batch][-1] == "d1"
    finally:
        stop.set()
        c.close()


def test_the_window_lends_its_waits_and_a_delete_ends_them(settings: Settings) -> None:
    """While the window waits for adds it calls ``waiting`` between its slices (the processor
    settles the batch in flight there, off the next commit's path); once a delete is in, the batch
    closes without another call."""
    from confluent_kafka import Consumer

    from unlearn.streams.featurizer.batch_window import BatchWindow

    c = Consumer(consumer_config(settings, f"fz-waits-{uuid.uuid4().hex[:6]}", **{"auto.offset.reset": "earliest"}))
    c.subscribe([settings.topic("requests")])
    calls: list[float] = []
    window, stop = BatchWindow(max_batch=1000, max_ms=300, waiting=lambda: calls.append(time.monotonic())), \
        threading.Event()
    try:
        produce(settings, [add("a1", "h1", "alice", "s1", [1.0, 2.0], 0)])
        batch: list = []
        deadline = time.monotonic() + 60
        while not batch:
            assert time.monotonic() < deadline, "the add never came"
            batch = window.poll(c, stop, lambda: None)
        assert len(calls) >= 10  # a 300 ms window of 2 ms slices
        produce(settings, [delete("d1", "h1", "alice", "s1")])
        calls.clear()
        batch, polls = [], 0
        while not batch:
            assert time.monotonic() < deadline, "the delete never came"
            batch = window.poll(c, stop, lambda: None)
            polls += 1
        # one call per poll, before its first record (nothing in flight: one plain wait); none after
        assert [orjson.loads(m.value())["event_id"] for m in batch] == ["d1"] and len(calls) == polls
    finally:
        stop.set()
        c.close()


def test_the_window_settles_the_batch_in_flight_before_a_plain_wait(settings: Settings,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing polled and a batch in flight (``waiting`` answers true) the window waits for
    the first record in slices, asking ``waiting`` after each, until the batch is settled (then one
    plain wait) or ``SETTLE_WAIT_S`` is over (then it returns, and the idle turn settles): a lone
    delete does not pay for the settle of the batch before it, and a batch never answered does
    not keep the loop from its timers."""
    from confluent_kafka import Consumer

    from unlearn.streams.featurizer import batch_window
    from unlearn.streams.featurizer.batch_window import BatchWindow

    c = Consumer(consumer_config(settings, f"fz-settle-{uuid.uuid4().hex[:6]}", **{"auto.offset.reset": "earliest"}))
    c.subscribe([settings.topic("requests")])
    stop = threading.Event()
    try:
        calls: list[float] = []
        answered_at = 5

        def in_flight() -> bool:
            calls.append(time.monotonic())
            return len(calls) < answered_at

        window = BatchWindow(max_batch=1000, max_ms=300, waiting=in_flight)
        assert window.poll(c, stop, lambda: None) == []
        assert len(calls) == answered_at  # asked after each slice until settled, then no more

        # past SETTLE_WAIT_S a batch still in flight gets no more slices: one plain wait, then []
        never: list[bool] = []
        monkeypatch.setattr(batch_window, "SETTLE_WAIT_S", 0.0)
        window = BatchWindow(max_batch=1000, max_ms=300, waiting=lambda: never.append(True) or True)
        assert window.poll(c, stop, lambda: None) == []
        assert never == [True]
        monkeypatch.undo()

        produce(settings, [delete("d1", "h1", "alice", "s1")])  # fetched during the slices: taken at once
        calls.clear()
        answered_at = 10**9
        window = BatchWindow(max_batch=1000, max_ms=300, waiting=in_flight)
        batch: list = []
        deadline = time.monotonic() + 60
        while not batch:
            assert time.monotonic() < deadline, "the delete never came"
            batch = window.poll(c, stop, lambda: None)
        assert [orjson.loads(m.value())["event_id"] for m in batch] == ["d1"]
    finally:
        stop.set()
        c.close()


@pytest.mark.parametrize("crash_at", ["after_cache_commit", "after_changelog", "after_produce"])
def test_crash_recovery_through_the_outbox(settings: Settings, tmp_path: Path, crash_at: str) -> None:
    """Crash between the sqlite commit and the produce (nothing sent), between phase 0 and phase 1
    (txn and position durable, no output sent: the outbox holds phase 0 only, and the restart
    rebuilds phase 1 from its txn) or between the produce and the outbox ack (everything sent,
    then re-sent): the restarted featurizer re-produces the outbox, seeks past the cached offset,
    and the source-id rule gives the exact ledger."""
    s = settings.with_(data_dir=str(tmp_path / "data"))
    reqs, retained, accepted, reasons = workload()
    produce(s, reqs, traced=True)

    class Crash(Exception):
        pass

    def fault(point: str) -> None:
        if point == crash_at:
            raise Crash(point)

    first = Running(s, group="fz-crash", fault=fault, max_batch=16)
    assert isinstance(first.wait_dead(40), Crash)
    caches = list((tmp_path / "data" / "featurizer").glob("*/p*.sqlite"))
    assert caches, "the crashed batch was committed to the cache"
    rebuilt = pending_phase_one(s, caches)  # what the crashed batch's phase 1 was, from its outbox txn
    assert rebuilt  # every crash point here is before the outbox ack

    second = Running(s, group="fz-crash", max_batch=16)
    reader = Reader(s, ("deltas", "deadletter", "receipts", "featurizer-cache"))
    try:
        got = reader.until(lambda g: len(g["deadletter"]) >= len(reasons)
                           and set(accepted) <= set(ledgers_from(g["deltas"])[1]))
        time.sleep(0.5)  # anything else (there must be nothing) would arrive now
        got = reader.until(lambda g: True)
        assert second.stop() == 0
    finally:
        reader.close()
        second.stop_event.set()
    assert second.service.stats["replayed"] > 0
    dls = sorted(decode_deadletter(m.value()).reason for m in got["deadletter"])
    ledgers, events = ledgers_from(got["deltas"])
    for head in ("h1", "h2"):
        assert ledgers[head].digest() == reference(retained, head, ledgers[head].n_outputs)
    rows_expected = sorted(accepted + ["forget-s5"] * 2 + ["forget-s6"])  # one row per deleted sample
    assert sorted(events) == rows_expected
    # sealing draws random nonces, so "identical" is checked where it must hold: the re-sent phase 1
    # is the committed one, byte for byte (sealed rows, key ids, sample records), and the ledger exact
    # (a seed, the restart after "after_cache_commit" of a first batch, seals its snapshot anew: only
    # its downstream messages are the committed ones)
    sent = [(m.topic(), m.key(), m.value()) for n in ("deltas", "deadletter", "receipts", "featurizer-cache")
            for m in got[n]]
    copies = 2 if crash_at == "after_produce" else 1
    checked = [m for m in rebuilt if m.topic != s.topic("head-registry") and not (
        crash_at == "after_cache_commit" and m.topic == s.topic("featurizer-cache"))]
    assert checked  # every judged request gave a delta row or a dead letter
    for m in checked:
        assert sent.count((m.topic, m.key, m.value)) == copies, (m.topic, m.key)
    # the re-sent outputs keep their requests' trace context (the outbox and the txn keep headers)
    from unlearn.infra import tracing

    for m in rebuilt:
        if m.topic in (s.topic("deltas"), s.topic("receipts")):
            assert tracing.traceparent_of(m.headers) is not None, (m.topic, m.key)
    assert all(tracing.traceparent_of(m.headers()) is not None for m in got["deltas"])
    if crash_at != "after_produce":
        # nothing downstream was produced before the crash: every message exactly once, no re-judging
        assert dls == reasons
        assert sorted(ledgers_from(got["deltas"], dedup=False)[1]) == rows_expected
    else:
        # the first batch went out twice; deltas are skipped by source id, dead letters repeat
        assert "duplicate_add" not in set(dls) - set(reasons) and set(dls) == set(reasons)
        _, raw_events = ledgers_from(got["deltas"], dedup=False)
        if any(m.topic == s.topic("deltas") for m in checked):
            # the crashed batch held deltas (Apache Kafka may hand a first batch of dead letters and
            # receipts only: it answers a fetch as soon as one partition has data)
            assert len(raw_events) > len(events)  # without the rule the ledger would double count


def test_federated_site_sends_only_packed_statistics(settings: Settings, tmp_path: Path) -> None:
    site_topic = "requests.site-a"
    create_topics(settings, extra=[site_topic])
    s = settings.with_(data_dir=str(tmp_path / "data"))
    try:
        reqs, retained, accepted, reasons = workload(client="site-a")
        reqs.append(add("other", "h1", "s0", "zz", [1, 1, 1, 1], 0, client="site-b"))  # not this site's data
        produce(s, reqs, topic=s.topic(site_topic))
        reader = Reader(s)
        run = Running(s, group="fz-site-a", federated=True, client_id="site-a", requests_topic=s.topic(site_topic))
        try:
            got = reader.until(lambda g: len(g["deadletter"]) >= len(reasons) + 1
                               and set(accepted) <= set(ledgers_from(g["deltas"])[1]))
            assert run.stop() == 0
        finally:
            reader.close()
            run.stop_event.set()
        for m in got["deltas"]:
            d = decode_delta(m.value())
            assert all(isinstance(e, PackedEntry) for e in d.entries)  # never per-sample rows
            assert parse_source(d.source_id)[0] == "requests.site-a.by-head[site-a]"
        ledgers, _ = ledgers_from(got["deltas"])
        for head in ("h1", "h2"):
            assert ledgers[head].digest() == reference(retained, head, ledgers[head].n_outputs)
        dls = sorted(decode_deadletter(m.value()).reason for m in got["deadletter"])
        assert dls == sorted([*reasons, "wrong_client"])
    finally:
        delete_topics(settings, [settings.topic(site_topic)])


def pending_phase_one(settings: Settings, caches: list[Path]) -> list:
    """The phase-1 messages the crash left to deliver, rebuilt from the caches' outbox txns as the
    service rebuilds them (``delivery.outbox_messages``; empty when nothing is pending)."""
    from unlearn.streams.featurizer.changelog_records import PHASE_OUTPUT
    from unlearn.streams.featurizer.delivery import outbox_messages
    from unlearn.streams.featurizer.feature_cache import FeatureCache

    out = []
    for path in caches:
        with FeatureCache(path) as cache:
            rows = cache.pending_outbox()
            assert all(r.phase == 0 for r in rows)  # schema 4: the outbox keeps phase 0 only
            p = int(path.stem[1:])
            out += [m for m in outbox_messages(rows, settings.topic("featurizer-cache"), p) if m.phase == PHASE_OUTPUT]
    return out


def heads(settings: Settings, *argv: str) -> int:
    return main(["heads", argv[0], "--bootstrap", settings.bootstrap, "--prefix", settings.topic_prefix,
                 "--profile", settings.profile, *argv[1:]])


def test_declared_label_space_is_enforced_and_extend_grows_it(settings: Settings, tmp_path) -> None:
    """The featurizer service enforces the head registry, on the real broker: the label 100000 add
    is dead-lettered with its reason, and `unlearn heads extend` then admits a new class."""
    s = settings.with_(data_dir=str(tmp_path))
    assert heads(s, "create", "--head", "faces", "--dim", "4", "--classes", "3") == 0
    run = Running(s)
    reader = Reader(s)
    try:
        produce(s, [add("e1", "faces", "u", "x1", [1, 0, 0, 0], 100000),
                    add("e2", "faces", "u", "x2", [1, 0, 0, 0], 2),
                    add("e3", "faces", "u", "x3", [1, 0, 0, 0], 3),
                    add("e4", "auto", "u", "y1", [0, 1], 7)])
        got = reader.until(lambda g: len(g["deadletter"]) >= 2 and len(g["deltas"]) >= 2)
        dls = {d.event_id: d for d in (decode_deadletter(m.value()) for m in got["deadletter"])}
        assert {e: d.reason for e, d in dls.items()} == {"e1": "label_out_of_range", "e3": "label_out_of_range"}
        assert "0..2 (contract v1)" in dls["e1"].detail
        # each delta names the contract it was judged under: the head's columns, whatever labels came
        first = {d.head_id: d for d in (plain_delta(m.value(), m.topic()) for m in got["deltas"])}
        assert (first["faces"].n_classes, first["faces"].contract_version) == (3, 1)
        assert (first["auto"].n_classes, first["auto"].contract_version) == (HeadSettings.of(s).default_classes, 1)
        # the undeclared head was auto-created, its contract published with its first delta
        deadline = time.monotonic() + 20
        while "auto" not in (contracts := read_contracts(s)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (contracts["auto"].origin, contracts["auto"].n_classes) == ("auto", HeadSettings.of(s).default_classes)
        assert heads(s, "extend", "--head", "faces", "--classes", "4") == 0
        while run.service.registry is None or run.service.registry.get("faces").version < 2:  # type: ignore[union-attr]
            assert time.monotonic() < deadline + 20
            time.sleep(0.05)
        produce(s, [add("e5", "faces", "u", "x3", [1, 0, 0, 0], 3)])
        got = reader.until(lambda g: len(g["deltas"]) >= 3)
        last = plain_delta(got["deltas"][-1].value(), got["deltas"][-1].topic())
        assert (last.head_id, int(last.entries[0].labels[0])) == ("faces", 3)
        assert (last.n_classes, last.contract_version) == (4, 2)
    finally:
        reader.close()
        assert run.stop() == 0
