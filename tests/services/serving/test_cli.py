"""``unlearn serve``: the shared worker options, one readiness line, a clean SIGTERM stop."""

from __future__ import annotations

import socket
import time
import urllib.error
from pathlib import Path

import pytest

from tests.services.serving.support import Publisher, http, make_head, wait_version
from unlearn.infra.settings import Settings
from unlearn.services.serving.cli import serve_main


def test_serve_cli_starts_and_stops(settings: Settings, publish: Publisher, tmp_path: Path) -> None:
    from unlearn.infra.processes import ServiceProcess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    publish(make_head(5, "exact", seed=5))
    proc = ServiceProcess("serve", ["serve", "--port", str(port), "--data-dir", str(tmp_path / "data")], settings,
                          tmp_path).start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if http("GET", f"{url}/healthz", timeout=2)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, proc.log_tail()
            time.sleep(0.1)
        assert wait_version(url, "h", 5)["mode"] == "exact"
    finally:
        code = proc.stop()
    assert code == 0, proc.log_tail()
    log = proc.log_path.read_text()
    ready = [line for line in log.splitlines() if "unlearn serve ready" in line]
    assert len(ready) == 1, log
    assert f"url='http://127.0.0.1:{port}'" in ready[0] and "heads_topics='^" in ready[0]
    assert "[INFO] unlearn.serve:" in ready[0]  # the shared log format (infra.cli_args.setup_logging)
    assert "Traceback" not in log and "ERROR" not in log, log  # a clean stop


def test_serve_cli_usage_errors(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("UNLEARN_BOOTSTRAP", raising=False)
    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    assert serve_main([]) == 2
    assert "no broker" in capsys.readouterr().err
    assert serve_main(["--bootstrap", "127.0.0.1:1", "--loglevel", "chatty"]) == 2
    assert serve_main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--bootstrap", "--prefix", "--profile", "--data-dir", "--loglevel", "--port", "--host"):
        assert flag in out


def test_serve_cli_cannot_bind(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        code = serve_main(["--bootstrap", "127.0.0.1:1", "--port", str(port), "--loglevel", "error"])
    assert code == 1 and "cannot listen" in capsys.readouterr().err
