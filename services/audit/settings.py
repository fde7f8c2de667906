"""Settings of ``unlearn audit``: where it listens and the credential it asks for.

The pages show personal identifiers (subject and sample ids), so the app listens on 127.0.0.1 by
default and refuses any other address unless a credential is configured (docs/security.md).
Credentials come from the environment only: a command line is visible to every local user.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import ClassVar

from unlearn.infra.settings import Section, setting


def is_loopback(host: str) -> bool:
    """Is ``host`` an address only this machine can reach (127.0.0.0/8, ::1, "localhost")?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


@dataclass(frozen=True)
class AuditSettings(Section):
    """The audit pages' address, credential and the size of the verification they run."""

    title: ClassVar[str] = "audit"

    audit_host: str = setting("127.0.0.1", "listen address (not loopback: a credential is required)")
    audit_port: int = setting(8090, "port (0 = any free port)")
    audit_token: str = setting("", "bearer token the pages require (\"\" = none)")
    audit_basic: str = setting("", "user:password for HTTP basic auth (\"\" = none)")
    audit_verify_orders: int = setting(1, "shuffled replay orders of a head page's certificate")
    audit_verify_partitionings: int = setting(1, "random re-partitionings of a head page's certificate")
    audit_read_timeout: float = setting(30.0, "seconds to read each topic to its end")

    @property
    def has_credential(self) -> bool:
        return bool(self.audit_token or self.audit_basic)

    def check(self) -> None:
        if not 0 <= self.audit_port <= 65535:
            raise ValueError(f"UNLEARN_AUDIT_PORT must be in 0..65535, got {self.audit_port}")
        if self.audit_basic and ":" not in self.audit_basic:
            raise ValueError("UNLEARN_AUDIT_BASIC must be user:password")
        if self.audit_verify_orders < 0 or self.audit_verify_partitionings < 0:
            raise ValueError("UNLEARN_AUDIT_VERIFY_ORDERS and UNLEARN_AUDIT_VERIFY_PARTITIONINGS must be >= 0")
        if not self.audit_read_timeout > 0:
            raise ValueError(f"UNLEARN_AUDIT_READ_TIMEOUT must be > 0, got {self.audit_read_timeout}")
        if not is_loopback(self.audit_host) and not self.has_credential:
            raise ValueError(f"UNLEARN_AUDIT_HOST={self.audit_host} is not a loopback address: the pages show "
                             "personal identifiers, set UNLEARN_AUDIT_TOKEN or UNLEARN_AUDIT_BASIC first")
