"""Settings of the client SDK and the client commands (``unlearn add --help``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from unlearn.infra.settings import Section, setting


@dataclass(frozen=True)
class ClientSettings(Section):
    """Who the client is, how it signs, how it seals adds for transit, how long it waits."""

    title: ClassVar[str] = "client"

    client_id: str = setting("unlearn-client", "client_id stamped on requests")
    client_key_file: str = setting("", "Ed25519 PEM private key requests are signed with (\"\" = unsigned)")
    client_key_id: str = setting("", "its key id in the client registry (\"\" = its fingerprint)")
    receipt_timeout: float = setting(60.0, "default seconds wait_receipt() / --wait waits")
    transit_seal: str = setting("auto", "auto | always | off: seal adds for transit")
    transit_wait_seconds: float = setting(30.0, "how long `auto` waits for a head's transit key, then raises")
    route_by_head: bool = setting(False, "produce to requests.by-head at the head's partition (trusted producers)")

    def check(self) -> None:
        if self.client_key_file and not os.path.isfile(self.client_key_file):
            raise ValueError(f"UNLEARN_CLIENT_KEY_FILE={self.client_key_file!r} is not a readable file")
        if self.client_key_id and not self.client_key_file:
            raise ValueError("UNLEARN_CLIENT_KEY_ID is set but UNLEARN_CLIENT_KEY_FILE is not")
        if not self.client_id or len(self.client_id) > 256:
            raise ValueError("UNLEARN_CLIENT_ID must be a string of 1..256 characters")
        if self.receipt_timeout <= 0:
            raise ValueError(f"UNLEARN_RECEIPT_TIMEOUT must be > 0, got {self.receipt_timeout}")
        if self.transit_seal not in ("auto", "always", "off"):
            raise ValueError(f"UNLEARN_TRANSIT_SEAL must be auto | always | off, got {self.transit_seal!r}")
        if self.transit_wait_seconds < 0:
            raise ValueError("UNLEARN_TRANSIT_WAIT_SECONDS must be >= 0")
