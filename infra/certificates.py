"""TLS certificates of the secured Kafka: a throwaway CA made at start, or the operator's own, checked.

The secured broker (``infra/local/secured_kafka.py``, the compose ``certs`` service) needs, per node, a
private key with a certificate whose subject alternative names cover the host clients dial (the
clients verify it: ``ssl.endpoint.identification.algorithm=https``), and one CA file every
client trusts. Without operator files a throwaway CA is generated at start; its private key is
never written anywhere, so nothing can issue another certificate under it once the broker's
certificates exist. Operator files are never overwritten; they are checked at start, and every
problem (missing, not PEM, expired, not issued by the CA, a host the certificate does not name)
is an error that names the file and the cause instead of a TLS handshake failure later.

Layout of a TLS directory (both cases): ``ca.pem`` (the CA certificate, what clients trust),
``node-<id>.p12`` (the node's key and certificate chain, a PKCS#12 keystore: Kafka reads a PEM
keystore file only with an encrypted key in a legacy PBE scheme, PKCS#12 with AES is standard
Java 17) and ``keystore.password`` (the keystores' password; both owner-only).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["BROKER_NAME", "CertificateError", "TlsDir", "check_certificate_file", "certs_main", "check_tls_dir",
           "ensure_tls_dir", "generate_tls_dir", "issue", "keystore_of", "make_ca"]

BROKER_NAME = "unlearn-kafka-broker"
"""The common name of the generated node certificates (their principal on the controller listener)."""
CA_DAYS = 365
NODE_DAYS = 90
_CLOCK_SKEW = dt.timedelta(minutes=5)  # a certificate is valid from a little before it was made


class CertificateError(ValueError):
    """A certificate or key file that cannot work; the message names the file and the cause."""


@dataclass(frozen=True)
class TlsDir:
    """A TLS directory: ``ca.pem``, one ``node-<id>.p12`` per node and ``keystore.password``."""

    path: Path

    @property
    def ca(self) -> Path:
        """The CA certificate clients trust (``ssl.ca.location``; the brokers' PEM truststore)."""
        return self.path / "ca.pem"

    def node(self, node_id: int) -> Path:
        """The node's key and certificate chain (``ssl.keystore.location``, type PKCS12)."""
        return self.path / f"node-{node_id}.p12"

    @property
    def password_file(self) -> Path:
        """The keystores' password (one line)."""
        return self.path / "keystore.password"

    def password(self) -> str:
        """The keystores' password, read from ``keystore.password``."""
        try:
            return self.password_file.read_text().strip()
        except OSError as exc:
            raise CertificateError(f"keystore password file {self.password_file}: cannot read it "
                                   f"({exc.strerror or exc})") from None


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "unlearn"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def make_ca(common_name: str = "unlearn throwaway CA", *, days: int = CA_DAYS,
            now: dt.datetime | None = None) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA key and certificate (P-256, allowed to sign certificates only)."""
    now = now or dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def issue(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, common_name: str, hosts: Sequence[str],
          *, days: int = NODE_DAYS, now: dt.datetime | None = None) -> tuple[ec.EllipticCurvePrivateKey,
                                                                              x509.Certificate]:
    """A key and a certificate signed by the CA for server and client use (a node is both: it
    serves its listeners and dials the controllers), naming ``hosts`` (DNS names or IPs)."""
    now = now or dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_san(hosts), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def keystore_of(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, ca: x509.Certificate,
                password: str) -> bytes:
    """A PKCS#12 keystore of ``key`` and its chain, AES-256 and PBKDF2-SHA256 encrypted."""
    encryption = (serialization.PrivateFormat.PKCS12.encryption_builder().kdf_rounds(100_000)
                  .key_cert_algorithm(pkcs12.PBES.PBESv2SHA256AndAES256CBC).hmac_hash(hashes.SHA256())
                  .build(password.encode()))
    return pkcs12.serialize_key_and_certificates(BROKER_NAME.encode(), key, cert, [ca], encryption)


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def generate_tls_dir(directory: str | os.PathLike[str], node_ids: Sequence[int], hosts: Sequence[str]) -> TlsDir:
    """A throwaway CA and a keystore per node naming ``hosts``, written to ``directory``; the CA's
    key is dropped, so nothing can issue another certificate under it."""
    tls = TlsDir(Path(directory))
    tls.path.mkdir(parents=True, exist_ok=True, mode=0o700)
    password = secrets.token_urlsafe(24)
    ca_key, ca_cert = make_ca()
    _write(tls.password_file, password.encode() + b"\n", 0o600)
    for node_id in node_ids:
        key, cert = issue(ca_key, ca_cert, BROKER_NAME, hosts)
        _write(tls.node(node_id), keystore_of(key, cert, ca_cert, password), 0o600)
    _write(tls.ca, _pem(ca_cert), 0o644)
    return tls


def _load(path: Path, what: str) -> list[x509.Certificate]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CertificateError(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertificateError(f"{what} {path}: no PEM certificate in it") from None
    return certs


def _check_dates(cert: x509.Certificate, where: str, now: dt.datetime) -> None:
    if cert.not_valid_after_utc <= now:
        raise CertificateError(f"{where}: the certificate expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC "
                               f"({cert.subject.rfc4514_string()})")
    if cert.not_valid_before_utc > now + _CLOCK_SKEW:
        raise CertificateError(f"{where}: the certificate is not valid before "
                               f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC ({cert.subject.rfc4514_string()})")


def check_certificate_file(path: str | os.PathLike[str], what: str, now: dt.datetime | None = None) -> None:
    """Fail naming ``path`` unless it holds PEM certificates that are all valid now (a client's
    ``ssl.ca.location`` or ``ssl.certificate.location``, checked before any connection)."""
    now = now or dt.datetime.now(dt.UTC)
    for cert in _load(Path(path), what):
        _check_dates(cert, f"{what} {path}", now)


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except Exception:  # InvalidSignature (no message), a different issuer name, another key type
        return False
    return True


def _covers(cert: x509.Certificate, host: str) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        return ipaddress.ip_address(host) in san.get_values_for_type(x509.IPAddress)
    except ValueError:
        return host.lower() in (n.lower() for n in san.get_values_for_type(x509.DNSName))


def check_tls_dir(tls: TlsDir, node_ids: Sequence[int], hosts: Sequence[str], now: dt.datetime | None = None) -> str:
    """Check a TLS directory (generated or the operator's) for nodes ``node_ids`` dialled as
    ``hosts``; return the nodes' common subject (RFC 4514), their principal on the controller
    listener. Each cause is named with its file: missing, not PEM or PKCS#12, a wrong password,
    expired, not issued by ``ca.pem``, a host not in its names, or nodes with different subjects
    (one principal is the controllers' super user)."""
    now = now or dt.datetime.now(dt.UTC)
    cas = _load(tls.ca, "CA file")  # several during a CA rotation (docs/security.md)
    for ca in cas:
        _check_dates(ca, f"CA file {tls.ca}", now)
    password = tls.password()
    subjects = set()
    for node_id in node_ids:
        path = tls.node(node_id)
        where = f"node {node_id} keystore {path}"
        try:
            key, leaf, _chain = pkcs12.load_key_and_certificates(path.read_bytes(), password.encode())
        except OSError as exc:
            raise CertificateError(f"{where}: cannot read it ({exc.strerror or exc})") from None
        except ValueError:
            raise CertificateError(f"{where}: not a PKCS#12 keystore, or {tls.password_file} is not its "
                                   "password") from None
        if key is None or leaf is None:
            raise CertificateError(f"{where}: needs a private key and its certificate")
        _check_dates(leaf, where, now)
        if not any(_issued_by(leaf, ca) for ca in cas):
            raise CertificateError(f"{where}: not issued by a CA in {tls.ca} (its issuer is "
                                   f"{leaf.issuer.rfc4514_string()})")
        missing = [h for h in hosts if not _covers(leaf, h)]
        if missing:
            raise CertificateError(f"{where}: the certificate does not name {missing[0]!r} in its subject "
                                   "alternative names, so clients verifying the host name would refuse it")
        subjects.add(leaf.subject.rfc4514_string())
    if len(subjects) != 1:
        raise CertificateError(f"{tls.path}: the node certificates have different subjects {sorted(subjects)}; "
                               "they must share one (the controllers' super user)")
    return subjects.pop()


def ensure_tls_dir(directory: str | os.PathLike[str], node_ids: Sequence[int], hosts: Sequence[str], *,
                   min_days: int = 7) -> tuple[TlsDir, str]:
    """The TLS directory to start with and its nodes' subject: the operator's files, checked and
    never changed; else the generated ones while they stay valid ``min_days`` more (a restarted
    persistent cluster keeps its CA, so its clients keep trusting it); else new throwaway ones."""
    tls = TlsDir(Path(directory))
    generated = tls.path / ".generated"
    if tls.ca.exists() and not generated.exists():
        return tls, check_tls_dir(tls, node_ids, hosts)
    if tls.ca.exists():
        try:
            return tls, check_tls_dir(tls, node_ids, hosts,
                                      now=dt.datetime.now(dt.UTC) + dt.timedelta(days=min_days))
        except CertificateError:
            pass  # ours, and about to expire (or for other nodes or hosts): make new ones
    generate_tls_dir(tls.path, node_ids, hosts)
    generated.write_text("made by unlearn (infra/certificates.py); delete ca.pem to have new ones made\n")
    return tls, check_tls_dir(tls, node_ids, hosts)


def certs_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn certs --dir DIR --host H [--nodes N] [--ca-copy FILE] [--owner UID]``: the compose
    ``certs`` service (docker-compose.yml): keystores for the broker, the CA for the clients."""
    import argparse
    import shutil
    import sys

    ap = argparse.ArgumentParser(prog="unlearn certs", description="Make (or check the operator's) TLS "
                                 "certificates of the secured Kafka: ca.pem, node-<id>.p12, keystore.password.")
    ap.add_argument("--dir", required=True, help="the TLS directory (the operator's files are kept and checked)")
    ap.add_argument("--host", action="append", required=True, help="a name clients dial (repeatable)")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--ca-copy", metavar="FILE", help="also copy ca.pem here (what the clients mount)")
    ap.add_argument("--owner", type=int, metavar="UID", help="chown the keystores and password to UID (the broker's)")
    args = ap.parse_args(argv)
    try:
        tls, subject = ensure_tls_dir(args.dir, range(1, args.nodes + 1), args.host)
    except CertificateError as exc:
        print(f"unlearn certs: {exc}", file=sys.stderr)
        return 1
    if args.owner is not None:
        for path in (tls.password_file, *(tls.node(i) for i in range(1, args.nodes + 1))):
            os.chown(path, args.owner, -1)
    if args.ca_copy:
        shutil.copyfile(tls.ca, args.ca_copy)
        os.chmod(args.ca_copy, 0o644)
    print(f"certs: {tls.path} nodes={args.nodes} subject={subject} ca={tls.ca}", flush=True)
    return 0
