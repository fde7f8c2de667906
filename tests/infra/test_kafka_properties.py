"""Broker security without a broker: the Kafka client properties file (``UNLEARN_KAFKA_PROPERTIES``)
is read with Java's syntax, every client kind gets the same security config from it, a file that
cannot work fails at start naming the file, line and key, and secrets never show in a repr or an
error (which is what logs print)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from unlearn.infra.kafka_properties import PropertiesError, client_security, read_properties
from unlearn.infra.settings import SecuritySettings, Settings, security_config
from unlearn.runtime.clients import admin_config, consumer_config, producer_config


def _file(tmp_path: Path, text: str, name: str = "client.properties") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _pem(tmp_path: Path, name: str, **ca: Any) -> str:
    """A file holding a real certificate (a fresh CA's; ``days``/``now`` make it expire)."""
    from cryptography.hazmat.primitives import serialization

    from unlearn.infra.certificates import make_ca

    path = tmp_path / name
    path.write_bytes(make_ca(**ca)[1].public_bytes(serialization.Encoding.PEM))
    return str(path)


def test_plaintext_adds_nothing() -> None:
    s = Settings(bootstrap="b:9092")
    assert security_config(s) == {}
    assert "security.protocol" not in producer_config(s)


def test_the_java_properties_syntax(tmp_path: Path) -> None:
    path = _file(tmp_path, "# kafka-topics.sh --command-config this-file\n"
                           "! another comment\n"
                           "\n"
                           "   security.protocol = SASL_PLAINTEXT\r\n"
                           "sasl.mechanism: SCRAM-SHA-512\n"
                           "sasl.username ledger\n"
                           "sasl.password=pa\\\n"
                           "    ss=w:rd\\u00e9 \n")
    props = read_properties(path)
    assert {k: p.value for k, p in props.items()} == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ledger",
        "sasl.password": "pass=w:rd\u00e9 "}  # a continued line; '=' and ':' inside a value; trailing blank kept
    assert [p.line for p in props.values()] == [4, 5, 6, 7]
    assert "w:rd" not in repr(props)


def test_sasl_scram_over_tls_reaches_every_client(tmp_path: Path) -> None:
    ca = _pem(tmp_path, "ca.pem")
    path = _file(tmp_path, f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=ledger\n"
                           f"sasl.password=s3cret\nssl.ca.location={ca}\n")
    s = Settings.from_env({"UNLEARN_BOOTSTRAP": "b:9093", "UNLEARN_PROFILE": "kafka",
                           "UNLEARN_KAFKA_PROPERTIES": path})
    want = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ledger",
            "sasl.password": "s3cret", "ssl.ca.location": ca,
            "ssl.endpoint.identification.algorithm": "https"}  # the host name is always verified
    assert security_config(s) == want
    for conf in (producer_config(s), consumer_config(s, "g"), admin_config(s)):
        assert {k: conf[k] for k in want} == want
    assert "s3cret" not in repr(s) and "s3cret" not in repr(SecuritySettings.of(s))
    assert "s3cret" not in str(s.env_values())  # a child process gets the path, not the password


def test_mtls_needs_certificate_and_key(tmp_path: Path) -> None:
    cert, key = _pem(tmp_path, "c.pem"), _pem(tmp_path, "k.pem")
    full = _file(tmp_path, f"security.protocol=SSL\nssl.certificate.location={cert}\nssl.key.location={key}\n"
                           "ssl.key.password=pw-secret\n")
    s = Settings(bootstrap="b").with_(kafka_properties=full)
    assert security_config(s)["ssl.key.location"] == key and "pw-secret" not in repr(s)
    half = _file(tmp_path, f"security.protocol=SSL\nssl.certificate.location={cert}\n", "half.properties")
    with pytest.raises(ValueError, match=r"half.properties:2: mTLS needs both ssl.certificate.location and "
                                         r"ssl.key.location"):
        s.with_(kafka_properties=half)


SASL = "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\n"


