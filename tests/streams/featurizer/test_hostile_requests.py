"""Every request means one thing, on a REAL broker (issue 36): a plain producer's hostile requests.

- Two adds under one event id (rp-a and rp-b, labels 0 and 1, both ``replay-1``), from two
  producers on two ``requests`` partitions: the first is taken, the other refused
  ``event_id_conflict``; a resend is a ``duplicate_event`` without a second receipt; after the
  partitions move to another host (an empty data dir: the memory comes back from the changelog)
  the id is still taken.
- Vectors with no information (d = 8 of 0.0, of -0.0, of 5e-324): ``zero_norm_feature``.
- A decompression bomb (a real 8000 x 8000 PNG of zeros, ~180 KB on the wire): ``image_too_large``,
  refused from its header, and the worker goes on.

Each run is then certified by the verifier's replay of what the featurizer wrote.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from confluent_kafka import Producer

from tests.services.verifier.test_remove_wins import certify_messages
from tests.streams.featurizer.test_remove_wins import assert_head_is, receipts_of, settle
from tests.streams.featurizer.test_service import Reader, Running, ledgers_from
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import producer_config
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.request_inputs import FeaturesInput, ImageInput

pytestmark = pytest.mark.broker

HEAD = "rw"  # assert_head_is reads this head
DIM = 4


def features(seed: int) -> tuple[float, ...]:
    return tuple(float(x) for x in np.random.default_rng(seed).normal(size=DIM))


def add(ev: str, sample: str, seed: int, label: int, head: str = HEAD, ts: float | None = None) -> Request:
    return Request(ev, "add", head, "app", "alice", sample, label, FeaturesInput(features(seed)), ts)


def send(producer: Producer, s: Settings, partition: int, *reqs: Request | bytes) -> None:
    for r in reqs:
        producer.produce(s.topic("requests"), r if isinstance(r, bytes) else encode_request(r), partition=partition)
    assert producer.flush(30) == 0


def reasons_by_event(got: dict[str, list]) -> list[tuple[str, str]]:
    return sorted((d.event_id or "", d.reason) for d in (decode_deadletter(m.value()) for m in got["deadletter"]))


def assert_certified(got: dict[str, list], head: str) -> None:
    cert = certify_messages(got, head)
    names = {c.name: c.status for c in cert.checks}
    assert cert.ok and "event_ids" not in names, cert.summary()


def test_one_event_id_one_request_across_partitions_producers_and_hosts(settings: Settings, tmp_path: Path) -> None:
    s_a = settings.with_(data_dir=str(tmp_path / "host-a"))
    s_b = settings.with_(data_dir=str(tmp_path / "host-b"))
    app, other = Producer(producer_config(settings)), Producer(producer_config(settings))
    reader = Reader(settings)
    t0 = time.time() - 60
    a = Running(s_a, group="ev-ids")
    b: Running | None = None
    try:
        assert a.service.ready.wait(60)
        send(app, settings, 0, add("replay-1", "rp-a", 1, 0, ts=t0), add("keep-1", "k1", 2, 1, ts=t0))
        reader.until(lambda g: "replay-1" in ledgers_from(g["deltas"])[1], timeout=60)
        send(other, settings, 1,
             add("replay-1", "rp-b", 3, 1, ts=t0 + 1),  # the reported case: another sample and label
             add("replay-1", "rp-a", 1, 0, ts=t0 + 2),  # a resend of the first: its sample is cached
             Request("del-1", "delete", HEAD, "app", "alice", "k1", ts=t0 + 3),
             Request("del-2", "delete", HEAD, "app", "alice", "never", ts=t0 + 3))
        reader.until(lambda g: "del-2" in receipts_of(g) and "del-1" in ledgers_from(g["deltas"])[1], timeout=60)
        send(app, settings, 0, Request("del-1", "delete", HEAD, "app", "alice", "k1", ts=t0 + 4),  # resends
             Request("del-2", "delete", HEAD, "app", "alice", "never", ts=t0 + 4))
        reader.until(lambda g: len(g["deadletter"]) >= 4, timeout=60)
        b = Running(s_b, group="ev-ids")  # another host, an empty data dir
        assert b.service.ready.wait(60)
        assert a.stop() == 0  # every partition moves to b, which rebuilds its cache from the changelog
        send(other, settings, 1,
             add("replay-1", "rp-c", 4, 0, ts=t0 + 5),  # still taken on the new host
             add("keep-1", "k1", 2, 1, ts=t0 + 6),  # the deleted add's id: its meaning was erased
             add("fresh-1", "k1", 2, 1, ts=t0 + 7))  # a re-add under a new id enters
        reader.until(lambda g: len(g["deadletter"]) >= 6 and "fresh-1" in ledgers_from(g["deltas"])[1], timeout=90)
        got = settle(reader, b)  # and nothing more
    finally:
        reader.close()
        a.stop_event.set()
        if b is not None:
            b.stop_event.set()
    assert reasons_by_event(got) == [("del-1", "duplicate_event"), ("del-2", "duplicate_event"),
                                     ("keep-1", "event_id_erased"), ("replay-1", "duplicate_add"),
                                     ("replay-1", "event_id_conflict"), ("replay-1", "event_id_conflict")]
    # one receipt: del-2's tombstoned one (del-1's applied receipt is the ledger's; none ran here); the
    # resends got none of their own
    assert [(r.event_id, r.status) for r in receipts_of(got).values()] == [("del-2", "tombstoned")]
    assert len(got["receipts"]) == 1
    assert_head_is(got, settings, {"rp-a": (features(1), 0), "k1": (features(2), 1)})  # k1: fresh-1's
    assert_certified(got, HEAD)


def test_vectors_with_no_information_and_repeated_keys_are_refused(settings: Settings, tmp_path: Path) -> None:
    s = settings.with_(data_dir=str(tmp_path / "data"))
    producer = Producer(producer_config(settings))
    reader = Reader(settings)
    run = Running(s, group="ev-zero")

    def raw(ev: str, values: str) -> bytes:  # JSON as a plain producer writes it (-0.0 and 5e-324 verbatim)
        return (b'{"schema": "unlearn.request/v1", "event_id": "%s", "op": "add", "head_id": "%s", '
                b'"client_id": "app", "subject_id": "alice", "sample_id": "%s", "label": 0, '
                b'"input": {"kind": "features", "values": [%s]}}'
                % (ev.encode(), HEAD.encode(), ev.encode(), ",".join([values] * 8).encode()))
    try:
        assert run.service.ready.wait(60)
        twice = raw("twice", "0.5")[:-1] + b', "head_id": "elsewhere"}'  # which head? parsers disagree
        escaped = raw("escaped", "0.5")[:-1] + b', "head\\u005fid": "elsewhere"}'
        send(producer, settings, 0, raw("zeros", "0.0"), raw("neg-zeros", "-0.0"), raw("subnormal", "5e-324"),
             twice, escaped, raw("ok", "0.5"))
        got = reader.until(lambda g: len(g["deadletter"]) >= 5 and "ok" in ledgers_from(g["deltas"])[1], timeout=60)
        assert run.stop() == 0
    finally:
        reader.close()
        run.stop_event.set()
    assert reasons_by_event(got) == [("", "duplicate_key"), ("", "duplicate_key"), ("neg-zeros", "zero_norm_feature"),
                                     ("subnormal", "zero_norm_feature"), ("zeros", "zero_norm_feature")]
    ledger = ledgers_from(got["deltas"])[0][HEAD]
    assert ledger.count == 1  # no zero row counts in n_retained
    assert_certified(got, HEAD)


def test_a_decompression_bomb_is_refused_from_its_header(settings: Settings, tmp_path: Path) -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (8000, 8000)).save(buf, format="PNG", optimize=False, compress_level=9)
    bomb = buf.getvalue()
    assert len(bomb) < 400_000  # small on the wire, 64 megapixels decoded
    s = settings.with_(data_dir=str(tmp_path / "data"))
    producer = Producer(producer_config(settings))
    reader = Reader(settings)
    run = Running(s, group="ev-bomb")
    try:
        assert run.service.ready.wait(60)
        send(producer, settings, 0,
             encode_request(Request("bomb", "add", "imgs", "app", "alice", "b1", 0, ImageInput(bomb))),
             encode_request(add("after", "x1", 1, 0)))  # the worker goes on
        got = reader.until(lambda g: g["deadletter"] and "after" in ledgers_from(g["deltas"])[1], timeout=60)
        assert run.stop() == 0
    finally:
        reader.close()
        run.stop_event.set()
    [dl] = [decode_deadletter(m.value()) for m in got["deadletter"]]
    assert (dl.event_id, dl.reason) == ("bomb", "image_too_large")
    assert "64000000 pixels" in dl.detail and "UNLEARN_MAX_IMAGE_PIXELS=4000000" in dl.detail
    assert orjson.loads(dl.original)["input"] == {"kind": "image", "redacted": True}
