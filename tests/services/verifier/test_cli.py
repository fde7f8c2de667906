"""``unlearn verify`` / ``unlearn export-deltas``: offline on an export file, and against a real
ledger worker on the broker."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.services.verifier.support import anomalous_stream, records_of, simulate
from unlearn.common.families import heads_family
from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import LogRecord
from unlearn.runtime.topics import ensure_topic
from unlearn.schemas.head import HeadUpdate, encode_head
from unlearn.services.cli import COMMANDS
from unlearn.services.verifier import export_deltas_main, verify_head, verify_main, write_export


def test_offline_cli_on_export_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = anomalous_stream(seed=6, n_msgs=12)
    recs = records_of(b.msgs)
    ups, rt, _ = simulate(recs, "h", final_reset=True)
    heads = [LogRecord(0, i, 0, b"h", encode_head(u)) for i, u in enumerate(ups)]
    path = tmp_path / "h.uldx"
    write_export(path, [r for r in recs if r.key == b"h"], heads)

    assert verify_main(["--deltas-file", str(path), "--json", "--seed", "11", "--orders", "2",
                        "--partitions", "2"]) == 0
    out = capsys.readouterr()
    cert = orjson.loads(out.out)
    assert cert["ok"] and cert["head_id"] == "h" and cert["replay"]["digest"] == rt.ledger.digest()
    assert "PASS" in out.err
    # the `unlearn verify` command is wired to this module
    assert COMMANDS["verify"](["--deltas-file", str(path), "--orders", "0", "--partitions", "0"]) == 0
    assert "PASS" in capsys.readouterr().out
    # a truncated file is an error, not a certificate
    (tmp_path / "cut.uldx").write_bytes(path.read_bytes()[:-10])
    assert verify_main(["--deltas-file", str(tmp_path / "cut.uldx")]) == 1
    assert "truncated" in capsys.readouterr().err
    # a forged live head fails the CLI
    bad = [*ups[:-1], HeadUpdate(**{**{f: getattr(ups[-1], f) for f in HeadUpdate.__slots__}, "digest": "1" * 64})]
    write_export(tmp_path / "forged.uldx", [r for r in recs if r.key == b"h"],
                 [LogRecord(0, i, 0, b"h", encode_head(u)) for i, u in enumerate(bad)])
    assert verify_main(["--deltas-file", str(tmp_path / "forged.uldx")]) == 1
    assert "[fail   ] live_digest" in capsys.readouterr().out
    # usage errors
    assert verify_main(["--deltas-file", str(path), "--orders", "-1"]) == 2
    assert verify_main([]) == 2
    capsys.readouterr()


def test_a_missing_topic_is_an_error_not_a_certificate(settings: Settings, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The shared reader's TopicReadError reaches the CLI and the demo's entry point as a VerifyError."""
    s = settings.with_(topic_prefix=f"t.none.{uuid.uuid4().hex[:8]}.")  # no topics under this prefix
    common = ["--bootstrap", s.bootstrap, "--prefix", s.topic_prefix, "--head", "h", "--timeout", "10"]
    assert verify_main(common) == 1
    assert "does not exist" in capsys.readouterr().err
    assert export_deltas_main([*common, "--out", str(tmp_path / "x.uldx")]) == 1
    assert "does not exist" in capsys.readouterr().err
    res = verify_head(s, "h", timeout=10)
    assert res["ok"] is False and "does not exist" in res["error"]


def test_verify_and_export_against_a_live_ledger_worker(settings: Settings, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka import Producer

    from unlearn.infra.processes import ServiceProcess
    from unlearn.runtime.clients import producer_config
    from unlearn.services.client.head_reader import wait_for_head

    s = settings.with_(data_dir=str(tmp_path / "data"), reset_every_seconds=1.0, reset_every_events=7,
                       head_gammas="h=0.5", checkpoint_every_seconds=1.0)
    b = anomalous_stream(seed=7, n_msgs=25)
    recs = records_of(b.msgs)
    _ups, rt, _ = simulate(recs, "h")
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
    retained = next(c for c in cert["checks"] if c["name"] == "retained_hash")
    assert retained["status"] == "pass" and retained["compared"]["receipts"] > 0, retained  # the worker's receipts
    assert cert["replay"]["retained_hash"] == live.retained_hash is not None

    as_dict = verify_head(s, "h", orders=1, partitions=1, seed=1)  # the demo's entry point
    assert as_dict["ok"] and as_dict["summary"].startswith("PASS") and as_dict["retrain_deviation"] < 1e-10
    assert verify_head(s, "no-such-head", orders=0, partitions=0)["ok"] is False

    out = tmp_path / "h.uldx"
    assert export_deltas_main([*common, "--head", "h", "--out", str(out)]) == 0
    info = orjson.loads(capsys.readouterr().out)
    # one head update per poll (coalescing), so at least one, and the receipts of every delete
    assert info["deltas"] == sum(1 for k, _ in b.msgs if k == b"h") and info["heads"] >= 1
    assert info["receipts"] >= retained["compared"]["receipts"]  # rejected receipts too
    assert verify_main(["--deltas-file", str(out), "--json", "--seed", "3"]) == 0
    offline = orjson.loads(capsys.readouterr().out)
    assert offline["replay"]["digest"] == live.digest
    assert next(c for c in offline["checks"] if c["name"] == "retained_hash")["compared"]["receipts"] > 0

    # someone publishes a head that the deltas do not back: the certificate fails
    W = np.array(live.weights) * 1.0001
    forged = HeadUpdate("h", live.version + 1, "exact", live.digest, live.n_retained, live.events_covered,
                        live.offsets, 0.0, live.gamma, time.time(), W, None)
    forged_topic = heads_family(s.topic_prefix).topic(7, 0)  # any topic of the family is read
    ensure_topic(s, forged_topic)
    p = Producer(producer_config(s))
    p.produce(forged_topic, key=b"h", value=encode_head(forged))
    assert p.flush(30) == 0
    assert verify_main([*common, "--head", "h", "--seed", "3"]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "[fail   ] live_digest" in text and "[fail   ] canonical_head" in text
