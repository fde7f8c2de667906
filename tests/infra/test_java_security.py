"""The Java client's security config from the librdkafka one (infra/java_security.py), with the
rules of clients/java's KafkaSecurity.java, and how `unlearn cdc` hands it to Kafka Connect: the
worker and its producer./consumer./admin. clients, in owner-only files of a private temporary
directory that is removed, never on the command line. No broker here: tests/infra/
test_secured_kafka.py runs `unlearn cdc` as `cdc` on the secured broker."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from unlearn.infra.java_security import (
    CONNECT_PREFIXES,
    connect_security,
    java_security,
    properties_text,
    write_private_properties,
)
from unlearn.infra.kafka_properties import read_properties

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


def test_sasl_ssl_scram_becomes_jaas_and_a_pem_truststore() -> None:
    got = java_security({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                         "sasl.username": "cdc", "sasl.password": "s3cret", "ssl.ca.location": "/ca/ca.pem",
                         "ssl.endpoint.identification.algorithm": "https"})
    assert got == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                   "sasl.jaas.config": f'{SCRAM} required username="cdc" password="s3cret";',
                   "ssl.endpoint.identification.algorithm": "https",
                   "ssl.truststore.type": "PEM", "ssl.truststore.location": "/ca/ca.pem"}


def test_jaas_quotes_backslashes_and_quotes_and_plain_uses_its_module() -> None:
    got = java_security({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                         "sasl.username": 'a"b', "sasl.password": 'p\\"w'})
    assert got == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                   "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                       'username="a\\"b" password="p\\\\\\"w";'}
    assert "ssl.endpoint.identification.algorithm" not in got  # no TLS, no TLS keys


def test_plaintext_and_an_empty_config() -> None:
    assert java_security({}) == {"security.protocol": "PLAINTEXT"}
    assert java_security({"security.protocol": "PLAINTEXT"}) == {"security.protocol": "PLAINTEXT"}


def test_tls_always_verifies_the_host_name_and_mtls_is_inline_pem(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nBBB\n-----END ENCRYPTED PRIVATE KEY-----\n")
    got = java_security({"security.protocol": "SSL", "ssl.certificate.location": str(cert),
                         "ssl.key.location": str(key), "ssl.key.password": "kp"})
    assert got == {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "https",
                   "ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": cert.read_text(),
                   "ssl.keystore.key": key.read_text(), "ssl.key.password": "kp"}


@pytest.mark.parametrize(("config", "message"), [
    ({"security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": "p"}, "needs sasl.mechanism"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.password": "p"},
     "needs sasl.username"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u"},
     "needs sasl.password"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "p"},
     "sasl.mechanism must be one of"),
    ({"security.protocol": "TLS"}, "security.protocol must be one of"),
    ({"security.protocol": "SSL", "ssl.certificate.location": "/c.pem"}, "mTLS needs both"),
    ({"security.protocol": "SSL", "ssl.certificate.location": "/nope/c.pem", "ssl.key.location": "/nope/k.pem"},
     "is not a readable file"),
])
def test_what_cannot_work_is_refused(config: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        java_security(config)


def test_connect_gets_it_for_the_worker_and_each_client_prefix() -> None:
    config = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "cdc",
              "sasl.password": "pw", "ssl.ca.location": "/ca.pem"}
    java = java_security(config)
    got = connect_security(config)
    assert CONNECT_PREFIXES == ("", "producer.", "consumer.", "admin.")
    assert got == {p + k: v for p in CONNECT_PREFIXES for k, v in java.items()}
    assert got["producer.sasl.jaas.config"] == got["sasl.jaas.config"] == \
        f'{SCRAM} required username="cdc" password="pw";'


def test_properties_text_reads_back_exactly(tmp_path: Path) -> None:
    """What Java's Properties.load reads (ISO-8859-1 with escapes), checked with the project's own
    reader of that syntax (infra/kafka_properties.py)."""
    conf = {"sasl.jaas.config": f'{SCRAM} required username="u" password="a=b:c\\d#e!f";',
            "k with space": " leading blank", "#hash": "!bang", "uni": "pässwörd-€-😀", "nl": "a\nb\tc",
            "empty": ""}
    text = properties_text(conf)
    assert text.isascii() and text.count("\n") == len(conf)
    path = tmp_path / "x.properties"
    path.write_text(text)
    # Java strings are UTF-16: a character beyond the BMP is two \\u escapes (a surrogate pair)
    def utf16(v: str) -> str:
        return v.encode("utf-16-le", "surrogatepass").decode("utf-16-le")

    assert {k: utf16(p.value) for k, p in read_properties(str(path)).items()} == conf
    assert "\\ud83d\\ude00" in text


def test_private_properties_are_owner_only_and_never_overwritten(tmp_path: Path) -> None:
    old = os.umask(0o000)  # even a permissive umask does not widen the mode
    try:
        path = write_private_properties(tmp_path / "w.properties", {"sasl.password": "x"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        write_private_properties(path, {"a": "b"})


def _settings(tmp_path: Path, password: str) -> Any:
    from unlearn.infra.certificates import generate_tls_dir
    from unlearn.infra.settings import Settings

    tls = generate_tls_dir(tmp_path / "tls", [1], ["localhost"])
    ca = tmp_path / "tls" / "ca.pem"
    assert ca.is_file(), tls
    props = tmp_path / "cdc.properties"
    props.write_text(f"security.protocol=SASL_SSL\nssl.ca.location={ca}\nsasl.mechanism=SCRAM-SHA-512\n"
                     f"sasl.username=cdc\nsasl.password={password}\n")
    return Settings.from_env({}, bootstrap="localhost:9093", profile="kafka", kafka_properties=str(props)), ca


def test_connect_process_keeps_secrets_off_argv_and_removes_its_files(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from unlearn.services.cdc import connect

    password = "pw-never-on-argv"
    settings, ca = _settings(tmp_path, password)
    worker = connect.worker_config(settings, tmp_path / "state", 0, 1000)
    for prefix in CONNECT_PREFIXES:
        assert worker[prefix + "security.protocol"] == "SASL_SSL"
        assert worker[prefix + "sasl.jaas.config"] == \
            f'{SCRAM} required username="cdc" password="{password}";'
        assert worker[prefix + "ssl.truststore.location"] == str(ca)
        assert worker[prefix + "ssl.truststore.type"] == "PEM"
        assert worker[prefix + "ssl.endpoint.identification.algorithm"] == "https"
    assert worker["bootstrap.servers"] == "localhost:9093"
    assert worker["offset.storage.file.filename"] == str(tmp_path / "state" / "connect.offsets")
    pg = connect.PgTarget.parse("postgresql://repl:db-secret@localhost:5432/app")
    connector = connect.connector_config("c", pg, "public.t", "p.cdc", "slot")

    started: list[list[str]] = []
    seen: dict[str, tuple[int, str]] = {}

    class FakePopen:
        def __init__(self, cmd: list[str], **_: Any) -> None:
            started.append(cmd)
            for arg in cmd[-2:]:
                seen[Path(arg).name] = (stat.S_IMODE(os.stat(arg).st_mode), Path(arg).read_text())
            seen["dir"] = (stat.S_IMODE(os.stat(Path(cmd[-1]).parent).st_mode), "")
            self.pid = 1

        def poll(self) -> int:
            return 0

    monkeypatch.setattr(connect.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(connect, "find_java", lambda: "java")
    monkeypatch.setattr(connect, "terminate", lambda proc, grace: None)
    proc = connect.ConnectProcess(tmp_path / "jars", tmp_path / "state", worker, connector)
    proc.start()
    (cmd,) = started
    assert not any(password in a or "db-secret" in a for a in cmd)
    assert seen["dir"][0] == 0o700
    assert seen["worker.properties"][0] == seen["connector.properties"][0] == 0o600
    assert "sasl.jaas.config=" in seen["worker.properties"][1] and password in seen["worker.properties"][1]
    assert "database.password=db-secret" in seen["connector.properties"][1]
    config_dir = Path(cmd[-1]).parent
    assert not str(config_dir).startswith(str(tmp_path / "state"))  # not beside the offsets and the log
    assert not list((tmp_path / "state").glob("*.properties"))
    proc.forget_config()  # the task runs: the JVM has read them
    assert not config_dir.exists()
    proc.start()  # a restart writes them again, into a new directory, removed at stop
    assert len(started) == 2 and Path(started[1][-1]).parent.is_dir()
    proc.stop()
    assert not Path(started[1][-1]).parent.exists()


JAVA_CHECK = """
import java.nio.file.Path;
import java.util.Properties;
import java.util.TreeSet;

