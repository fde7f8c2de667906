"""``unlearn featurizer`` (cli.py) against a REAL Kafka-protocol broker (conftest: tansu or
KAFKA_BOOTSTRAP): a SIGTERM finishes and exits 0, bad arguments exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.streams.featurizer.test_service import Reader, add, committed_offsets, ledgers_from, produce
from unlearn.infra.settings import Settings

pytestmark = pytest.mark.broker


def test_cli_exits_zero_on_sigterm_after_finishing(settings: Settings, tmp_path: Path) -> None:
    s = settings
    reqs = [add(f"a{i}", "h", f"s{i}", f"x{i}", [i + 1, 1.0], i % 2) for i in range(6)]
    produce(s, reqs)
    env = dict(os.environ, UNLEARN_TOPIC_PREFIX=s.topic_prefix, UNLEARN_PROFILE=s.profile,
               UNLEARN_DATA_DIR=str(tmp_path / "data"))
    code = ("import sys; from unlearn.streams.featurizer.cli import featurizer_main; "
            "sys.exit(featurizer_main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "--bootstrap", s.bootstrap, "--group", "fz-cli",
                             "--max-batch", "4", "--max-ms", "10", "--device", "cpu"],
                            cwd=Path(__file__).resolve().parents[3], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    reader = Reader(s, ("deltas",))
    try:
        got = reader.until(lambda g: len(ledgers_from(g["deltas"])[1]) >= 6, timeout=60)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        reader.close()
        if proc.poll() is None:
            proc.kill()
    log = out.decode(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    # one readiness line (after the assignment), and a clean stop: no traceback, nothing at ERROR
    ready = [line for line in log.splitlines() if "unlearn featurizer ready" in line]
    assert len(ready) == 1 and "group='fz-cli'" in ready[0] and f"requests_topic={s.topic('requests')!r}" in ready[0]
    assert "Traceback" not in log and "[ERROR]" not in log, log[-3000:]
    assert sorted(ledgers_from(got["deltas"])[1]) == sorted(f"a{i}" for i in range(6))
    committed = committed_offsets(s, "fz-cli", s.topic("requests"))
    assert sum(o for o in committed.values() if o > 0) == len(reqs)


def test_cli_rejects_bad_arguments(tmp_path: Path) -> None:
    from unlearn.streams.featurizer.cli import featurizer_main

    assert featurizer_main(["--no-such-flag"]) == 2
    assert featurizer_main(["--loglevel", "chatty"]) == 2
    assert featurizer_main(["--bootstrap", "127.0.0.1:1", "--federated"]) == 2  # no --client-id
    assert featurizer_main(["--bootstrap", "127.0.0.1:1", "--client-id", "x"]) == 2  # not federated
