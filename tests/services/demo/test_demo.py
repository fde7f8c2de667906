"""`unlearn demo` end to end at a tiny size (sklearn digits, features passthrough): every service
as a real process on its own local broker, and a report whose checks all hold."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from unlearn.services.demo.driver import demo_main

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("signed", [False, True], ids=["auth-off", "signed"])
def test_demo_runs_every_phase_and_certifies(tmp_path: Path, capfd: pytest.CaptureFixture[str], signed: bool) -> None:
    out = tmp_path / "demo-out"
    code = demo_main(["--dataset", "digits", "--n-train", "200", "--n-test", "100", "--burst", "10",
                      "--chunk-steps", "2", "--burst-gap-ms", "20", "--out", str(out), *(["--signed"] * signed)])
    gc.collect()  # a client the demo forgot would be destroyed (and complain) here, after the broker stopped
    err = capfd.readouterr().err
    # Every Kafka client is closed before the broker stops: librdkafka has no gone broker to report.
    assert "|FAIL|" not in err and "Connection refused" not in err, err[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert code == 0, report
    assert report["ok"] and report["verifier"]["ok"] and report["serving"]["ok"]
    assert report["readd_restores_digest"]  # passthrough features are bit-reproducible
    assert report["adds_sealed_for_transit"] >= 200  # raw inputs sealed for transit by default
    names = [p["name"] for p in report["phases"]]
    assert names[0] == "initial adds" and len(names) == 5
    retained = [p["n_retained"] for p in report["phases"]]
    assert retained == [200, 160, 120, 110, 120]
    assert (out / "phases.png").stat().st_size > 1000
