"""Broker connection failures that name their cause, for every client the project creates.

librdkafka retries a failed connection forever and logs each try in its own words; two causes
an operator of the secured deployment meets first are not named there: a plaintext client
against a TLS listener only hears "connection closed by peer ... in state APIVERSION_QUERY" (the
TLS listener drops the first request it cannot read) and its ``error_cb`` only "all brokers are
down", and a refused broker certificate names neither the CA file the client trusted nor what
to change. Every client config (``infra.settings.producer_config`` and the others) gets
:class:`ConnectionErrorLog` as its ``error_cb``: it logs one line per distinct cause, naming it
and the fix, next to librdkafka's. For a plaintext client that reaches no broker it asks the
first bootstrap address once whether it speaks TLS (a handshake, nothing sent after it).
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Mapping
from typing import Any

__all__ = ["ConnectionErrorLog", "explain", "speaks_tls"]

log = logging.getLogger("unlearn.kafka")

_TLS_REFUSED = {
    "certificate has expired": "the broker's certificate has expired",
    "certificate is not yet valid": "the broker's certificate is not valid yet (check the clocks)",
    "hostname mismatch": "the broker's certificate does not name the host this client dialled",
    "certificate verify failed": "the broker's certificate is not signed by a CA this client trusts",
}


def explain(error: str, config: Mapping[str, Any]) -> str | None:
    """The cause of a client-level connection ``error`` (librdkafka's text) for a client with
    ``config``, in words an operator can act on; None when it is not one of the known causes."""
    protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
    low = error.lower()
    for needle, cause in _TLS_REFUSED.items():
        if needle in low:
            ca = config.get("ssl.ca.location")
            trusted = f"ssl.ca.location={ca}" if ca else "the system's CAs (no ssl.ca.location)"
            return (f"TLS refused: {cause}; this client trusts {trusted} and verifies the host name "
                    "(UNLEARN_KAFKA_PROPERTIES; docs/security.md, \"TLS\")")
    if protocol in ("SSL", "SASL_SSL") and "ssl handshake failed" in low and "wrong version number" in low:
        return ("TLS handshake failed: the broker's listener is not TLS; check the port and the broker's "
                f"listener protocol (this client's security.protocol is {protocol})")
    return None


def speaks_tls(address: str, timeout: float = 3.0) -> bool:
    """Whether ``host:port`` completes a TLS handshake (its certificate unchecked: only the
    protocol is asked; nothing is sent after the handshake)."""
    host, _, port = address.rpartition(":")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw, \
                ctx.wrap_socket(raw, server_hostname=host.strip("[]")):
            return True
    except (OSError, ValueError):
        return False


def _plaintext_to_tls(protocol: str, address: str) -> str:
    return (f"the broker at {address} speaks TLS and this client's security.protocol is {protocol}: set "
            "security.protocol=SASL_SSL (or SSL) and ssl.ca.location in the UNLEARN_KAFKA_PROPERTIES file "
            "(docs/security.md, \"TLS\")")


class ConnectionErrorLog:
    """A librdkafka ``error_cb`` that logs each distinct cause once, at ERROR: :func:`explain`'s,
    or, for a plaintext client that reaches no broker, that the first bootstrap speaks TLS."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = {k: v for k, v in config.items() if k in ("security.protocol", "ssl.ca.location")}
        self._bootstrap = str(config.get("bootstrap.servers", "")).split(",")[0].strip()
        self._probed = False
        self._said: set[str] = set()

    def __call__(self, err: Any) -> None:
        cause = explain(err.str() if hasattr(err, "str") else str(err), self._config)
        protocol = str(self._config.get("security.protocol", "PLAINTEXT")).upper()
        name = err.name() if hasattr(err, "name") else ""
        if cause is None and not self._probed and protocol in ("PLAINTEXT", "SASL_PLAINTEXT") and \
                name in ("_ALL_BROKERS_DOWN", "_TRANSPORT") and self._bootstrap:
            self._probed = True  # once per client: a broker that is merely down costs one connect
            if speaks_tls(self._bootstrap):
                cause = _plaintext_to_tls(protocol, self._bootstrap)
        if cause is not None and cause not in self._said:
            self._said.add(cause)
            log.error("kafka connection: %s", cause)