public class Check {
    public static void main(String[] args) {
        Properties p = dev.unlearn.client.KafkaSecurity.read(Path.of(args[0]));
        for (String k : new TreeSet<>(p.stringPropertyNames())) {
            System.out.println(k + "\\t" + p.getProperty(k).replace("\\\\", "\\\\\\\\").replace("\\n", "\\\\n"));
        }
    }
}
"""


def test_the_rules_are_the_java_clients(tmp_path: Path) -> None:
    """The same properties file through clients/java's KafkaSecurity.java (compiled here) and
    through java_security: the same Java properties, secrets and inline PEM included."""
    import shutil
    import subprocess

    from unlearn.infra.kafka_properties import client_security

    javac = shutil.which("javac")
    if javac is None:
        pytest.skip("no javac")
    source = Path(__file__).resolve().parents[2] / "clients/java/src/main/java/dev/unlearn/client/KafkaSecurity.java"
    (tmp_path / "Check.java").write_text(JAVA_CHECK)
    subprocess.run([javac, "-d", str(tmp_path / "classes"), str(source), str(tmp_path / "Check.java")], check=True,
                   capture_output=True, timeout=120)
    from unlearn.infra.certificates import generate_tls_dir

    tls = generate_tls_dir(tmp_path / "tls", [1], ["localhost"])
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_text(tls.ca.read_text())  # any PEM certificate: the rules only copy it inline
    key.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n")
    files = {
        "scram": f"security.protocol=SASL_SSL\nssl.ca.location={tls.ca}\nsasl.mechanism=SCRAM-SHA-512\n"
                 'sasl.username=cdc\nsasl.password=p\\\\w"d\n',
        "plain": "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=x\n",
        "mtls": f"security.protocol=SSL\nssl.ca.location={tls.ca}\nssl.certificate.location={cert}\n"
                f"ssl.key.location={key}\nssl.key.password=kp\n",
        "plaintext": "",
    }
    for name, text in files.items():
        path = tmp_path / f"{name}.properties"
        path.write_text(text)
        out = subprocess.run(["java", "-cp", str(tmp_path / "classes"), "Check", str(path)], check=True,
                             capture_output=True, text=True, timeout=60).stdout
        java = dict(line.split("\t", 1) for line in out.splitlines())
        java = {k: re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v) for k, v in java.items()}
        assert java_security(client_security(str(path))) == java, name
