"""``unlearn clients keygen|create|add-key|revoke|show|list``: the client registry.

``keygen`` writes a new Ed25519 private key (PKCS#8 PEM, mode 0600) and prints its public key
and default key id; ``create`` registers a client with one public key (``--public-key`` as
base64 of the 32 raw bytes, or ``--key-file``: a private key PEM whose public half is
registered), the heads it may write, whether it may delete other clients' samples, and its rate
limit; ``add-key`` and ``revoke`` write the next version (key rotation: add, switch, revoke).
Exit 0 on success, 1 when the registry refuses, 2 for bad arguments or no broker.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import sys
from collections.abc import Sequence

from unlearn.infra.cli_args import add_broker_args
from unlearn.infra.settings import Settings
from unlearn.schemas.client_record import ClientError, ClientKey, ClientRecord, key_fingerprint
from unlearn.services.registry.command import run_registry_command

__all__ = ["build_parser", "clients_main", "key_from_args"]


def build_parser() -> argparse.ArgumentParser:
    """The ``unlearn clients`` parser (one subparser per action)."""
    ap = argparse.ArgumentParser(prog="unlearn clients", description="Register clients and their signing keys.")
    sub = ap.add_subparsers(dest="action", required=True)
    keygen = sub.add_parser("keygen", help="write a new Ed25519 private key file (never overwrites)")
    keygen.add_argument("--out", required=True, help="the PEM file to create (mode 0600)")
    create = sub.add_parser("create", help="register a client (refuses an existing one)")
    add_key = sub.add_parser("add-key", help="register one more key of a client (key rotation)")
    for p in (create, add_key):
        p.add_argument("--client", required=True)
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--public-key", help="base64 of the 32-byte Ed25519 public key")
        src.add_argument("--key-file", help="an Ed25519 private key PEM: its public half is registered")
        p.add_argument("--key-id", help="default: ed25519:<16 hex digits of SHA-256(public key)>")
    create.add_argument("--heads", required=True, help="comma-separated head ids the client may write, or '*'")
    create.add_argument("--may-delete-others", action="store_true",
                        help="the client may delete samples other clients added")
    create.add_argument("--rate", type=float, default=100.0, help="requests/s per featurizer partition (0: none)")
    create.add_argument("--burst", type=int, default=200, help="requests accepted at once (token bucket size)")
    revoke = sub.add_parser("revoke", help="revoke one key (--key-id) or the whole client")
    revoke.add_argument("--client", required=True)
    revoke.add_argument("--key-id")
    show = sub.add_parser("show", help="print a client's latest record")
    show.add_argument("--client", required=True)
    lst = sub.add_parser("list", help="print every registered client")
    for p in (create, add_key, revoke, show, lst):
        add_broker_args(p)
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return ap


def key_from_args(args: argparse.Namespace) -> ClientKey:
    """The key ``create``/``add-key`` register; raises :class:`ClientError` for an unusable one."""
    if args.key_file:
        from unlearn.schemas.signature import load_private_key, public_key_bytes

        try:
            raw = public_key_bytes(load_private_key(args.key_file))
        except (OSError, ValueError, TypeError) as exc:
            raise ClientError(f"--key-file {args.key_file}: {exc}") from None
    else:
        try:
            raw = base64.b64decode(args.public_key, validate=True)
        except binascii.Error:
            raise ClientError("--public-key must be padded standard base64") from None
    return ClientKey(args.key_id or key_fingerprint(raw), raw)


def _text(c: ClientRecord) -> str:
    keys = ", ".join(k.key_id + (" (revoked)" if k.revoked else "") for k in c.keys)
    rate = "no limit" if c.rate_per_second == 0 else f"{c.rate_per_second:g}/s burst {c.burst}"
    return (f"{c.client_id}\tv{c.version}\t{'REVOKED' if c.revoked else 'active'}\theads={','.join(c.heads)}\t"
            f"may_delete_others={'yes' if c.may_delete_others else 'no'}\trate={rate}\tkeys={keys}")


def _keygen(path: str) -> int:
    from unlearn.schemas.signature import generate_key_file, public_key_bytes

    try:
        key = generate_key_file(path)
    except FileExistsError:
        print(f"error: {path} exists; a key file is never overwritten", file=sys.stderr)
        return 1
    raw = public_key_bytes(key)
    print(f"key_file={path}\tkey_id={key_fingerprint(raw)}\tpublic_key={base64.b64encode(raw).decode()}")
    return 0


def clients_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn clients ...`` (module docstring)."""
    from unlearn.common.registry import ClientRegistryError, publish_client, read_clients

    ap = build_parser()
    args = ap.parse_args(argv)
    if args.action == "keygen":
        return _keygen(args.out)

    def create(_settings: Settings) -> ClientRecord:
        heads = tuple(h.strip() for h in args.heads.split(",") if h.strip())
        return ClientRecord(args.client, 1, (key_from_args(args),), heads, args.may_delete_others, args.rate,
                            args.burst)

    def change(current: ClientRecord, _settings: Settings) -> ClientRecord | None:
        if args.action == "add-key":
            return current.with_key(key_from_args(args))
        if args.action == "revoke":
            return current.revoke(args.key_id)
        return None  # show

    return run_registry_command(
        ap, args, read=read_clients, publish=publish_client, key_arg="client", create=create, change=change,
        exists="client {key!r} exists (v{version}); use add-key or revoke",
        missing="client {key!r} is not registered (`unlearn clients list`)", text=_text,
        errors=(ClientError, ClientRegistryError))
