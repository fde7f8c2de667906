"""``unlearn verify`` and ``unlearn export-deltas`` (wired in services/cli.py). Exit codes: 0 when
no check fails, 1 when one fails or the verification cannot run (VerifyError), 2 for usage."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import orjson

from unlearn.infra.cli_args import NO_BROKER, add_broker_args, cli_exit_code, settings_from_args, settings_help
from unlearn.infra.settings import HeadSettings
from unlearn.services.verifier.settings import VerifySettings

from .certify import verify_broker, verify_file
from .errors import VerifyError
from .export import export_deltas


def _common(ap: argparse.ArgumentParser) -> None:
    add_broker_args(ap)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to read each topic to its end")


def verify_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn verify --bootstrap B --head H [--orders N] [--partitions K] [--json]`` or
    ``unlearn verify --deltas-file F [--head H]``. Exit 0 only when no check fails."""
    ap = argparse.ArgumentParser(prog="unlearn verify", description=(
        "Replay a head's deltas through the exact ledger in shuffled orders and random partitionings, and "
        "certify the live head (digest, canonical W bit for bit, deviation from a scikit-learn retrain)."))
    _common(ap)
    settings_help(ap, HeadSettings, VerifySettings)
    ap.add_argument("--head", help="head id (required with --bootstrap; with --deltas-file when it holds several)")
    ap.add_argument("--deltas-file", help="verify an export file (unlearn export-deltas) instead of the broker")
    ap.add_argument("--orders", type=int, help="shuffled replay orders (default: UNLEARN_VERIFY_ORDERS)")
    ap.add_argument("--partitions", type=int,
                    help="random re-partitionings, each into 2..8 partitions (default: UNLEARN_VERIFY_PARTITIONINGS)")
    ap.add_argument("--seed", type=int, help="random seed (default: fresh; recorded in the certificate)")
    ap.add_argument("--tolerance", type=float, help="max retrain deviation (default: UNLEARN_VERIFY_TOLERANCE)")
    ap.add_argument("--json", action="store_true", help="print the certificate as JSON (the summary goes to stderr)")
    try:
        args = ap.parse_args(argv)
        settings = settings_from_args(args, require_broker=False)
    except (SystemExit, ValueError) as exc:
        return cli_exit_code(exc)
    orders = VerifySettings.of(settings).verify_orders if args.orders is None else args.orders
    parts = VerifySettings.of(settings).verify_partitionings if args.partitions is None else args.partitions
    tol = VerifySettings.of(settings).verify_tolerance if args.tolerance is None else args.tolerance
    if orders < 0 or parts < 0 or not tol > 0:
        print("error: --orders and --partitions must be >= 0 and --tolerance > 0", file=sys.stderr)
        return 2
    try:
        if args.deltas_file:
            cert = verify_file(args.deltas_file, args.head, orders=orders, partitionings=parts, seed=args.seed,
                               tolerance=tol, gamma=HeadSettings.of(settings).gamma_for(args.head or ""),
                               keys_from=settings if settings.bootstrap else None)
        else:
            if not args.head:
                print("error: --head is required (or give --deltas-file)", file=sys.stderr)
                return 2
            if not settings.bootstrap:
                print(f"error: {NO_BROKER} (or verify an export with --deltas-file)", file=sys.stderr)
                return 2
            cert = verify_broker(settings, args.head, orders=orders, partitionings=parts, seed=args.seed,
                                 tolerance=tol, timeout=args.timeout)
    except VerifyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(cert.summary(), file=sys.stderr)
        sys.stdout.write(orjson.dumps(cert.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(cert.summary())
    return 0 if cert.ok else 1


def export_deltas_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn export-deltas --bootstrap B --head H --out F [--no-heads] [--no-receipts]``."""
    ap = argparse.ArgumentParser(prog="unlearn export-deltas", description=(
        "Write a head's deltas (and head updates and receipts) to a file for offline verify."))
    _common(ap)
    settings_help(ap)
    ap.add_argument("--head", required=True, help="head id")
    ap.add_argument("--out", required=True, help="output file")
    ap.add_argument("--no-heads", action="store_true", help="no head updates (verify then skips the live-head checks)")
    ap.add_argument("--no-receipts", action="store_true",
                    help="no receipts (reading them scans the whole receipts topic; verify then checks none)")
    try:
        args = ap.parse_args(argv)
        settings = settings_from_args(args)
    except (SystemExit, ValueError) as exc:
        return cli_exit_code(exc)
    try:
        info = export_deltas(settings, args.head, args.out, include_heads=not args.no_heads,
                             include_receipts=not args.no_receipts, timeout=args.timeout)
    except VerifyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(orjson.dumps(info).decode())
    return 0
