"""The Java Kafka client's security config from the librdkafka one every Python client gets.

``UNLEARN_KAFKA_PROPERTIES`` holds librdkafka's key names (``infra/kafka_properties.py`` reads and
checks it; ``infra.settings.security_config`` returns the result). A JVM that this project starts
(Kafka Connect for `unlearn cdc`, docs/cdc.md) needs the Java client's names instead. The rules
are those of the Java client's ``KafkaSecurity.java`` (clients/java), so one properties file per
principal serves both languages:

- ``security.protocol`` as is (default ``PLAINTEXT``);
- SASL: ``sasl.mechanism`` as is, ``sasl.username``/``sasl.password`` become ``sasl.jaas.config``
  (``ScramLoginModule`` for SCRAM, ``PlainLoginModule`` for PLAIN; ``\\`` and ``"`` escaped);
- TLS: ``ssl.endpoint.identification.algorithm=https`` always; ``ssl.ca.location`` becomes a PEM
  truststore (``ssl.truststore.type=PEM``, ``ssl.truststore.location``); ``ssl.certificate.location``
  and ``ssl.key.location`` a PEM keystore given inline (``ssl.keystore.certificate.chain``,
  ``ssl.keystore.key``: Java reads a PEM keystore *file* only with an encrypted key), with
  ``ssl.key.password`` when set.

The result holds secrets (the JAAS line, an inline private key): write it only to an owner-only
file (:func:`write_private_properties`), never to argv or a log.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["CONNECT_PREFIXES", "SECRET_KEYS", "connect_security", "java_security", "properties_text",
           "write_private_properties"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
            "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
            "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
#: Keys of the Java config whose value is a secret.
SECRET_KEYS = frozenset({"sasl.jaas.config", "ssl.keystore.key", "ssl.key.password"})
#: A Connect worker's own clients (the herder's admin lookups) take the unprefixed keys; its
#: tasks' producers, consumers and admin clients only the prefixed ones.
CONNECT_PREFIXES = ("", "producer.", "consumer.", "admin.")


def _quote(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _need(config: Mapping[str, str], key: str, protocol: str) -> str:
    value = config.get(key, "")
    if not value:
        raise ValueError(f"security.protocol={protocol} needs {key}")
    return value


def _contents(path: str, key: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{key}={path!r} is not a readable file ({exc.strerror or exc})") from None


def java_security(config: Mapping[str, str]) -> dict[str, str]:
    """The Java client's security properties of a librdkafka security ``config`` (empty or
    without ``security.protocol``: plaintext). ``ValueError`` names what is missing."""
    protocol = config.get("security.protocol") or "PLAINTEXT"
    if protocol not in PROTOCOLS:
        raise ValueError(f"security.protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    out = {"security.protocol": protocol}
    if protocol.startswith("SASL_"):
        mechanism = _need(config, "sasl.mechanism", protocol)
        if mechanism not in _MODULES:
            raise ValueError(f"sasl.mechanism must be one of {', '.join(_MODULES)}, got {mechanism!r}")
        user, password = _need(config, "sasl.username", protocol), _need(config, "sasl.password", protocol)
        out["sasl.mechanism"] = mechanism
        out["sasl.jaas.config"] = (f'{_MODULES[mechanism]} required username="{_quote(user)}" '
                                   f'password="{_quote(password)}";')
    if protocol.endswith("SSL"):
        out["ssl.endpoint.identification.algorithm"] = "https"
        if ca := config.get("ssl.ca.location"):
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.location"] = ca
        cert, key = config.get("ssl.certificate.location"), config.get("ssl.key.location")
        if bool(cert) != bool(key):
            raise ValueError("mTLS needs both ssl.certificate.location and ssl.key.location")
        if cert and key:
            out["ssl.keystore.type"] = "PEM"
            out["ssl.keystore.certificate.chain"] = _contents(cert, "ssl.certificate.location")
            out["ssl.keystore.key"] = _contents(key, "ssl.key.location")
            if config.get("ssl.key.password"):
                out["ssl.key.password"] = config["ssl.key.password"]
    return out


def connect_security(config: Mapping[str, str], prefixes: Iterable[str] = CONNECT_PREFIXES) -> dict[str, str]:
    """:func:`java_security` for a Kafka Connect worker: once per prefix (the worker, and its
    ``producer.``, ``consumer.`` and ``admin.`` clients)."""
    java = java_security(config)
    return {prefix + k: v for prefix in prefixes for k, v in java.items()}


def properties_text(conf: Mapping[str, str]) -> str:
    """``conf`` as a Java ``.properties`` file that ``Properties.load`` reads back exactly: it reads
    ISO-8859-1, so anything beyond ASCII is a ``\\uXXXX`` escape (UTF-16 units); ``\\``, line
    breaks, ``=`` and ``:`` are escaped, and a key's blanks and leading ``#``/``!``, a value's
    leading blank."""
    def esc(v: str, key: bool) -> str:
        out = []
        for i, c in enumerate(v):
            if c in "\\=:":
                out.append("\\" + c)
            elif c in "\n\r\t\f":
                out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"}[c])
            elif (c == " " and (key or i == 0)) or (key and i == 0 and c in "#!"):
                out.append("\\" + c)
            elif not " " <= c <= "~":
                data = c.encode("utf-16-be")
                out.extend(f"\\u{int.from_bytes(data[j:j + 2], 'big'):04x}" for j in range(0, len(data), 2))
            else:
                out.append(c)
        return "".join(out)

    return "".join(f"{esc(k, True)}={esc(v, False)}\n" for k, v in conf.items())


def write_private_properties(path: Path, conf: Mapping[str, str]) -> Path:
    """Write ``conf`` to a new file at ``path``, owner read/write only (0600) from its creation
    (never a moment world-readable); an existing file is an error, not overwritten."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(properties_text(conf))
    return path
