"""Broker security settings without a broker: every client kind gets the same security config
from the typed settings, impossible combinations fail at start-up naming the variable, and
secrets never show in a repr (which is what logs print)."""

from __future__ import annotations

from pathlib import Path

import pytest

from unlearn.infra.profiles import admin_config, consumer_config, producer_config, security_config
from unlearn.infra.settings import Settings


def test_plaintext_adds_nothing() -> None:
    s = Settings(bootstrap="b:9092")
    assert security_config(s) == {}
    assert "security.protocol" not in producer_config(s)


def test_sasl_scram_over_tls_reaches_every_client(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    s = Settings.from_env(bootstrap="b:9093", profile="kafka", security_protocol="SASL_SSL",
                          sasl_mechanism="SCRAM-SHA-512", sasl_username="ledger", sasl_password="s3cret",
                          ssl_ca_location=str(ca))
    want = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ledger",
            "sasl.password": "s3cret", "ssl.ca.location": str(ca)}
    for conf in (producer_config(s), consumer_config(s, "g"), admin_config(s)):
        assert {k: conf[k] for k in want} == want
    assert "s3cret" not in repr(s)


def test_mtls_needs_certificate_and_key(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    s = Settings(bootstrap="b").with_(security_protocol="SSL", ssl_certificate_location=str(cert),
                                      ssl_key_location=str(key), ssl_key_password="pw")
    assert security_config(s)["ssl.key.location"] == str(key) and "pw" not in repr(s)
    with pytest.raises(ValueError, match="both UNLEARN_SSL_CERTIFICATE_LOCATION and UNLEARN_SSL_KEY_LOCATION"):
        s.with_(ssl_key_location="")


@pytest.mark.parametrize(("changes", "message"), [
    ({"security_protocol": "TLS"}, "UNLEARN_SECURITY_PROTOCOL must be one of"),
    ({"security_protocol": "SASL_SSL"}, "needs UNLEARN_SASL_MECHANISM"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "GSSAPI", "sasl_username": "u",
      "sasl_password": "p"}, "UNLEARN_SASL_MECHANISM must be"),
    ({"sasl_username": "u"}, "UNLEARN_SASL_\\* is set but"),
    ({"ssl_ca_location": "/etc/hosts"}, "UNLEARN_SSL_\\* is set but"),
    ({"security_protocol": "SSL", "ssl_ca_location": "/no/such/ca.pem"}, "is not a readable file"),
])
def test_impossible_security_settings_fail_naming_the_variable(changes: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(bootstrap="b").with_(**changes)
