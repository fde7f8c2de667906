"""Broker security from a Kafka client properties file (``UNLEARN_KAFKA_PROPERTIES``).

An operator of a secured cluster already has this file: it is what Kafka's own tools take with
``--command-config``. It is read with Java's ``.properties`` syntax (``key=value``, ``key: value``
or ``key value``; ``#``/``!`` comments; a trailing backslash continues a line; ``\\t``, ``\\uXXXX``
escapes) and only the librdkafka/Java common security keys are accepted, so one file serves both
Kafka's tools and every client of this project. Everything that cannot work fails at start naming
the file, the line and the key, not as a broker-side authentication error after a timeout; no
error or repr shows a value of a secret key. With TLS (``SSL``, ``SASL_SSL``) the broker's host
name is always verified against its certificate (``ssl.endpoint.identification.algorithm=https``;
a file cannot turn it off), and a CA or client certificate file that is not PEM, or has expired,
fails here naming the file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

__all__ = ["REFUSED", "SECURITY_KEYS", "PropertiesError", "Property", "client_security", "read_properties"]

#: The keys a file may hold: librdkafka's names, which Kafka's Java clients share.
SECURITY_KEYS = ("security.protocol", "sasl.mechanism", "sasl.username", "sasl.password", "ssl.ca.location",
                 "ssl.certificate.location", "ssl.key.location", "ssl.key.password")
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_FILES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location")
_TLS = ("SSL", "SASL_SSL")
#: Keys that would weaken TLS: refused, with why.
REFUSED = {
    "ssl.endpoint.identification.algorithm": "the broker's host name is always verified (https); give the broker "
                                             "a certificate that names the host clients dial",
    "enable.ssl.certificate.verification": "the broker's certificate is always verified against ssl.ca.location",
}

#: Java-only keys, and what to write instead (the clients here are librdkafka's).
JAVA_ONLY = {
    "sasl.jaas.config": "sasl.username and sasl.password",
    "ssl.truststore.location": "ssl.ca.location (a PEM file)",
    "ssl.truststore.type": "ssl.ca.location (a PEM file)",
    "ssl.truststore.certificates": "ssl.ca.location (a PEM file)",
    "ssl.truststore.password": "ssl.ca.location (a PEM file needs no password)",
    "ssl.keystore.location": "ssl.certificate.location and ssl.key.location (PEM files)",
    "ssl.keystore.type": "ssl.certificate.location and ssl.key.location (PEM files)",
    "ssl.keystore.certificate.chain": "ssl.certificate.location (a PEM file)",
    "ssl.keystore.key": "ssl.key.location (a PEM file)",
    "ssl.keystore.password": "ssl.key.password",
}

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_LEADING = " \t\f"


class PropertiesError(ValueError):
    """A properties file that cannot be read or cannot work; the message names the file (and line)."""


@dataclass(frozen=True)
class Property:
    """One ``key=value`` of a file, with the line it starts on (the value is never in a repr)."""

    line: int
    key: str
    value: str = field(repr=False)


def read_properties(path: str) -> dict[str, Property]:
    """The properties of the file at ``path`` (Java ``.properties`` syntax). A key given twice, a
    line without a separator or a bad ``\\u`` escape is an error naming the path and line."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as exc:
        raise PropertiesError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise PropertiesError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    props: dict[str, Property] = {}
    for line, logical in _logical_lines(text):
        key, value = _split(logical, f"{path}:{line}")
        if key in props:
            raise PropertiesError(f"{path}:{line}: {key} is already set on line {props[key].line}")
        props[key] = Property(line, key, value)
    return props


def client_security(path: str) -> dict[str, str]:
    """The librdkafka security config of the properties file at ``path``, checked: a known
    protocol and mechanism, SASL with its mechanism, user and password, SASL or SSL keys only
    with a protocol that uses them, readable TLS files, mTLS with both certificate and key."""
    props = read_properties(path)
    for p in props.values():
        if p.key in REFUSED:
            raise PropertiesError(f"{path}:{p.line}: {p.key} cannot be set: {REFUSED[p.key]}")
        if p.key in JAVA_ONLY:
            raise PropertiesError(f"{path}:{p.line}: {p.key} is Java-only: librdkafka clients take "
                                  f"{JAVA_ONLY[p.key]}")
        if p.key not in SECURITY_KEYS:
            raise PropertiesError(f"{path}:{p.line}: {p.key} is not a security key this project reads "
                                  f"(one of {', '.join(SECURITY_KEYS)})")
    given = {k: p for k, p in props.items() if p.value}
    _check_values(path, given)
    _check_files(path, given)
    config = {k: given[k].value for k in SECURITY_KEYS if k in given}
    if config.get("security.protocol") in _TLS:
        config["ssl.endpoint.identification.algorithm"] = "https"
    return config


