"""The replay verifier: pure replays against the live rules (HeadRuntime), tamper detection, the
export format, and the whole thing against a real ledger worker on the broker."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from unlearn.ledger import ExactLedger, Quantizer, l2_normalize
from unlearn.schemas.delta_codec import CodecError, Delta, PackedEntry, RowsEntry, decode_delta, encode_delta
from unlearn.schemas.head_codec import HeadUpdate
from unlearn.services.verifier.core import (
    LogRecord,
    read_export,
    verify,
    verify_file,
    verify_main,
    write_export,
)
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime

CFG = HeadConfig(gamma=0.5, reset_every=7, drift_threshold=1e-9)


# --------------------------------------------------------------------------- a stream with anomalies
class StreamBuilder:
    """Random adds/deletes/delete_subjects for one head, plus the anomalies the live ledger skips."""

    def __init__(self, head: str = "h", d: int = 8, seed: int = 0, label_frac_bits: int = 0,
                 vector_width: int = 0) -> None:
        self.head, self.d, self.k_y, self.vw = head, d, label_frac_bits, vector_width
        self.rng = np.random.default_rng(seed)
        self.members: dict[str, tuple[np.ndarray, object, str]] = {}
        self.msgs: list[tuple[bytes | None, bytes]] = []
        self.n = 0
        self.src = 0

    def _labels(self, n: int) -> np.ndarray:
        if self.vw:
            y = self.rng.uniform(-1, 1, size=(n, self.vw))
            return np.rint(y * 2**self.k_y).astype(np.int64)
        return self.rng.integers(0, 4, n)

    def _source(self) -> str:
        self.src += 1
        return f"requests/0@{self.src}"

    def emit(self, entries: list, key: str | None = None, source: str | None = None) -> bytes:
        raw = encode_delta(Delta(self.head, source or self._source(), self.d, 30, self.k_y, tuple(entries)))
        self.msgs.append(((key or self.head).encode(), raw))
        return raw

    def add(self, n: int | None = None, subject: str | None = None) -> RowsEntry:
        n = n or int(self.rng.integers(1, 6))
        Q = Quantizer().quantize(l2_normalize(self.rng.normal(size=(n, self.d))))
        y = self._labels(n)
        ids = [f"s{self.n + i}" for i in range(n)]
        subj = [subject or f"u{int(self.rng.integers(0, 6))}" for _ in range(n)]
        self.n += n
        for i, q, lab, s in zip(ids, Q, y, subj):
            self.members[i] = (q, lab, s)
        return RowsEntry(+1, [f"add-{i}" for i in ids], ids, subj, y, Q)

    def delete(self, k: int | None = None) -> RowsEntry | None:
        if not self.members:
            return None
        k = min(len(self.members), k or int(self.rng.integers(1, 4)))
        ids = list(self.rng.choice(sorted(self.members), size=k, replace=False))
        return self._del(ids, [f"del-{i}" for i in ids])

    def delete_subject(self) -> RowsEntry | None:
        subjects = sorted({s for _, _, s in self.members.values()})
        if not subjects:
            return None
        subj = subjects[int(self.rng.integers(len(subjects)))]
        ids = sorted(i for i, (_, _, s) in self.members.items() if s == subj)
        return self._del(ids, [f"ds-{subj}-{self.src}"] * len(ids))

    def _del(self, ids: list[str], events: list[str]) -> RowsEntry:
        Q = np.stack([self.members[i][0] for i in ids])
        y = np.stack([np.asarray(self.members[i][1]) for i in ids])
        subj = [self.members[i][2] for i in ids]
        for i in ids:
            del self.members[i]
        return RowsEntry(-1, events, ids, subj, y, Q)

    def random_message(self) -> bytes:
        entries = [self.add()]
        r = self.rng.random()
        if r < 0.35:
            e = self.delete()
        elif r < 0.5:
            e = self.delete_subject()
        else:
            e = None
        if e is not None:
            entries.append(e)
        return self.emit(entries)

    def non_member(self, cls: int = 9) -> RowsEntry:
        """A delete of a row never added, with a class the head never saw: the ledger refuses it."""
        Q = Quantizer().quantize(l2_normalize(self.rng.normal(size=(1, self.d))))
        return RowsEntry(-1, ["ghost-ev"], ["ghost"], ["nobody"], np.array([cls]), Q)

    def reference(self) -> ExactLedger:
        led = ExactLedger(self.d, 0, 30, self.k_y)
        if self.members:
            led.add(np.stack([q for q, _, _ in self.members.values()]),
                    np.stack([np.asarray(lab) for _, lab, _ in self.members.values()]))
        return led


def anomalous_stream(seed: int = 0, n_msgs: int = 30, **kw: object) -> StreamBuilder:
    b = StreamBuilder(seed=seed, **kw)  # type: ignore[arg-type]
    # a delete before the head exists: rejected (unknown_head), no version
    b.emit([b.non_member()])
    for i in range(n_msgs):
        raw = b.random_message()
        if i == 5:  # the featurizer re-produced a batch after a crash: same source id
            b.msgs.append((b.head.encode(), raw))
        if i == 9:  # corrupt bytes keyed to the head: dead-lettered
            b.msgs.append((b.head.encode(), raw[:-3] + b"xyz"))
        if i == 12:  # another head's traffic on the same topic
            other = StreamBuilder(head="other", d=5, seed=99)
            b.msgs.append((b"other", encode_delta(Delta("other", "requests/1@1", 5, 30, 0, (other.add(),)))))
        if i == 15:  # a non-member delete next to a good add: entry rejected, the add applies
            b.emit([b.add(), b.non_member()])
    return b


def records_of(msgs: list[tuple[bytes | None, bytes]]) -> list[LogRecord]:
    return [LogRecord(0, off, 1_000 + off, key, raw) for off, (key, raw) in enumerate(msgs)]


def head_update(rt: HeadRuntime, mode: str | None = None) -> HeadUpdate:
    """What LedgerProcessor.head_update publishes."""
    mode = mode or rt.mode
    return HeadUpdate(rt.head_id, rt.version, mode, rt.digest(), rt.ledger.count, rt.events_covered,
                      ((rt.input_partition, rt.applied_offset),), float(rt.last_reset_drift), rt.config.gamma,
                      time.time(), rt.weights.copy(),
                      rt.tracked.tracker.T.copy() if mode == "exact" else None)


def simulate(records: list[LogRecord], head_id: str, timer_resets: set[int] = frozenset(),
             final_reset: bool = False) -> tuple[list[HeadUpdate], HeadRuntime, list[str]]:
    """The live ledger processor's decisions (HeadRuntime), with a timer reset after the given
    versions (and at the end): the head updates it would publish and the rejection reasons."""
    rt: HeadRuntime | None = None
    ups: list[HeadUpdate] = []
    reasons: list[str] = []
    for r in records:
        if r.key and r.key != head_id.encode():
            continue
        try:
            delta = decode_delta(r.value)
        except CodecError:
            continue
        if rt is None:
            if not any(e.sign > 0 for e in delta.entries):
                reasons += ["unknown_head"] * len(delta.entries)
                continue
            rt = HeadRuntime.new(head_id, delta, CFG)
        out = rt.apply(delta, r.offset, r.partition)
        if out.skipped:
            continue
        reasons += [x.reason for x in out.rejections]
        ups.append(head_update(rt))
        if rt.version in timer_resets and rt.mode == "fast":
            rt.reset("timer")
            ups.append(head_update(rt))
    assert rt is not None
    if final_reset and rt.mode == "fast":
        rt.reset("timer")
        ups.append(head_update(rt))
    return ups, rt, reasons


def status(cert, name: str) -> str:
    return next(c.status for c in cert.checks if c.name == name)


# --------------------------------------------------------------------------- pure tests
def test_replay_certifies_the_live_head_with_the_live_skip_rules() -> None:
    b = anomalous_stream(seed=1)
    recs = records_of(b.msgs)
    ups, rt, reasons = simulate(recs, "h", final_reset=True)
    assert ups[-1].mode == "exact"
    cert = verify(recs, ups, "h", orders=3, partitionings=3, seed=5)
    assert cert.ok, cert.summary()
    assert {c.name: c.status for c in cert.checks} == {
        "log_replay": "pass", "shuffled_orders": "pass", "repartitionings": "pass", "from_scratch": "pass",
        "live_digest": "pass", "canonical_head": "pass", "retrain_deviation": "pass"}
    # the same skip decisions as the live rules
    assert cert.replay["version"] == rt.version and cert.replay["digest"] == rt.ledger.digest()
    assert cert.replay["digest"] == b.reference().digest()
    assert cert.replay["skipped_counts"] == {"duplicate_source": 1, "bad_delta": 1}
    assert sorted(r["reason"] for r in cert.replay["rejected_entries"]) == sorted(reasons)
    assert sorted(reasons) == ["non_member_delete", "unknown_head"]
    dev = next(c for c in cert.checks if c.name == "retrain_deviation")
    assert dev.data["deviation"] < 1e-10
    # orders and partitionings really differed (different batch/partition structures)
    parts = next(c for c in cert.checks if c.name == "repartitionings").data["partitionings"]
    assert all(p["partitions"] >= 2 for p in parts)
    js = cert.to_json()
    assert js["ok"] and js["schema"] == "unlearn.verify/v1" and js["seed"] == 5
    orjson.dumps(js)  # JSON-ready


def test_a_ghost_delete_the_ledger_accepts_is_flagged() -> None:
    """The ledger's non-member test is necessary, not sufficient (counts, class counts, diagonal
    of S): a never-added row of a known class usually passes it. The verifier matches every
    delete to an earlier add by sample id and fails the certificate when one has none."""
    b = StreamBuilder(seed=8)
    for _ in range(15):
        b.random_message()
    b.emit([b.non_member(cls=1)])
    recs = records_of(b.msgs)
    ups, rt, reasons = simulate(recs, "h", final_reset=True)
    assert reasons == []  # the live ledger applied it
    cert = verify(recs, ups, "h", orders=2, partitionings=2, seed=2)
    assert not cert.ok and status(cert, "delete_matching") == "fail"
    assert status(cert, "live_digest") == "pass" and status(cert, "shuffled_orders") == "pass"
    assert status(cert, "from_scratch") == "skipped" and status(cert, "repartitionings") == "skipped"


def test_fast_latest_head_is_checked_at_the_latest_exact_version() -> None:
    b = anomalous_stream(seed=2, n_msgs=20)
    recs = records_of(b.msgs)
    ups, rt, _ = simulate(recs, "h")
    assert ups[-1].mode == "fast"  # reset_every=7: exact updates exist mid-stream
    exact = [u for u in ups if u.mode == "exact"]
    assert exact
    cert = verify(recs, ups, "h", orders=1, partitionings=1, seed=1)
    assert cert.ok, cert.summary()
    canon = next(c for c in cert.checks if c.name == "canonical_head")
    assert canon.status == "pass" and canon.data["version"] == exact[-1].version
    assert "fast" in canon.detail
    # without any exact update the canonical check is reported as not checkable
    only_fast = [u for u in ups if u.mode == "fast"]
    cert = verify(recs, only_fast, "h", orders=1, partitionings=0, seed=1)
    assert status(cert, "canonical_head") == "skipped" and cert.ok


def test_tampering_is_detected() -> None:
    b = anomalous_stream(seed=3, n_msgs=15)
    recs = records_of(b.msgs)
    ups, rt, _ = simulate(recs, "h", final_reset=True)
    last = ups[-1]
    assert last.mode == "exact"

    def forged(**changes: object) -> list[HeadUpdate]:
        fields = {f: getattr(last, f) for f in HeadUpdate.__slots__}
        fields.update(changes)
        return ups[:-1] + [HeadUpdate(**fields)]

    W = np.array(last.weights)
    W[0, 0] = np.nextafter(W[0, 0], np.inf)  # one ulp
    cert = verify(recs, forged(weights=W), "h", orders=1, partitionings=1, seed=1)
    assert not cert.ok and status(cert, "canonical_head") == "fail" and status(cert, "live_digest") == "pass"
    T = np.array(last.posterior)
    T[1, 1] = np.nextafter(T[1, 1], 0)
    cert = verify(recs, forged(posterior=T), "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "canonical_head") == "fail" and "posterior" in next(
        c.detail for c in cert.checks if c.name == "canonical_head")
    cert = verify(recs, forged(digest="0" * 64), "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "live_digest") == "fail" and not cert.ok
    # a delta the live head claims but the log does not have (a lost/hidden message)
    applied = [i for i, r in enumerate(recs) if r.key == b"h" and i > 3]
    cert = verify(recs[: applied[-1]], ups, "h", orders=0, partitionings=0, seed=1)
    assert status(cert, "live_digest") == "fail"
    # a head that was never published
    cert = verify(recs, [], "h", orders=1, partitionings=0, seed=1)
    assert status(cert, "live_digest") == "fail" and not cert.ok


def test_packed_entries_and_vector_labels() -> None:
    b = StreamBuilder(seed=4, d=6, label_frac_bits=8, vector_width=3)
    for _ in range(6):
        b.random_message()
    # a packed batch (federated site): statistics only
    extra = b.add(n=5)
    blob = ExactLedger.from_rows(extra.q, extra.labels, frac_bits=30, label_frac_bits=8).to_bytes()
    b.emit([PackedEntry(+1, extra.event_ids, extra.sample_ids, extra.subject_ids, blob)])
    b.emit([b.delete(2)])
    b.emit([b._del([extra.sample_ids[0], extra.sample_ids[1]], ["pk-del", "pk-del"])])  # rows out of the packed add
    recs = records_of(b.msgs)
    ups, rt, _ = simulate(recs, "h", final_reset=True)
    cert = verify(recs, ups, "h", orders=3, partitionings=2, seed=9)
    assert cert.ok, cert.summary()
    assert cert.replay["digest"] == b.reference().digest()
    assert status(cert, "from_scratch") == "skipped" and status(cert, "retrain_deviation") == "skipped"
    assert status(cert, "shuffled_orders") == "pass" and status(cert, "repartitionings") == "pass"
    # rows only (no packed): vector labels on their own grid, retrain reference agrees
    b2 = StreamBuilder(seed=5, d=6, label_frac_bits=8, vector_width=3)
    for _ in range(10):
        b2.random_message()
    recs2 = records_of(b2.msgs)
    ups2, _, _ = simulate(recs2, "h", final_reset=True)
    cert2 = verify(recs2, ups2, "h", orders=2, partitionings=2, seed=3)
    assert cert2.ok and status(cert2, "retrain_deviation") == "pass", cert2.summary()


def test_export_file_roundtrip_and_offline_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = anomalous_stream(seed=6, n_msgs=12)
    recs = records_of(b.msgs)
    ups, rt, _ = simulate(recs, "h", final_reset=True)
    from unlearn.schemas.head_codec import encode_head

    heads = [LogRecord(0, i, 0, b"h", encode_head(u)) for i, u in enumerate(ups)]
    path = tmp_path / "h.uldx"
    write_export(path, [r for r in recs if r.key == b"h"], heads)
    d2, h2 = read_export(path)
    assert [r.value for r in d2] == [r.value for r in recs if r.key == b"h"] and len(h2) == len(ups)

    assert verify_main(["--deltas-file", str(path), "--json", "--seed", "11", "--orders", "2",
                        "--partitions", "2"]) == 0
    out = capsys.readouterr()
    cert = orjson.loads(out.out)
    assert cert["ok"] and cert["head_id"] == "h" and cert["replay"]["digest"] == rt.ledger.digest()
    assert "PASS" in out.err
    # deltas only: the live checks are skipped, the replay checks still certify the ledger
    write_export(tmp_path / "only.uldx", [r for r in recs if r.key == b"h"])
    cert2 = verify_file(tmp_path / "only.uldx", orders=1, partitionings=1, seed=1, gamma=CFG.gamma)
    assert cert2.ok and status(cert2, "live_digest") == "skipped"
    assert status(cert2, "retrain_deviation") == "pass"
    # a truncated file is an error, not a certificate
    (tmp_path / "cut.uldx").write_bytes(path.read_bytes()[:-10])
    assert verify_main(["--deltas-file", str(tmp_path / "cut.uldx")]) == 1
    assert "truncated" in capsys.readouterr().err
    # a forged live head fails the CLI
    bad = ups[:-1] + [HeadUpdate(**{**{f: getattr(ups[-1], f) for f in HeadUpdate.__slots__}, "digest": "1" * 64})]
    write_export(tmp_path / "forged.uldx", [r for r in recs if r.key == b"h"],
                 [LogRecord(0, i, 0, b"h", encode_head(u)) for i, u in enumerate(bad)])
    assert verify_main(["--deltas-file", str(tmp_path / "forged.uldx")]) == 1
    assert "[fail   ] live_digest" in capsys.readouterr().out


# --------------------------------------------------------------------------- against the real broker
def test_verify_and_export_against_a_live_ledger_worker(settings, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka import Producer

    from unlearn.infra.processes import ServiceProcess
    from unlearn.infra.profiles import producer_config
    from unlearn.schemas.head_codec import encode_head
    from unlearn.services.client.head_reader import wait_for_head
    from unlearn.services.verifier.core import export_deltas_main

    s = settings.with_(data_dir=str(tmp_path / "data"), reset_every_seconds=1.0, reset_every_events=7,
                       head_gammas="h=0.5", checkpoint_every_seconds=1.0)
    b = anomalous_stream(seed=7, n_msgs=25)
    recs = records_of(b.msgs)
    ups, rt, _ = simulate(recs, "h")
    worker = ServiceProcess("ledger", ["ledger", "--worker-id", "w0"], s, tmp_path).start()
    try:
        p = Producer(producer_config(s))
        for key, raw in b.msgs:
            p.produce(s.topic("deltas"), key=key, value=raw)
        assert p.flush(30) == 0
        live = wait_for_head(s, "h", lambda u: u.version >= rt.version and u.mode == "exact", timeout=90)
        assert live.digest == rt.ledger.digest()
    finally:
        worker.stop()
    common = ["--bootstrap", s.bootstrap, "--prefix", s.topic_prefix]
    assert verify_main([*common, "--head", "h", "--json", "--seed", "3"]) == 0, capsys.readouterr().err
    cert = orjson.loads(capsys.readouterr().out)
    assert cert["ok"] and cert["replay"]["version"] == rt.version and cert["live_head"]["digest"] == live.digest
    assert cert["replay"]["skipped_counts"] == {"duplicate_source": 1, "bad_delta": 1}
    assert {c["name"]: c["status"] for c in cert["checks"]}["canonical_head"] == "pass"
    from unlearn.services.verifier.core import verify_head

    as_dict = verify_head(s, "h", orders=1, partitions=1, seed=1)  # the demo's entry point
    assert as_dict["ok"] and as_dict["summary"].startswith("PASS") and as_dict["retrain_deviation"] < 1e-10
    assert verify_head(s, "no-such-head", orders=0, partitions=0)["ok"] is False

    out = tmp_path / "h.uldx"
    assert export_deltas_main([*common, "--head", "h", "--out", str(out)]) == 0
    info = orjson.loads(capsys.readouterr().out)
    assert info["deltas"] == sum(1 for k, _ in b.msgs if k == b"h") and info["heads"] >= rt.version
    assert verify_main(["--deltas-file", str(out), "--json", "--seed", "3"]) == 0
    assert orjson.loads(capsys.readouterr().out)["replay"]["digest"] == live.digest

    # someone publishes a head that the deltas do not back: the certificate fails
    W = np.array(live.weights) * 1.0001
    forged = HeadUpdate("h", live.version + 1, "exact", live.digest, live.n_retained, live.events_covered,
                        live.offsets, 0.0, live.gamma, time.time(), W, None)
    p = Producer(producer_config(s))
    p.produce(s.topic("heads"), key=b"h", value=encode_head(forged))
    assert p.flush(30) == 0
    assert verify_main([*common, "--head", "h", "--seed", "3"]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "[fail   ] live_digest" in text and "[fail   ] canonical_head" in text