@pytest.mark.parametrize(("text", "message"), [
    ("security.protocol=TLS\n", r":1: security.protocol must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, "
                                r"got 'TLS'"),
    ("\nsecurity.protocol=SASL_SSL\nsasl.username=u\n",
     r":2: security.protocol=SASL_SSL needs sasl.mechanism, sasl.password"),
    (SASL.replace("PLAIN\n", "GSSAPI\n"), r":2: sasl.mechanism must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    ("sasl.username=u\n", r":1: sasl.username is set but security.protocol is PLAINTEXT, not SASL_PLAINTEXT "
                          r"or SASL_SSL"),
    ("security.protocol=SASL_PLAINTEXT\n", r"needs sasl.mechanism, sasl.username, sasl.password"),
    (SASL + "ssl.ca.location=/etc/hosts\n", r":5: ssl.ca.location is set but security.protocol is SASL_PLAINTEXT, "
                                            r"not SSL or SASL_SSL"),
    ("security.protocol=SSL\n\nssl.ca.location=/no/such/ca.pem\n",
     r":3: ssl.ca.location='/no/such/ca.pem' is not a readable file"),
    ("security.protocol=SSL\nssl.key.password=pw\n", r":2: ssl.key.password without ssl.key.location"),
    ("sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n",
     r":1: sasl.jaas.config is Java-only: librdkafka clients take sasl.username and sasl.password"),
    ("security.protocol=SSL\nssl.truststore.location=/x.jks\n",
     r":2: ssl.truststore.location is Java-only: librdkafka clients take ssl.ca.location"),
    ("security.protocol=SSL\nssl.keystore.password=x\n",
     r":2: ssl.keystore.password is Java-only: .* ssl.key.password"),
    ("security.protocol=SSL\nrequest.timeout.ms=5\n", r":2: request.timeout.ms is not a security key"),
    ("security.protocol=SSL\nsecurity.protocol=SASL_SSL\n", r":2: security.protocol is already set on line 1"),
    ("security.protocol=SSL\nsasl.username\n", r":2: expected key=value"),
    ("security.protocol=SSL\nssl.endpoint.identification.algorithm=none\n",
     r":2: ssl.endpoint.identification.algorithm cannot be set: the broker's host name is always verified"),
    ("security.protocol=SSL\nenable.ssl.certificate.verification=false\n",
     r":2: enable.ssl.certificate.verification cannot be set"),
    ("security.protocol=SSL\nssl.ca.location=/etc/hostname\n",
     r":2: ssl.ca.location /etc/hostname: no PEM certificate in it"),
    ("=SSL\n", r":1: expected key=value \(the key is empty\)"),
    (SASL.replace("=p\n", "=p\\u00zz\n"), r":4: malformed \\uXXXX escape"),
])
def test_a_file_that_cannot_work_names_the_file_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(PropertiesError, match=message) as exc:
        client_security(path)
    assert str(exc.value).startswith(f"{path}") and "p\\u00zz" not in str(exc.value)
    with pytest.raises(ValueError, match=f"UNLEARN_KAFKA_PROPERTIES: {path}.*{message}"):
        Settings(bootstrap="b").with_(kafka_properties=path)


def test_an_unreadable_file_names_its_path(tmp_path: Path) -> None:
    s = Settings.from_env({"UNLEARN_KAFKA_PROPERTIES": str(tmp_path / "none.properties")})
    with pytest.raises(ValueError, match=f"UNLEARN_KAFKA_PROPERTIES: {tmp_path}/none.properties: cannot read it"):
        SecuritySettings.of(s)
    bad = tmp_path / "latin1.properties"
    bad.write_bytes(b"sasl.password=\xe9\n")
    with pytest.raises(PropertiesError, match=f"{bad}: not UTF-8 text"):
        client_security(str(bad))


def test_a_password_is_never_in_an_error(tmp_path: Path) -> None:
    path = _file(tmp_path, "sasl.password=hunter2-secret\n")
    with pytest.raises(PropertiesError) as exc:
        client_security(path)
    assert "sasl.password is set but" in str(exc.value) and "hunter2" not in str(exc.value)


def test_an_expired_certificate_fails_at_start_naming_file_and_date(tmp_path: Path) -> None:
    old = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    ca = _pem(tmp_path, "old-ca.pem", days=30, now=old)
    path = _file(tmp_path, f"security.protocol=SSL\nssl.ca.location={ca}\n")
    with pytest.raises(ValueError, match=f"UNLEARN_KAFKA_PROPERTIES: {path}:2: ssl.ca.location {ca}: the "
                                         "certificate expired on 2020-01-31"):
        Settings(bootstrap="b").with_(kafka_properties=path)
    cert, key = _pem(tmp_path, "c.pem", days=30, now=old), _pem(tmp_path, "k.pem")
    mtls = _file(tmp_path, f"security.protocol=SSL\nssl.certificate.location={cert}\nssl.key.location={key}\n")
    with pytest.raises(PropertiesError, match=r":2: ssl.certificate.location .*expired on 2020-01-31"):
        client_security(mtls)
