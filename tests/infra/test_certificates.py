"""The secured Kafka's certificates without a broker (infra/certificates.py): a throwaway TLS
directory checks out and names the hosts; the CA's key is never written; the operator's files are
kept and each way they cannot work is named with its file; generated ones are reused while valid
and replaced before they expire."""

from __future__ import annotations

import datetime as dt
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import pkcs12

from unlearn.infra.certificates import (
    BROKER_NAME,
    CertificateError,
    TlsDir,
    certs_main,
    check_tls_dir,
    ensure_tls_dir,
    generate_tls_dir,
    issue,
    keystore_of,
    make_ca,
)

SUBJECT = f"CN={BROKER_NAME},O=unlearn"


def test_a_generated_directory_checks_out(tmp_path: Path) -> None:
    tls = generate_tls_dir(tmp_path / "tls", [1, 2, 3], ["127.0.0.1", "localhost"])
    assert check_tls_dir(tls, [1, 2, 3], ["127.0.0.1", "localhost"]) == SUBJECT
    assert sorted(p.name for p in tls.path.iterdir()) == ["ca.pem", "keystore.password", "node-1.p12",
                                                         "node-2.p12", "node-3.p12"]  # no CA key
    for p in (tls.password_file, tls.node(1)):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    key, cert, chain = pkcs12.load_key_and_certificates(tls.node(2).read_bytes(), tls.password().encode())
    assert key is not None and cert is not None and len(chain) == 1  # the leaf, then the CA
    with pytest.raises(CertificateError, match=r"node 1 keystore .*node-1.p12: the certificate does not name "
                                               r"'kafka'"):
        check_tls_dir(tls, [1], ["kafka"])


def test_the_operators_files_are_checked_and_kept(tmp_path: Path) -> None:
    tls = generate_tls_dir(tmp_path / "mine", [1], ["kafka"])
    before = {p.name: p.read_bytes() for p in tls.path.iterdir()}
    assert ensure_tls_dir(tls.path, [1], ["kafka"]) == (tls, SUBJECT)  # no .generated marker: the operator's
    assert {p.name: p.read_bytes() for p in tls.path.iterdir()} == before
    with pytest.raises(CertificateError, match=r"node 2 keystore .*node-2.p12: cannot read it"):
        ensure_tls_dir(tls.path, [1, 2], ["kafka"])  # never made for them


def test_each_cause_is_named(tmp_path: Path) -> None:
    tls = generate_tls_dir(tmp_path / "tls", [1], ["kafka"])
    password = tls.password()
    (tmp_path / "tls" / "keystore.password").write_text("wrong\n")
    with pytest.raises(CertificateError, match=r"node-1.p12: not a PKCS#12 keystore, or .*keystore.password is "
                                               "not its password"):
        check_tls_dir(tls, [1], ["kafka"])
    (tmp_path / "tls" / "keystore.password").write_text(password)
    # a keystore from another CA than ca.pem
    other_key, other_ca = make_ca("other CA")
    key, cert = issue(other_key, other_ca, BROKER_NAME, ["kafka"])
    tls.node(1).write_bytes(keystore_of(key, cert, other_ca, password))
    with pytest.raises(CertificateError, match=r"node-1.p12: not issued by a CA in .*ca.pem \(its issuer is "
                                               r"CN=other CA,O=unlearn\)"):
        check_tls_dir(tls, [1], ["kafka"])
    # an expired node certificate
    ca_key, ca_cert = make_ca()
    (tmp_path / "tls" / "ca.pem").write_bytes(pem_bytes(ca_cert))
    key, cert = issue(ca_key, ca_cert, BROKER_NAME, ["kafka"], days=1,
                      now=dt.datetime.now(dt.UTC) - dt.timedelta(days=3))
    tls.node(1).write_bytes(keystore_of(key, cert, ca_cert, password))
    with pytest.raises(CertificateError, match=r"node-1.p12: the certificate expired on"):
        check_tls_dir(tls, [1], ["kafka"])
    (tmp_path / "tls" / "ca.pem").write_text("not a certificate\n")
    with pytest.raises(CertificateError, match=r"CA file .*ca.pem: no PEM certificate in it"):
        check_tls_dir(tls, [1], ["kafka"])


def pem_bytes(cert: object) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    assert isinstance(cert, x509.Certificate)
    return cert.public_bytes(serialization.Encoding.PEM)


def test_generated_files_are_reused_while_valid_and_replaced_before_expiry(tmp_path: Path) -> None:
    tls, _ = ensure_tls_dir(tmp_path / "tls", [1], ["127.0.0.1"])
    ca = tls.ca.read_bytes()
    assert ensure_tls_dir(tmp_path / "tls", [1], ["127.0.0.1"])[0].ca.read_bytes() == ca  # a restart keeps the CA
    assert ensure_tls_dir(tmp_path / "tls", [1], ["127.0.0.1"], min_days=400)[0].ca.read_bytes() != ca  # expiring


def test_unlearn_certs_makes_the_compose_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = certs_main(["--dir", str(tmp_path / "tls"), "--host", "kafka", "--host", "localhost",
                     "--ca-copy", str(tmp_path / "ca.pem")])
    assert rc == 0 and f"subject={SUBJECT}" in capsys.readouterr().out
    assert (tmp_path / "ca.pem").read_bytes() == TlsDir(tmp_path / "tls").ca.read_bytes()
    assert certs_main(["--dir", str(tmp_path / "tls"), "--host", "elsewhere"]) == 0  # ours: made anew for it
    (tmp_path / "tls" / ".generated").unlink()  # now it is "the operator's": checked, refused, kept
    assert certs_main(["--dir", str(tmp_path / "tls"), "--host", "kafka"]) == 1
    assert "does not name 'kafka'" in capsys.readouterr().err


def test_a_ca_bundle_trusts_old_and_new_during_a_rotation(tmp_path: Path) -> None:
    """docs/security.md, rotation: ca.pem holds the old and the new CA while keystores move over."""
    tls = generate_tls_dir(tmp_path / "tls", [1, 2], ["kafka"])
    old = tls.ca.read_bytes()
    new_key, new_ca = make_ca("new CA")
    tls.ca.write_bytes(old + pem_bytes(new_ca))
    assert check_tls_dir(tls, [1, 2], ["kafka"]) == SUBJECT  # both nodes still on the old CA
    key, cert = issue(new_key, new_ca, BROKER_NAME, ["kafka"])
    tls.node(2).write_bytes(keystore_of(key, cert, new_ca, tls.password()))
    assert check_tls_dir(tls, [1, 2], ["kafka"]) == SUBJECT  # one moved: the same principal
    tls.ca.write_bytes(pem_bytes(new_ca))  # the old CA dropped too early
    with pytest.raises(CertificateError, match=r"node-1\.p12: not issued by a CA in"):
        check_tls_dir(tls, [1, 2], ["kafka"])


def test_the_secured_broker_does_not_start_on_operator_files_that_cannot_work(tmp_path: Path) -> None:
    """`unlearn broker --engine kafka --secure --tls-dir DIR`: checked before any node starts."""
    from unlearn.infra.local.secured_kafka import SecuredLocalKafka
    from unlearn.infra.local.tansu import BrokerError

    tls = generate_tls_dir(tmp_path / "mine", [1], ["kafka"])  # not the 127.0.0.1 the node listens on
    with pytest.raises(BrokerError, match=r"TLS: node 1 keystore .*node-1.p12: the certificate does not name "
                                          r"'127.0.0.1'"):
        SecuredLocalKafka(1, admin_password="a", tls_dir=tls.path).start()
