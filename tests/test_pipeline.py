"""The whole pipeline on a real broker: requests -> featurizer -> deltas -> ledger -> heads.

End to end exactness with several clients and heads, kill -9 of both workers mid-stream, and a
corpus of malformed requests that must each land in deadletter without touching the ledger."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.ledger import ExactLedger, Quantizer, l2_normalize, solve_head
from unlearn.runtime.clients import consumer_config, producer_config
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.services.client.head_reader import wait_for_head
from unlearn.services.verifier import verify_broker

pytestmark = pytest.mark.broker


class World:
    """Requests over several heads/clients/subjects, with the retained set as ground truth."""

    def __init__(self, heads: dict[str, int], seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.dims = heads
        # sample -> (subject, f, y)
        self.live: dict[str, dict[str, tuple[str, np.ndarray, int]]] = {h: {} for h in heads}
        self.n = 0
        self.requests: list[tuple[bytes, bytes]] = []
        # Event times 1 ms apart in the order the world decided them, as an app stamps its events:
        # remove wins in event time, and a tie goes to the delete, so a delete_subject and a later
        # add of that subject produced within one millisecond without `ts` would refuse the add.
        self.t0 = time.time()

    def _emit(self, subject: str, body: dict) -> None:
        self.n += 1
        body = {"schema": "unlearn.request/v1", "event_id": f"ev{self.n}", "client_id": f"client{self.n % 3}",
                "subject_id": subject, "ts": self.t0 + self.n / 1000, **body}
        self.requests.append((subject.encode(), orjson.dumps(body)))

    def step(self) -> None:
        h = list(self.dims)[int(self.rng.integers(len(self.dims)))]
        live = self.live[h]
        roll = self.rng.random()
        if live and roll < 0.25:
            sample = sorted(live)[int(self.rng.integers(len(live)))]
            subject = live.pop(sample)[0]
            self._emit(subject, {"op": "delete", "head_id": h, "sample_id": sample})
        elif live and roll < 0.30:
            subject = live[sorted(live)[int(self.rng.integers(len(live)))]][0]
            for s in [s for s, v in live.items() if v[0] == subject]:
                del live[s]
            self._emit(subject, {"op": "delete_subject", "head_id": h})
        else:
            f = self.rng.normal(size=self.dims[h])
            y = int(self.rng.integers(0, 4))
            subject = f"user{int(self.rng.integers(0, 15))}"
            sample = f"{h}-s{self.n}"
            live[sample] = (subject, f, y)
            self._emit(subject, {"op": "add", "head_id": h, "sample_id": sample, "label": y,
                                 "input": {"kind": "features", "values": f.tolist()}})

    def take(self) -> list[tuple[bytes, bytes]]:
        out, self.requests = self.requests, []
        return out

    def reference(self, h: str, frac_bits: int, n_classes: int) -> ExactLedger:
        """From scratch, given the head's contract: its class count sizes the label columns."""
        led = ExactLedger(self.dims[h], n_classes, frac_bits)
        if self.live[h]:
            F = np.stack([f for _, f, _ in self.live[h].values()])
            led.add(Quantizer(frac_bits).quantize(l2_normalize(F)), np.array([y for _, _, y in self.live[h].values()]))
        return led


def produce(s: Settings, msgs: list[tuple[bytes, bytes]]) -> None:
    p = Producer(producer_config(s))
    for key, value in msgs:
        p.produce(s.topic("requests"), key=key, value=value)
    assert p.flush(30) == 0


def services(s: Settings, tmp_path: Path) -> tuple[ServiceProcess, ServiceProcess]:
    return (ServiceProcess("featurizer", ["featurizer"], s, tmp_path / "logs").start(),
            ServiceProcess("ledger", ["ledger"], s, tmp_path / "logs").start())


def pipeline_settings(settings: Settings, tmp_path: Path) -> Settings:
    return settings.with_(data_dir=str(tmp_path / "data"), checkpoint_every_messages=5, checkpoint_every_seconds=1.0,
                          reset_every_seconds=1.0, batch_max_ms=30)


