"""`unlearn demo` end to end at a tiny size (sklearn digits, features passthrough): every service
as a real process on its own local broker, and a report whose checks all hold; again and again in
one directory, on either engine; and a demo whose service dies stops at once and says why."""

from __future__ import annotations

import gc
import json
import threading
import time
from pathlib import Path

import pytest

from unlearn.services.demo.driver import Demo, demo_main, parse_args, run_demo

pytestmark = pytest.mark.slow

TINY = ["--dataset", "digits", "--n-train", "200", "--n-test", "100", "--burst", "10", "--chunk-steps", "2",
        "--burst-gap-ms", "20"]


def _run(out: Path, capfd: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, object], str]:
    # Clients that earlier tests in this process left to the garbage collector (pytest-xdist runs
    # many modules in one worker) go now, and what they said is dropped: only the demo's are checked.
    gc.collect()
    capfd.readouterr()
    code = demo_main([*TINY, "--out", str(out), *extra])
    gc.collect()  # a client the demo forgot would be destroyed (and complain) here, after the broker stopped
    captured = capfd.readouterr()
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return code, report, captured.out + captured.err


def _check(code: int, report: dict[str, object], output: str) -> None:
    # Every Kafka client is closed before the broker stops: librdkafka has no gone broker to report.
    assert "|FAIL|" not in output and "Connection refused" not in output, output[-3000:]
    assert code == 0, output[-3000:]
    assert report["ok"] and report["verifier"]["ok"] and report["serving"]["ok"]  # type: ignore[index]
    assert report["readd_restores_digest"]  # passthrough features are bit-reproducible
    assert report["adds_sealed_for_transit"] >= 200  # type: ignore[operator]  # sealed for transit by default
    names = [p["name"] for p in report["phases"]]  # type: ignore[attr-defined]
    assert names[0] == "initial adds" and len(names) == 5
    assert [p["n_retained"] for p in report["phases"]] == [200, 160, 120, 110, 120]  # type: ignore[attr-defined]


def test_demo_runs_again_and_again_on_either_engine(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Three runs in one directory: tansu, tansu again (the workers' state of the first run belongs
    to a broker that is gone), then Apache Kafka. Each passes, with the same digest, and says where
    the state lives; with output to a file (pytest's capture) no progress-bar frame is written."""
    out = tmp_path / "demo-out"
    digests = []
    for engine in ("tansu", "tansu", "kafka"):
        code, report, output = _run(out, capfd, "--engine", engine)
        _check(code, report, output)
        assert f"their state: {out / 'state'}" in output
        assert "\r" not in output and "it/s" not in output and "ev/s" not in output, output[-2000:]
        digests.append(report["phases"][-1]["digest"])  # type: ignore[index]
    assert (out / "phases.png").stat().st_size > 1000
    assert len(set(digests)) == 1, digests  # the same data gives the same ledger on any broker


def test_signed_demo_certifies(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _check(*_run(tmp_path / "demo-out", capfd, "--signed"))


def test_a_dead_service_stops_the_demo_at_once(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The featurizer killed -9 while the demo runs: the demo stops within seconds (not at its
    300 s phase timeout) and names the dead process, its last log line and its log."""
    demo = Demo(parse_args([*TINY, "--out", str(tmp_path / "demo-out")]))
    killed: list[float] = []

    def kill_featurizer() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            procs = getattr(demo, "procs", [])
            if procs and procs[0].alive and time.monotonic() - procs[0].started_at > 3:
                procs[0].kill9()
                killed.append(time.monotonic())
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_featurizer, daemon=True)
    killer.start()
    code = run_demo(demo)
    stopped = time.monotonic()
    killer.join()
    err = capfd.readouterr().err
    assert killed, "the featurizer never ran"
    assert code == 1
    assert stopped - killed[0] < 15, stopped - killed[0]
    log = tmp_path / "demo-out" / "logs" / "featurizer.log"
    assert "demo stopped: featurizer was killed by signal 9" in err, err[-2000:]
    assert f"log: {log}" in err and "its last log line: " in err
