"""Settings sections without a broker: every section validates itself naming the variable, a
process reads a section from the environment captured at start, ``with_`` reaches any section,
a child process gets the same settings, each command's ``--help`` lists its variables, and a
variable that no section reads draws a warning with the closest real name."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import MISSING
from pathlib import Path

import pytest

from unlearn.infra.processes import settings_env
from unlearn.infra.settings import (
    ErasureSettings,
    HeadSettings,
    LocalBrokerSettings,
    Section,
    SecuritySettings,
    Settings,
    all_sections,
    names_of,
    owner_of,
    unknown_variables,
    variable,
)
from unlearn.services.audit.settings import AuditSettings
from unlearn.services.cli import main
from unlearn.services.client.settings import ClientSettings
from unlearn.services.serving.settings import ServeSettings
from unlearn.services.verifier.settings import VerifySettings
from unlearn.streams.featurizer.settings import FeaturizerSettings
from unlearn.streams.ledger.settings import LedgerSettings

#: One impossible value per section, and the variable its error must name.
BAD = [
    (Settings, {"profile": "redpanda"}, "UNLEARN_PROFILE"),
    (SecuritySettings, {"kafka_properties": "/no/such/client.properties"}, "UNLEARN_KAFKA_PROPERTIES"),
    (HeadSettings, {"frac_bits": 31}, "UNLEARN_FRAC_BITS"),
    (HeadSettings, {"head_gammas": "faces=-1"}, "UNLEARN_HEAD_GAMMAS"),
    (ErasureSettings, {"segment_ms": 10}, "UNLEARN_SEGMENT_MS"),
    (FeaturizerSettings, {"batch_max_events": 0}, "UNLEARN_BATCH_MAX_EVENTS"),
    (FeaturizerSettings, {"tombstone_retention_seconds": 10.0}, "UNLEARN_TOMBSTONE_RETENTION_SECONDS"),
    (LedgerSettings, {"heads_retire_seconds": 1.0}, "UNLEARN_HEADS_RETIRE_SECONDS"),
    (ClientSettings, {"transit_seal": "sometimes"}, "UNLEARN_TRANSIT_SEAL"),
    (ServeSettings, {"serve_port": 70000}, "UNLEARN_SERVE_PORT"),
    (AuditSettings, {"audit_basic": "no-colon"}, "UNLEARN_AUDIT_BASIC"),
    (VerifySettings, {"verify_tolerance": 0.0}, "UNLEARN_VERIFY_TOLERANCE"),
]

#: The sections each long-running command and client command loads, after Settings and SecuritySettings.
COMMAND_SECTIONS: dict[str, tuple[type[Section], ...]] = {
    "featurizer": (HeadSettings, FeaturizerSettings, ErasureSettings),
    "ledger": (HeadSettings, LedgerSettings, ErasureSettings),
    "serve": (HeadSettings, ServeSettings),
    "verify": (HeadSettings, VerifySettings),
    "add": (ClientSettings, ErasureSettings),
    "delete": (ClientSettings, ErasureSettings),
    "delete-subject": (ClientSettings, ErasureSettings),
    "head": (),
    "topics": (ErasureSettings,),
    "erasure-report": (ErasureSettings,),
    "audit": (HeadSettings, ErasureSettings, AuditSettings),
}


@pytest.mark.parametrize(("section", "values", "name"), BAD, ids=[b[2] for b in BAD])
def test_each_section_names_the_variable_it_refuses(section: type[Section], values: dict[str, object],
                                                    name: str) -> None:
    with pytest.raises(ValueError, match=name):
        section(**values)  # type: ignore[arg-type]
    env = {variable(k): str(v) for k, v in values.items()}
    with pytest.raises(ValueError, match=name):
        Settings.from_env(env).section(section)
    with pytest.raises(ValueError, match=name):
        Settings().with_(**values)


def test_a_value_of_the_wrong_type_names_its_variable() -> None:
    for cls in all_sections():
        for f in cls.settings_fields():
            if isinstance(f.default, (int, float)) and not isinstance(f.default, bool):
                with pytest.raises(ValueError, match=f"{variable(f.name)}='many' is not a valid"):
                    cls.from_env({variable(f.name): "many"})


def test_every_setting_has_one_section_a_default_and_a_help_line() -> None:
    names = [f.name for cls in all_sections() for f in cls.settings_fields()]
    assert len(names) == len(set(names))
    for cls in all_sections():
        cls()  # the defaults are valid
        for f in cls.settings_fields():
            assert owner_of(f.name) is cls and f.default is not MISSING and f.metadata["help"]


def test_a_section_is_read_once_from_the_environment_captured_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNLEARN_BATCH_MAX_EVENTS", "7")
    monkeypatch.setenv("UNLEARN_TOPIC_PREFIX", "p.")
    s = Settings.from_env()
    monkeypatch.setenv("UNLEARN_BATCH_MAX_EVENTS", "9")  # after start: not seen
    assert (s.topic("requests"), FeaturizerSettings.of(s).batch_max_events) == ("p.requests", 7)
    assert FeaturizerSettings.of(s) is FeaturizerSettings.of(s)
    assert FeaturizerSettings.of(Settings()).batch_max_events == 256  # explicit settings: defaults


def test_with_reaches_any_section_and_keeps_the_rest() -> None:
    s = Settings(topic_prefix="a.").with_(batch_max_events=5, frac_bits=12, reset_every_events=7)
    assert s.topic_prefix == "a."
    assert (FeaturizerSettings.of(s).batch_max_events, HeadSettings.of(s).frac_bits) == (5, 12)
    assert LedgerSettings.of(s.with_(topic_prefix="b.")).reset_every_events == 7
    with pytest.raises(TypeError, match="UNLEARN_BATCH_MAX_EVENT does not exist"):
        s.with_(batch_max_event=5)


def test_a_bound_across_sections_is_checked() -> None:
    with pytest.raises(ValueError, match="UNLEARN_STATE_ROTATE_BYTES must be at least UNLEARN_CHANGELOG_MAX_BYTES"):
        Settings(changelog_max_bytes=200_000).with_(state_rotate_bytes=100_000)
    with pytest.raises(ValueError, match="UNLEARN_STATE_ROTATE_BYTES"):
        LedgerSettings.of(Settings.from_env({"UNLEARN_CHANGELOG_MAX_BYTES": "100000000"}))


def test_a_child_process_gets_the_same_settings(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=pw\n")
    s = Settings(bootstrap="b:1", topic_prefix="c.").with_(frac_bits=20, seal_rows=False, serve_port=0,
                                                          kafka_properties=str(props))
    env = settings_env(s, base={})
    assert "pw" not in env.values()  # the child reads the file; the password is not in its environment
    again = Settings.from_env(env)
    assert again == s
    for cls in all_sections():
        assert again.section(cls) == s.section(cls), cls
    assert SecuritySettings.of(again).client_config == SecuritySettings.of(s).client_config


def test_kafka_bootstrap_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNLEARN_BOOTSTRAP", raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "k:9092")
    assert Settings.from_env().bootstrap == "k:9092"
    monkeypatch.setenv("UNLEARN_BOOTSTRAP", "u:9092")
    assert Settings.from_env().bootstrap == "u:9092"


@pytest.mark.parametrize("command", sorted(COMMAND_SECTIONS))
def test_help_lists_every_variable_of_the_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main([command, "--help"])
    except SystemExit as exc:  # argparse's exit, where a command does not turn it into a return code
        code = int(exc.code or 0)
    assert code == 0
    out = capsys.readouterr().out
    missing = [v for v in names_of((Settings, SecuritySettings, *COMMAND_SECTIONS[command])) if v not in out]
    assert not missing, missing


def test_broker_help_lists_the_local_broker_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["broker", "--help"])
    out = capsys.readouterr().out
    assert all(v in out for v in names_of([LocalBrokerSettings])) and "UNLEARN_BOOTSTRAP" not in out


def test_a_misspelt_variable_is_a_warning_with_the_real_name() -> None:
    env = {"UNLEARN_BATCH_MAX_EVENT": "5", "UNLEARN_FRAC_BITS": "20", "UNLEARN_LEDGER_PASSWORD": "x",
           "UNLEARN_TEST_BROKER": "tansu", "PATH": "/bin"}
    assert unknown_variables(env) == [
        "UNLEARN_BATCH_MAX_EVENT is not a setting (did you mean UNLEARN_BATCH_MAX_EVENTS?)"]
    done = subprocess.run([sys.executable, "-m", "unlearn.services.cli", "head", "--help"], capture_output=True,
                          text=True, env={**env, "PYTHONPATH": ":".join(sys.path)}, timeout=60)
    assert done.returncode == 0, done.stderr  # a warning, not a failure: the environment may be shared
    assert "warning: UNLEARN_BATCH_MAX_EVENT is not a setting (did you mean UNLEARN_BATCH_MAX_EVENTS?)" in done.stderr


def test_the_configuration_doc_lists_every_variable_and_no_other() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    named = set(re.findall(r"UNLEARN_[A-Z0-9_]*[A-Z0-9]", doc))
    every = set(names_of(all_sections()))
    assert every <= named, sorted(every - named)
    assert named - every <= {"UNLEARN_BATCH_MAX_EVENT"}, sorted(named - every)  # the doc's typo example