def _check_values(path: str, given: dict[str, Property]) -> None:
    protocol = given.get("security.protocol")
    name = protocol.value if protocol else "PLAINTEXT"
    where = f"{path}:{protocol.line}" if protocol else path
    if name not in PROTOCOLS:
        raise PropertiesError(f"{where}: security.protocol must be one of {', '.join(PROTOCOLS)}, got {name!r}")
    mechanism = given.get("sasl.mechanism")
    if mechanism and mechanism.value not in MECHANISMS:
        raise PropertiesError(f"{path}:{mechanism.line}: sasl.mechanism must be one of {', '.join(MECHANISMS)}, "
                              f"got {mechanism.value!r}")
    sasl_keys = ("sasl.mechanism", "sasl.username", "sasl.password")
    if name.startswith("SASL_"):
        missing = [k for k in sasl_keys if k not in given]
        if missing:
            raise PropertiesError(f"{where}: security.protocol={name} needs {', '.join(missing)}")
    for key, needs in ((sasl_keys, ("SASL_PLAINTEXT", "SASL_SSL")),
                       ((*_FILES, "ssl.key.password"), _TLS)):
        stray = [given[k] for k in key if k in given]
        if stray and name not in needs:
            raise PropertiesError(f"{path}:{stray[0].line}: {stray[0].key} is set but security.protocol is "
                                  f"{name}, not {' or '.join(needs)}")


def _check_files(path: str, given: dict[str, Property]) -> None:
    cert, key = given.get("ssl.certificate.location"), given.get("ssl.key.location")
    if bool(cert) != bool(key):
        one = cert or key
        assert one is not None
        raise PropertiesError(f"{path}:{one.line}: mTLS needs both ssl.certificate.location and ssl.key.location")
    if "ssl.key.password" in given and not key:
        raise PropertiesError(f"{path}:{given['ssl.key.password'].line}: ssl.key.password without ssl.key.location")
    for k in _FILES:
        p = given.get(k)
        if p and not (os.path.isfile(p.value) and os.access(p.value, os.R_OK)):
            raise PropertiesError(f"{path}:{p.line}: {k}={p.value!r} is not a readable file")
    from unlearn.infra.certificates import CertificateError, check_certificate_file

    for k in ("ssl.ca.location", "ssl.certificate.location"):
        p = given.get(k)
        if p:
            try:
                check_certificate_file(p.value, k)
            except CertificateError as exc:
                raise PropertiesError(f"{path}:{p.line}: {exc}") from None


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """``(first line number, text)`` of each non-blank, non-comment logical line: a line ending in
    an odd number of backslashes continues on the next, whose leading blanks are dropped."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(re.split(r"\r\n|\r|\n", text), start=1):
        stripped = raw.lstrip(_LEADING)
        if pending is None:
            if not stripped or stripped[0] in "#!":
                continue
            pending = (number, "")
        continued = (len(stripped) - len(stripped.rstrip("\\"))) % 2 == 1
        pending = (pending[0], pending[1] + (stripped[:-1] if continued else stripped))
        if not continued:
            out.append(pending)
            pending = None
    if pending is not None:
        out.append(pending)
    return out


def _split(logical: str, where: str) -> tuple[str, str]:
    """Key and value of one logical line: the key ends at the first unescaped ``=``, ``:`` or
    blank; blanks and one ``=``/``:`` after it separate it from the value."""
    i = 0
    while i < len(logical) and logical[i] not in "=: \t\f":
        i += 2 if logical[i] == "\\" else 1
    key, rest = logical[:i], logical[i:].lstrip(_LEADING)
    separated = rest[:1] in ("=", ":")
    if separated:
        rest = rest[1:].lstrip(_LEADING)
    elif not rest:
        raise PropertiesError(f"{where}: expected key=value")
    key = _unescape(key, where)
    if not key:
        raise PropertiesError(f"{where}: expected key=value (the key is empty)")
    return key, _unescape(rest, where)


def _unescape(s: str, where: str) -> str:
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c != "\\" or i + 1 >= len(s):
            out.append(c)
            i += 1
            continue
        nxt = s[i + 1]
        if nxt == "u":
            digits = s[i + 2:i + 6]
            if not re.fullmatch(r"[0-9A-Fa-f]{4}", digits):
                raise PropertiesError(f"{where}: malformed \\uXXXX escape")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
    return "".join(out)
