"""The verifier re-judges remove-wins (``services/verifier/remove_wins.py``): the deltas carry each
row's event time, the replay rebuilds the tombstones from the delete rows and the ``tombstoned``
receipts, and a retained add dated at or before one of them fails the certificate."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.streams.featurizer.test_auth import SIGN_A, SIGN_B, record
from tests.streams.featurizer.test_tombstones import BASE, NOW, add_req, cfg, scenarios
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import producer_config
from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.delta_codec import Delta, RowsEntry, decode_delta, encode_delta
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.receipts import Receipt, decode_receipt
from unlearn.schemas.sealed import ErasedRow
from unlearn.schemas.signature import Signer
from unlearn.services.verifier import Certificate, Check, verify
from unlearn.services.verifier.checks import check_remove_wins
from unlearn.services.verifier.evidence import Evidence
from unlearn.services.verifier.remove_wins import erased_tombstones
from unlearn.streams.featurizer.auth import Authorizer, AuthState
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.feature_cache import FeatureCache
from unlearn.streams.featurizer.featurize import featurize_batch
from unlearn.streams.featurizer.tombstones import seconds_to_us


def _rows(sign: int, ev: str, sample: str, subject: str, t_us: int, by_subject: bool = False,
          client: str = "") -> RowsEntry:
    return RowsEntry(sign, [ev], [sample], [subject], np.array([0]), np.array([[1, 2]]), [t_us], by_subject, [client])


def _records(deltas: list[Delta]) -> list[LogRecord]:
    return [LogRecord(0, i, 0, d.head_id.encode(), encode_delta(d)) for i, d in enumerate(deltas)]


def test_a_retained_add_dated_at_or_before_a_delete_fails() -> None:
    """Delete rows (of a sample, or of a subject: a delete_subject's) and tombstoned receipts (of
    a sample, or of a subject: no sample named) are tombstones; an add after them passes, one at
    or before them fails, counted in the check."""
    deltas = [Delta("h", "src", 2, 30, 0, [_rows(1, "a1", "x1", "u", 10), _rows(1, "a3", "x3", "s", 10)]),
              Delta("h", "src", 2, 30, 0, [_rows(-1, "d1", "x1", "u", 20), _rows(-1, "ds", "x3", "s", 50, True)]),
              Delta("h", "src", 2, 30, 0, [_rows(1, "a1b", "x1", "u", 21), _rows(1, "a2", "x2", "v", 31)])]
    receipts = [Receipt.tombstoned("d2", "v", "h", ["x2"], 30e-6, None, 1.0),
                Receipt.tombstoned("d3", "w", "h", [], 40e-6, None, 1.0)]
    ok = check_remove_wins(Evidence.gather(_records(deltas), None, "h", receipts))
    assert ok.status == "pass" and ok.data == {"violations": 0, "retained_adds": 2, "tombstones": 4}, ok
    for late in (_rows(1, "late-x1", "x1", "u", 20), _rows(1, "late-x2", "x2", "v", 30),
                 _rows(1, "late-w", "x9", "w", 39), _rows(1, "late-s", "x4", "s", 50)):
        bad = check_remove_wins(Evidence.gather(_records([*deltas, Delta("h", "f", 2, 30, 0, [late])]), None, "h",
                                                receipts))
        assert bad.status == "fail" and bad.data["violations"] == 1, bad
        assert bad.data["examples"][0]["event_id"] == late.event_ids[0]
    # a receipt's tombstone of another head or another subject refuses nothing here
    other = [Receipt.tombstoned("d4", "v", "other", ["x2"], 99e-6, None, 1.0),
             Receipt.tombstoned("d5", "z", "h", ["x2"], 99e-6, None, 1.0)]
    assert check_remove_wins(Evidence.gather(_records(deltas), None, "h", [*receipts, *other])).status == "pass"


def test_a_scoped_tombstone_refuses_only_its_clients_adds() -> None:
    """Signed mode: a client without ``may_delete_others`` leaves tombstones of its own adds only
    (a delete row's client, a tombstoned receipt's ``tombstone_client_id``, an erased delete
    row's client), so another client's older add stays and passes; the same add by the deleting
    client, or by no named client, fails; an unscoped tombstone ("") refuses every client."""
    def gather(delete_scope: str, late_client: str, receipt_scope: str | None) -> Check:
        deltas = [Delta("h", "src", 2, 30, 0, [_rows(1, "a1", "x1", "u", 10, client="bob")]),
                  Delta("h", "src", 2, 30, 0, [_rows(-1, "d1", "x1", "u", 20, client=delete_scope)]),
                  Delta("h", "src", 2, 30, 0, [_rows(1, "late-x1", "x1", "u", 15, client=late_client),
                                               _rows(1, "late-w", "x9", "w", 39, client=late_client)])]
        receipts = [Receipt.tombstoned("d3", "w", "h", [], 40e-6, None, 1.0, receipt_scope)]
        return check_remove_wins(Evidence.gather(_records(deltas), None, "h", receipts))

    assert gather("bob", "alice", "bob").status == "pass"
    own = gather("bob", "bob", "bob")
    assert own.data["violations"] == 2
    assert {(x["client_id"], x["tombstone_client_id"]) for x in own.data["examples"]} == {("bob", "bob")}
    assert gather("bob", "", "bob").data["violations"] == 2  # an unnamed add meets every tombstone
    assert gather("", "alice", None).data["violations"] == 2  # unscoped: every client
    assert gather("bob", "alice", None).data["violations"] == 1  # only the receipt's is unscoped
    erased = [ErasedRow(-1, "d9", "x9", "w", "k" * 32, b"c" * 32, 50, True, "bob"),
              ErasedRow(1, "a9", "x9", "w", "k" * 32, b"c" * 32, 40, False, "alice")]
    (tomb,) = erased_tombstones("h", erased)
    assert (tomb.kind, tomb.id, tomb.client_id, tomb.event_us) == ("subject", "w", "bob", 50)


#: Signed mode: alice and bob may delete their own samples only, admin anyone's.
SIGNERS = {"alice": SIGN_A, "bob": SIGN_B, "admin": Signer(SIGN_B.private_key, "adm")}
CLIENTS = {c: record(c, g, rate_per_second=0.0, burst=1, may_delete_others=c == "admin") for c, g in SIGNERS.items()}


def _featurize(reqs: list[Request], cuts: list[int], cache: FeatureCache,
               signed: bool = False) -> tuple[list[Delta], list[Receipt], dict]:
    """The requests through the featurizer's core in batches (``signed``: each signed by its
    client's key and screened): its deltas, receipts and refused adds."""
    deltas, receipts, refused = [], [], {}
    at = offset = 0
    auth = Authorizer(CLIENTS, AuthState(), 2 * (NOW - BASE)) if signed else None
    while at < len(reqs):
        chunk = reqs[at: at + cuts[at]]
        values = [encode_request(r) for r in chunk]
        msgs = [InMessage(0, offset + i, v, r.subject_id.encode(), None,
                          tuple(SIGNERS[r.client_id].headers(v)) if signed else ())
                for i, (r, v) in enumerate(zip(chunk, values, strict=True))]
        out = featurize_batch(msgs, cache, cfg(), now=NOW, auth=auth)
        deltas += out.deltas
        receipts += out.receipts
        refused.update({dl.event_id: dl.reason for dl in out.deadletters})
        cache.commit_batch(out.mutations, [], out.last_offset)
        offset += len(chunk)
        at += len(chunk)
    return deltas, receipts, refused


@settings(max_examples=100, deadline=None)
@given(scenario=scenarios(), data=st.data())
def test_the_featurizers_deltas_pass_and_an_add_it_refused_fails(
        tmp_path_factory: pytest.TempPathFactory, scenario: tuple[list[Request], list[int]],
        data: st.DataObject) -> None:
    """Any interleaving through the featurizer's core: the verifier's replay of its deltas and
    receipts finds no violation; an add the featurizer refused as ``deleted_before_arrival``,
    slipped into the deltas with the event time it was judged with, is found."""
    reqs, cuts = scenario
    with FeatureCache(tmp_path_factory.mktemp("rw") / "p0.sqlite") as cache:
        deltas, receipts, refused = _featurize(reqs, cuts, cache)
    for d in deltas:  # each row names the event time it was judged with
        for e in d.entries:
            by_event = {r.event_id: r for r in reqs}
            for ev, t in zip(e.event_ids, e.event_us, strict=True):
                assert t == seconds_to_us(by_event[ev].ts)  # type: ignore[arg-type]
    check = check_remove_wins(Evidence.gather(_records(deltas), None, "h", receipts))
    assert check.status == ("pass" if deltas else "skipped"), check
    late = sorted(ev for ev, reason in refused.items() if reason == "deleted_before_arrival")
    if not late or not deltas:
        return
    pick = data.draw(st.sampled_from(late))
    r = next(x for x in reqs if x.event_id == pick)
    forged = Delta("h", "forged", deltas[0].d, deltas[0].frac_bits, deltas[0].label_frac_bits,
                   [RowsEntry(1, [r.event_id], [str(r.sample_id)], [r.subject_id], [0], [[1] * deltas[0].d],
                              [seconds_to_us(r.ts or BASE)])])
    bad = check_remove_wins(Evidence.gather(_records([*deltas, forged]), None, "h", receipts))
    assert bad.status == "fail" and bad.data["violations"] >= 1, bad
    assert r.event_id in {x["event_id"] for x in bad.data["examples"]}


@st.composite
def signed_scenarios(draw: st.DrawFn) -> tuple[list[Request], list[int]]:
    """:func:`scenarios` with each request sent by a random client: adds by alice or bob,
    deletes also by admin (the only one that may delete others' samples)."""
    reqs, cuts = draw(scenarios())
    return [replace(r, client_id=draw(st.sampled_from(["alice", "bob"] if r.op == "add" else list(SIGNERS))))
            for r in reqs], cuts


@settings(max_examples=100, deadline=None)
@given(scenario=signed_scenarios(), data=st.data())
def test_signed_mode_scoped_deletes_pass_and_an_add_they_refused_fails(
        tmp_path_factory: pytest.TempPathFactory, scenario: tuple[list[Request], list[int]],
        data: st.DataObject) -> None:
    """Any interleaving in signed mode: the rows name their clients (an add's, a delete's scope)
    and the receipts their scope, so the replay of the featurizer's output passes whoever deleted
    what; an add it refused as ``deleted_before_arrival``, slipped in under its own client, fails."""
    reqs, cuts = scenario
    with FeatureCache(tmp_path_factory.mktemp("rws") / "p0.sqlite") as cache:
        deltas, receipts, refused = _featurize(reqs, cuts, cache, signed=True)
    by_event = {r.event_id: r for r in reqs}
    for e in (e for d in deltas for e in d.entries):
        for ev, client in zip(e.event_ids, e.client_ids, strict=True):
            r = by_event[ev]
            assert client == ("" if r.op != "add" and r.client_id == "admin" else r.client_id)
    for rc in (rc for rc in receipts if rc.status == "tombstoned"):
        who = by_event[rc.event_id].client_id
        assert rc.tombstone_client_id == (None if who == "admin" else who)
    check = check_remove_wins(Evidence.gather(_records(deltas), None, "h", receipts))
    assert check.status == ("pass" if deltas else "skipped"), check
    late = sorted(ev for ev, reason in refused.items() if reason == "deleted_before_arrival")
    if not late or not deltas:
        return
    r = by_event[data.draw(st.sampled_from(late))]
    forged = Delta("h", "forged", deltas[0].d, deltas[0].frac_bits, deltas[0].label_frac_bits,
                   [RowsEntry(1, [r.event_id], [str(r.sample_id)], [r.subject_id], [0], [[1] * deltas[0].d],
                              [seconds_to_us(r.ts or BASE)], client_ids=[r.client_id])])
    bad = check_remove_wins(Evidence.gather(_records([*deltas, forged]), None, "h", receipts))
    assert bad.status == "fail" and r.event_id in {x["event_id"] for x in bad.data["examples"]}, bad


def test_another_clients_older_add_after_a_scoped_delete_subject_passes(tmp_path: Path) -> None:
    """The case the client scope exists for: bob (no ``may_delete_others``) deletes subject u,
    nothing is removed (tombstoned, scoped to bob); then alice's add of u dated before it enters,
    rightly; the certificate's check passes, and would not if the scope were dropped."""
    reqs = [replace(Request("d", "delete_subject", "h", "bob", "u", ts=BASE + 5), client_id="bob"),
            add_req("a", "x", "u", BASE + 3, client="alice"), add_req("b", "y", "u", BASE + 4, client="bob")]
    with FeatureCache(tmp_path / "p0.sqlite") as cache:
        deltas, receipts, refused = _featurize(reqs, [1, 2, 1], cache, signed=True)
    assert refused == {"b": "deleted_before_arrival"} and [rc.tombstone_client_id for rc in receipts] == ["bob"]
    check = check_remove_wins(Evidence.gather(_records(deltas), None, "h", receipts))
    assert check.status == "pass" and check.data["retained_adds"] == 1, check
    unscoped = [replace(rc, tombstone_client_id=None) for rc in receipts]
    assert check_remove_wins(Evidence.gather(_records(deltas), None, "h", unscoped)).status == "fail"


def test_an_add_name_is_what_the_rule_reads() -> None:
    """The verifier's retained row and a request are judged by the same function."""
    from unlearn.services.verifier.remove_wins import RetainedAdd, violations
    from unlearn.streams.featurizer.tombstones import Tombstone, blocking_tombstone

    t = Tombstone("h", "sample", "x", "u", "", seconds_to_us(BASE + 5), "d")
    req = add_req("a", "x", "u", BASE + 5)
    row = RetainedAdd("h", "x", "u", "a", seconds_to_us(BASE + 5))
    assert blocking_tombstone(req, row.event_us, [t]) == t == violations([row], [t])[0][1]
    assert not violations([RetainedAdd("h", "x", "u", "a", seconds_to_us(BASE + 5) + 1)], [t])


# --------------------------------------------------------------------------- on a real broker
def certify_messages(got: dict[str, list], head_id: str) -> Certificate:
    """The verifier on what a test read from the broker (``deltas`` opened, ``receipts``), without
    a live head (no ledger ran): its replay and remove-wins checks."""
    from tests.sealed_support import plain_delta

    records = [LogRecord(m.partition(), m.offset(), m.timestamp()[1], m.key(),
                         encode_delta(plain_delta(m.value(), m.topic())), m.topic()) for m in got["deltas"]]
    receipts = [decode_receipt(m.value()) for m in got["receipts"]]
    return verify(records, None, head_id, orders=1, partitionings=1, seed=1, require_live=False, receipts=receipts)


def _check(cert: Certificate, name: str) -> Check:
    return next(c for c in cert.checks if c.name == name)


def _certify_until(s: Settings, head: str, done: Callable[[Certificate], bool], timeout: float = 120) -> Certificate:
    """``verify_broker`` until ``done`` holds (the pipeline settles: heads, receipts) or ``timeout``."""
    from unlearn.services.verifier import verify_broker

    deadline = time.monotonic() + timeout
    while not done(cert := verify_broker(s, head, orders=1, partitionings=1, seed=1)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return cert


@pytest.mark.broker
def test_an_add_written_to_the_deltas_topic_before_its_delete_fails_the_certificate(settings: Settings,
                                                                                    tmp_path: Path) -> None:
    """The featurizer and the ledger run; a delete removes an add, another is tombstoned (nothing
    to remove): the certificate passes. Then an add of the tombstoned sample, dated before its
    delete, is written straight to the deltas topic: the ledger applies it (digests still agree),
    and only ``remove_wins`` fails."""
    from tests.test_pipeline import pipeline_settings, services
    from unlearn.services.client.head_reader import wait_for_head
    from unlearn.services.verifier.reading import read_head_records

    s = pipeline_settings(settings, tmp_path)
    head, t0 = "rwv", time.time()
    p = Producer(producer_config(s))
    for i, (op, subject, sample) in enumerate([("add", "u", "x1"), ("add", "u", "x2"), ("add", "v", "x3"),
                                               ("delete", "u", "x1"), ("delete", "v", "x9")]):
        r = (add_req(f"ev-{sample}", sample, subject, t0 + i / 1000) if op == "add" else
             Request(f"del-{sample}", "delete", head, "eraser", subject, sample, ts=t0 + i / 1000))
        p.produce(s.topic("requests"), encode_request(replace(r, head_id=head)), subject.encode())
    assert p.flush(30) == 0
    feat, led = services(s, tmp_path)
    try:
        wait_for_head(s, head, lambda u: u.n_retained == 2 and u.mode == "exact", timeout=120)
        # the tombstoned receipt of x9 may follow the head
        cert = _certify_until(s, head, lambda c: c.ok and "tombstoned_receipts" in {x.name for x in c.checks})
        assert cert.ok, cert.summary()
        assert _check(cert, "remove_wins").data == {"violations": 0, "retained_adds": 2, "tombstones": 2}
        # (x1's delete row counts whether applied or erased since: its key destroyed by the shredder)
        # an add of x9 dated before its delete, written straight to the deltas topic
        rec = read_head_records(s, s.topic("deltas"), head)[0]
        d = decode_delta(rec.value or b"")
        forged = RowsEntry(1, ["forged-x9"], ["x9"], ["v"], np.array([1]), np.ones((1, d.d), np.int64),
                           [seconds_to_us(t0)])
        p.produce(s.topic("deltas"), encode_delta(Delta(head, "forged", d.d, d.frac_bits, d.label_frac_bits,
                                                        [forged], d.n_classes, d.contract_version)),
                  head.encode(), partition=rec.partition)
        assert p.flush(30) == 0
        wait_for_head(s, head, lambda u: u.n_retained == 3 and u.mode == "exact", timeout=120)
        cert = _certify_until(s, head, lambda c: _check(c, "live_digest").status == "pass")
    finally:
        feat.stop()
        led.stop()
    assert not cert.ok and [c.name for c in cert.checks if c.status == "fail"] == ["remove_wins"], cert.summary()
    check = _check(cert, "remove_wins")
    assert check.data["violations"] == 1 and check.data["examples"][0]["event_id"] == "forged-x9"
    assert check.data["examples"][0]["tombstone_event_id"] == "del-x9"
    assert "remove_wins" in cert.summary_line() and "FAIL" in cert.summary()


@pytest.mark.broker
def test_signed_mode_a_scoped_delete_subject_leaves_another_clients_older_add_certified(settings: Settings,
                                                                                       tmp_path: Path) -> None:
    """Signed mode on the real broker: bob (no ``may_delete_others``) deletes subject u before
    any of it arrived (a tombstoned receipt scoped to bob); then alice's and bob's adds of u dated
    before that delete: alice's enters (the tombstone is bob's), bob's is refused. The featurizer
    and the ledger run; the certificate passes, remove_wins included."""
    from tests.streams.featurizer.test_signed import register
    from tests.test_pipeline import pipeline_settings, services
    from unlearn.services.client.head_reader import wait_for_head

    s = pipeline_settings(settings, tmp_path).with_(auth_mode="signed")
    for client in ("alice", "bob"):
        register(s, client, [SIGNERS[client]], rate_per_second=0.0, burst=1)
    head, t0 = "rws", time.time()
    p = Producer(producer_config(s))
    for r in (Request("del-u", "delete_subject", head, "bob", "u", ts=t0 + 0.005),
              replace(add_req("add-x", "x", "u", t0 + 0.003, client="alice"), head_id=head),
              replace(add_req("add-y", "y", "u", t0 + 0.004, client="bob"), head_id=head),
              replace(add_req("add-z", "z", "v", t0 + 0.001, client="alice"), head_id=head)):
        value = encode_request(r)
        p.produce(s.topic("requests"), value, r.subject_id.encode(), headers=SIGNERS[r.client_id].headers(value))
    assert p.flush(30) == 0
    feat, led = services(s, tmp_path)
    try:
        wait_for_head(s, head, lambda u: u.n_retained == 2 and u.mode == "exact", timeout=120)
        cert = _certify_until(s, head, lambda c: c.ok and "tombstoned_receipts" in {x.name for x in c.checks})
    finally:
        feat.stop()
        led.stop()
    assert cert.ok, cert.summary()
    assert _check(cert, "remove_wins").data == {"violations": 0, "retained_adds": 2, "tombstones": 1}