def assert_heads_equal_reference(s: Settings, world: World, timeout: float = 120.0) -> None:
    heads = HeadSettings.of(s)
    for h in world.dims:
        ref = world.reference(h, heads.frac_bits, heads.default_classes)  # the auto contract's label space
        got = wait_for_head(s, h, lambda u, ref=ref: u.digest == ref.digest() and u.mode == "exact", timeout=timeout)
        assert got.n_retained == ref.count and got.contract_version == 1
        assert got.weights.shape == (world.dims[h], heads.default_classes)  # never the largest label seen + 1
        assert np.array_equal(np.asarray(got.weights), solve_head(ref, heads.gamma_for(h)))


def test_requests_to_heads_end_to_end(settings: Settings, tmp_path: Path) -> None:
    s = pipeline_settings(settings, tmp_path).with_(head_gammas="wide=0.25")
    world = World({"narrow": 8, "wide": 24, "third": 5}, seed=11)
    feat, led = services(s, tmp_path)
    try:
        for _ in range(300):
            world.step()
        produce(s, world.take())
        assert_heads_equal_reference(s, world)
        for h in world.dims:  # the verifier certifies each head, remove-wins re-judged included
            cert = verify_broker(s, h, orders=1, partitionings=1, seed=1)
            assert cert.ok and {c.name: c.status for c in cert.checks}["remove_wins"] == "pass", cert.summary()
    finally:
        feat.stop()
        led.stop()
    assert feat.proc.returncode == 0, feat.log_tail()
    assert led.proc.returncode == 0, led.log_tail()


def test_kill_minus_nine_featurizer_and_ledger_mid_stream(settings: Settings, tmp_path: Path) -> None:
    s = pipeline_settings(settings, tmp_path)
    world = World({"h": 10, "g": 6}, seed=12)
    rng = np.random.default_rng(13)
    feat, led = services(s, tmp_path)
    try:
        for round_ in range(4):
            for _ in range(int(rng.integers(60, 140))):
                world.step()
            produce(s, world.take())
            time.sleep(float(rng.uniform(0.5, 5.0)))
            victims = [feat, led] if round_ % 2 == 0 else ([feat] if round_ == 1 else [led])
            for v in victims:
                v.kill9()
            time.sleep(float(rng.uniform(0.0, 1.0)))
            for v in victims:
                v.start()
        for _ in range(40):
            world.step()
        produce(s, world.take())
        assert_heads_equal_reference(s, world, timeout=180)
    finally:
        feat.stop()
        led.stop()


