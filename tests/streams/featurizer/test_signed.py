"""Signed requests on a REAL broker (issue 10, authorisation): a featurizer in
``UNLEARN_AUTH_MODE=signed`` accepts requests signed by registered clients, through the SDK and
through a raw confluent-kafka producer with Java's partitioner, and refuses every other one with
a dead letter and, for deletes its client's valid key vouches for, a rejected receipt naming the
reason. Also ``unlearn clients``."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.streams.featurizer.test_auth import hostile_corpus
from tests.streams.featurizer.test_service import Reader, Running, ledgers_from
from unlearn.common.registry import publish_client, read_clients
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import producer_config
from unlearn.schemas.client_record import ClientKey, ClientRecord
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.receipts import decode_receipt
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.schemas.signature import Signer
from unlearn.services.cli import main
from unlearn.services.client.sdk import UnlearnClient
from unlearn.streams.featurizer.auth import NO_RECEIPT_REASONS

pytestmark = pytest.mark.broker

HEAD = "signed-h"


def signer(key_id: str) -> Signer:
    return Signer(Ed25519PrivateKey.generate(), key_id)


def register(s: Settings, client: str, signers: list[Signer], heads: tuple[str, ...] = ("*",),
             **kw: Any) -> ClientRecord:
    rec = ClientRecord(client, 1, tuple(ClientKey(g.key_id, g.public_key) for g in signers), heads, **kw)
    publish_client(s, rec)
    return rec


class Raw:
    """A raw confluent-kafka producer with Java's partitioner: what a non-SDK app does."""

    def __init__(self, s: Settings) -> None:
        self.topic = s.topic("requests")
        self.p = Producer(producer_config(s, partitioner="murmur2_random"))

    def send(self, r: Request, g: Signer | None, *, value: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> tuple[bytes, list[tuple[str, bytes]]]:
        v = value if value is not None else encode_request(r)
        h = headers if headers is not None else (g.headers(v) if g else [])
        self.p.produce(self.topic, v, r.subject_id.encode(), headers=h)
        return v, h

    def flush(self) -> None:
        assert self.p.flush(30) == 0


def feat(ev: str, op: str, client: str, subject: str, sample: str | None = None, head: str = HEAD,
         ts: float | None = None) -> Request:
    now = time.time() if ts is None else ts
    if op == "add":
        return Request(ev, "add", head, client, subject, sample, 1, FeaturesInput((0.5, -0.5, 0.25, 1.0)), now)
    if op == "delete":
        return Request(ev, "delete", head, client, subject, sample, ts=now)
    return Request(ev, "delete_subject", head, client, subject, ts=now)


def test_signed_mode_accepts_signed_requests_and_refuses_the_rest(settings: Settings, tmp_path: Path) -> None:
    s = settings.with_(data_dir=str(tmp_path / "data"), auth_mode="signed")
    alice, alice_old, bob, admin, slow, gone = (signer(k) for k in ("a1", "a0", "b1", "adm", "sl", "g1"))
    register(s, "alice", [alice, alice_old], (HEAD,))
    publish_client(s, read_clients(s)["alice"].revoke("a0"))
    register(s, "bob", [bob])
    register(s, "admin", [admin], may_delete_others=True)
    register(s, "slow", [slow], rate_per_second=0.001, burst=2)
    publish_client(s, register(s, "gone", [gone]).revoke())
    raw = Raw(s)
    sdk_alice = UnlearnClient(s, "alice", signer=alice)
    sdk_bob = UnlearnClient(s.with_(client_id="bob"), signer=bob)
    unsigned = UnlearnClient(s, "alice")
    running = Running(s, group="fz-signed")
    reader = Reader(s)
    try:
        # phase 1: accepted adds, by the SDK (signed) and by a raw murmur2 producer (signed)
        for i in (1, 2, 3):
            sdk_alice.send(feat(f"add-{i}", "add", "alice", "sa", f"x{i}"))
        add4 = raw.send(feat("add-4", "add", "alice", "sa", "x4"), alice)
        sdk_bob.send(feat("add-5", "add", "bob", "sb", "x5"))
        raw.flush()
        sdk_alice.flush(30)
        sdk_bob.flush(30)
        adds = {"add-1", "add-2", "add-3", "add-4", "add-5"}
        reader.until(lambda g: adds <= set(ledgers_from(g["deltas"])[1]), timeout=60)

        # phase 2: one delete per refusal, each naming a sample that exists (x1 of subject sa)
        carol = signer("c1")
        expected: dict[str, str] = {}

        def refused(ev: str, reason: str) -> Request:
            expected[ev] = reason
            return feat(ev, "delete", "alice", "sa", "x1")

        unsigned.send(refused("d-unsigned", "unsigned"))
        r = refused("d-bad-signature", "bad_signature")
        raw.send(r, None, headers=alice.headers(encode_request(feat("other", "delete", "alice", "sa", "x1"))))
        expected["d-carol"] = "unknown_client"
        raw.send(feat("d-carol", "delete", "carol", "sa", "x1"), carol)
        raw.send(refused("d-unknown-key", "unknown_key"), Signer(alice.private_key, "nope"))
        raw.send(refused("d-revoked-key", "revoked_key"), alice_old)
        expected["d-gone"] = "revoked_client"
        raw.send(feat("d-gone", "delete", "gone", "sa", "x1"), gone)
        expected["d-head"] = "head_not_allowed"
        raw.send(feat("d-head", "delete", "alice", "sa", "x1", head="elsewhere"), alice)
        expected["d-stale"] = "stale_request"
        raw.send(feat("d-stale", "delete", "alice", "sa", "x1", ts=time.time() - 3600), alice)
        expected["d-bob"] = "not_owner"  # bob deletes alice's sample: no right to
        raw.send(feat("d-bob", "delete", "bob", "sa", "x1"), bob)
        expected["d-bob-subject"] = "not_owner"
        sdk_bob.send(feat("d-bob-subject", "delete_subject", "bob", "sa"))
        tombstoned = {"d-slow-0", "d-slow-1"}  # burst 2: two judged (nothing to remove: tombstoned) ...
        for i in range(4):
            if i >= 2:
                expected[f"d-slow-{i}"] = "rate_limited"  # ... two rate limited
            raw.send(feat(f"d-slow-{i}", "delete", "slow", "sl", f"nothing-{i}"), slow)
        # accepted deletes: alice her own sample (raw producer), admin bob's (may_delete_others)
        del4 = raw.send(feat("d-alice-4", "delete", "alice", "sa", "x4"), alice)
        raw.send(feat("d-admin-5", "delete", "admin", "sb", "x5"), admin)
        raw.flush()
        unsigned.flush(30)
        sdk_bob.flush(30)
        applied = {"d-alice-4", "d-admin-5"}
        reader.until(lambda g: applied <= set(ledgers_from(g["deltas"])[1])
                     and len(g["deadletter"]) >= len(expected), timeout=60)

        # phase 3: replays of accepted requests, the exact bytes and headers again, and the
        # corpus of hostile signature headers (each refused; the worker keeps going)
        raw.send(feat("add-4", "add", "alice", "sa", "x4"), None, value=add4[0], headers=add4[1])
        raw.send(feat("d-alice-4", "delete", "alice", "sa", "x4"), None, value=del4[0], headers=del4[1])
        corpus = hostile_corpus(alice, time.time(), head=HEAD)
        for _, value, hdrs in corpus:
            raw.p.produce(raw.topic, value, b"k", headers=hdrs)
        raw.flush()
        got = reader.until(lambda g: len(g["deadletter"]) >= len(expected) + 2 + len(corpus), timeout=60)
        time.sleep(0.5)
        got = reader.until(lambda g: True)

        reasons: dict[str, list[str]] = {}
        for m in got["deadletter"]:
            d = decode_deadletter(m.value())
            reasons.setdefault(d.event_id or "", []).append(d.reason)
        hostile = sorted(reasons.pop(f"h{i}", [""])[0] for i in range(1, 12) if i != 7)
        assert sorted(reasons.pop("", [])) == ["not_json"]
        assert hostile == sorted(r for r, _, _ in corpus if r != "not_json")
        assert reasons == {**{ev: [r] for ev, r in expected.items()},
                           "add-4": ["replayed"], "d-alice-4": ["replayed"]}
        receipts: dict[str, list[tuple[str, str | None]]] = {}
        for m in got["receipts"]:
            rc = decode_receipt(m.value())
            receipts.setdefault(rc.event_id, []).append((rc.status, rc.reason))
        # every refused delete a valid key vouches for has its rejected receipt; an unauthenticated
        # one has none (nobody may answer another client's event id), nor has a replay
        assert receipts == {**{ev: [("rejected", r)] for ev, r in expected.items() if r not in NO_RECEIPT_REASONS},
                            **{ev: [("tombstoned", None)] for ev in tombstoned}}
        assert {r for ev, r in expected.items() if ev not in receipts} == {
            "unsigned", "bad_signature", "unknown_client", "unknown_key", "revoked_key", "revoked_client"}
        _, events = ledgers_from(got["deltas"], dedup=False)
        assert sorted(events) == sorted(adds | applied)

        # phase 4: a revocation while the featurizer runs takes effect for what it judges next
        publish_client(s, read_clients(s)["alice"].revoke("a1"))
        time.sleep(1.0)  # the registry follower polls every 0.1 s
        n_dl = len(got["deadletter"])
        raw.send(feat("d-after-revoke", "delete", "alice", "sa", "x2"), alice)
        raw.flush()
        got = reader.until(lambda g: len(g["deadletter"]) > n_dl, timeout=60)
        assert decode_deadletter(got["deadletter"][-1].value()).reason == "revoked_key"
        assert running.stop() == 0
    finally:
        running.stop_event.set()
        reader.close()
        for c in (sdk_alice, sdk_bob, unsigned):
            c.close()


def test_unlearn_clients_cli(settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    def clients(*argv: str) -> tuple[int, str, str]:
        broker = [] if argv[0] == "keygen" else ["--bootstrap", settings.bootstrap, "--prefix",
                                                 settings.topic_prefix, "--profile", settings.profile]
        rc = main(["clients", argv[0], *broker, *argv[1:]])
        out = capsys.readouterr()
        return rc, out.out, out.err

    key = tmp_path / "alice.pem"
    rc, out, _ = clients("keygen", "--out", str(key))
    assert rc == 0 and "key_id=ed25519:" in out
    key_id = Signer.from_file(key).key_id
    assert clients("keygen", "--out", str(key))[0] == 1  # never overwritten
    rc, out, _ = clients("create", "--client", "alice", "--key-file", str(key), "--heads", "h1,h2", "--rate", "5",
                         "--burst", "10", "--json")
    assert rc == 0
    doc = orjson.loads(out)
    assert (doc["client_id"], doc["version"], doc["heads"], doc["keys"][0]["key_id"], doc["rate_per_second"],
            doc["burst"], doc["may_delete_others"]) == ("alice", 1, ["h1", "h2"], key_id, 5.0, 10, False)
    assert clients("create", "--client", "alice", "--key-file", str(key), "--heads", "*")[0] == 1
    other = Signer(Ed25519PrivateKey.generate())
    rc, out, _ = clients("add-key", "--client", "alice", "--public-key", base64.b64encode(other.public_key).decode(),
                         "--key-id", "k2")
    assert rc == 0 and "v2" in out and "k2" in out
    rc, out, _ = clients("revoke", "--client", "alice", "--key-id", key_id)
    assert rc == 0 and f"{key_id} (revoked)" in out
    rc, out, _ = clients("revoke", "--client", "alice")
    assert rc == 0 and "REVOKED" in out
    assert clients("revoke", "--client", "nobody")[0] == 1
    rc, out, _ = clients("show", "--client", "alice", "--json")
    assert rc == 0 and orjson.loads(out)["version"] == 4 and orjson.loads(out)["revoked"] is True
    rc, out, _ = clients("list")
    assert rc == 0 and len(out.splitlines()) == 1
    assert read_clients(settings)["alice"].version == 4
    # the CLI client signs with --key-file (no featurizer runs here to publish a transit key: plaintext)
    monkeypatch.setenv("UNLEARN_TRANSIT_SEAL", "off")
    assert main(["add", "--bootstrap", settings.bootstrap, "--prefix", settings.topic_prefix, "--profile",
                 settings.profile, "--head", "h1", "--subject", "s", "--sample", "x", "--label", "0", "--features",
                 "1,0", "--client-id", "alice", "--key-file", str(key)]) == 0
    got = Reader(settings, ("requests",))
    try:
        msgs = got.until(lambda g: len(g["requests"]) >= 1)["requests"]
        assert dict(msgs[0].headers())["unlearn-sig-key"] == key_id.encode()
    finally:
        got.close()


def test_ownership_survives_a_restart_on_an_empty_host_and_the_window_does_not(settings: Settings,
                                                                               tmp_path: Path) -> None:
    """Who added a sample is in the cache and its changelog, so a featurizer rebuilt on another
    host still refuses bob's delete of alice's sample; the replay window is in memory only, so a
    replayed add after the restart is no longer ``replayed`` (the cache refuses it as a
    ``duplicate_add``), as docs/security.md says."""
    s = settings.with_(data_dir=str(tmp_path / "host-1"), auth_mode="signed")
    alice, bob = signer("a1"), signer("b1")
    register(s, "alice", [alice])
    register(s, "bob", [bob])
    raw = Raw(s)
    reader = Reader(s)
    running = Running(s, group="fz-restart")
    try:
        add = raw.send(feat("add-1", "add", "alice", "sa", "x1"), alice)
        raw.flush()
        reader.until(lambda g: "add-1" in ledgers_from(g["deltas"])[1], timeout=60)
        raw.send(feat("add-1", "add", "alice", "sa", "x1"), None, value=add[0], headers=add[1])
        raw.flush()
        reader.until(lambda g: len(g["deadletter"]) >= 1, timeout=60)
        assert running.stop() == 0
        moved = s.with_(data_dir=str(tmp_path / "host-2"))  # an empty data dir: the cache comes from the changelog
        running = Running(moved, group="fz-restart")
        raw.send(feat("add-1", "add", "alice", "sa", "x1"), None, value=add[0], headers=add[1])
        raw.send(feat("bob-del", "delete", "bob", "sa", "x1"), bob)
        raw.flush()
        got = reader.until(lambda g: len(g["deadletter"]) >= 3, timeout=90)
        reasons = [decode_deadletter(m.value()).reason for m in got["deadletter"]]
        assert reasons == ["replayed", "duplicate_add", "not_owner"]
        assert running.stop() == 0
    finally:
        running.stop_event.set()
        reader.close()
