"""The demo in signed mode (``UNLEARN_AUTH_MODE=signed`` or ``unlearn demo --signed``): one
Ed25519 key per demo client, written under the output directory and registered in the client
registry (each client may write every head, without a rate limit, and delete only its own
samples), so the demo exercises the same path as any signed producer (docs/security.md)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from unlearn.common.registry import publish_client
from unlearn.infra.settings import Settings
from unlearn.schemas.client_record import ALL_HEADS, ClientKey, ClientRecord
from unlearn.schemas.signature import Signer, generate_key_file

__all__ = ["register_demo_clients"]


def register_demo_clients(settings: Settings, key_dir: Path, client_ids: Iterable[str]) -> dict[str, Signer]:
    """Client id -> its signer: a fresh key per client (``key_dir/<client>.pem``), registered."""
    key_dir.mkdir(parents=True, exist_ok=True)
    signers: dict[str, Signer] = {}
    for cid in client_ids:
        path = key_dir / f"{cid}.pem"
        path.unlink(missing_ok=True)  # a new broker each run: new keys
        signer = Signer(generate_key_file(path))
        publish_client(settings, ClientRecord(cid, 1, (ClientKey(signer.key_id, signer.public_key),), (ALL_HEADS,),
                                              rate_per_second=0.0))
        signers[cid] = signer
    return signers