def _malformed(head: str) -> list[tuple[str, bytes]]:
    """(expected reason prefix, request bytes): at least 20 kinds of bad input."""
    ok = {"schema": "unlearn.request/v1", "event_id": "e", "op": "add", "head_id": head, "client_id": "c",
          "subject_id": "u", "sample_id": "x", "label": 1, "input": {"kind": "features", "values": [0.1, 0.2, 0.3]}}

    def mut(**kw: object) -> bytes:
        d = dict(ok)
        for k, v in kw.items():
            if v is None:
                d.pop(k, None)
            else:
                d[k] = v
        return orjson.dumps(d)

    return [
        ("not_json", b"{not json"),
        ("not_json", b"\xff\xfe\x00"),
        ("not_object", b"[1, 2, 3]"),
        ("unknown_schema_version", mut(schema="unlearn.request/v9")),
        ("missing_field:event_id", mut(event_id=None)),
        ("missing_field:head_id", mut(head_id=None)),
        ("bad_op", mut(op="erase")),
        ("unknown_field:extra", mut(extra=1)),
        ("bad_label", mut(label=-3)),
        ("bad_label", mut(label="cat")),
        ("bad_input_kind", mut(input={"kind": "audio", "data": "AAAA"})),
        ("bad_features", mut(input={"kind": "features", "values": []})),
        ("bad_features", mut(input={"kind": "features", "values": ["a", 1]})),
        ("bad_base64", mut(input={"kind": "image", "format": "png", "data": "!!!notbase64"})),
        ("bad_image_format", mut(input={"kind": "image", "format": "gif", "data": "AAAA"})),
        ("bad_text", mut(input={"kind": "text", "text": ""})),
        ("bad_field:subject_id", mut(subject_id="")),
        ("unexpected_field:label",
         orjson.dumps({**{k: v for k, v in ok.items() if k not in ("input",)}, "op": "delete"})),
        ("dimension_mismatch", mut(event_id="dim", sample_id="dim", input={"kind": "features", "values": [0.1] * 4})),
        ("duplicate_add", mut(event_id="dup", sample_id="base0")),
        # dated beyond the clock-skew bound (it could outlive deletes), or before the tombstone
        # retention (a tombstone that would refuse it may be gone); deletes of samples or subjects
        # never seen are no refusal: they leave a tombstone (docs/featurizer.md "Remove wins")
        ("ts_in_future", mut(event_id="fut", sample_id="fut", ts=time.time() + 86_400)),
        ("event_too_old", mut(event_id="old", sample_id="old", ts=time.time() - 30 * 86_400)),
        ("undecodable_input", mut(event_id="png", sample_id="png", head_id=head + "-img",
                                  input={"kind": "image", "format": "png",
                                         "data": base64.b64encode(b"not a png").decode()})),
        ("label_mismatch", mut(event_id="lm", sample_id="lm", label=[0.0, 1.0])),
        ("bad_ts", mut(ts=-5)),
    ]


def test_malformed_requests_go_to_deadletter_and_change_nothing(settings: Settings, tmp_path: Path) -> None:
    s = pipeline_settings(settings, tmp_path)
    head = "victim"
    rng = np.random.default_rng(5)
    base = [(b"u", orjson.dumps({"schema": "unlearn.request/v1", "event_id": f"b{i}", "op": "add", "head_id": head,
                                "client_id": "c", "subject_id": "u", "sample_id": f"base{i}", "label": i % 3,
                                "input": {"kind": "features", "values": rng.normal(size=3).tolist()}}))
            for i in range(20)]
    corpus = _malformed(head)
    assert len({r for r, _ in corpus}) >= 20
    feat, led = services(s, tmp_path)
    try:
        produce(s, base)
        first = wait_for_head(s, head, lambda u: u.n_retained == 20, timeout=90)
        produce(s, [(b"u", raw) for _, raw in corpus] + base[:0])
        # a last good request proves the workers kept running after the corpus
        produce(s, [(b"u", orjson.dumps({"schema": "unlearn.request/v1", "event_id": "last", "op": "delete",
                                         "head_id": head, "client_id": "c", "subject_id": "u", "sample_id": "base0"}))])
        after = wait_for_head(s, head, lambda u: u.n_retained == 19 and u.mode == "exact", timeout=90)
        reasons = read_deadletter_reasons(s, expect=len(corpus), timeout=60)
        for want, _ in corpus:
            assert any(r.startswith(want) for r in reasons), f"no deadletter with reason {want!r}: {sorted(reasons)}"
        # the ledger holds exactly the good requests: 20 adds minus one delete
        ref = ExactLedger(3, HeadSettings.of(s).default_classes)  # the auto contract's class count sizes the head
        kept = [orjson.loads(v) for _, v in base[1:]]
        ref.add(Quantizer().quantize(l2_normalize(np.array([k["input"]["values"] for k in kept]))),
                np.array([k["label"] for k in kept]))
        assert after.digest == ref.digest() and first.n_retained == 20
        assert feat.alive and led.alive
    finally:
        feat.stop()
        led.stop()


def read_deadletter_reasons(s: Settings, expect: int, timeout: float) -> list[str]:
    c = Consumer(consumer_config(s, f"{s.topic_prefix}dl-reader"))
    topic = s.topic("deadletter")
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    reasons: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(reasons) < expect:
        m = c.poll(0.5)
        if m is not None and not m.error():
            reasons.append(decode_deadletter(m.value()).reason)
    c.close()
    return reasons
