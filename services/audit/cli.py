"""``unlearn audit``: serve the audit pages until SIGTERM/SIGINT (docs/audit.md).

Logs one readiness line (``unlearn audit ready url=...``) once the socket listens. Exit 2 for
bad options or settings (a non-loopback ``--host`` without a credential among them), 1 when the
address cannot be bound.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from unlearn.infra.cli_args import add_worker_args, cli_exit_code, log_ready, settings_from_args, setup_logging
from unlearn.infra.settings import ErasureSettings, HeadSettings
from unlearn.services.serving.cli import run_app

from .app import build_app
from .settings import AuditSettings

__all__ = ["audit_main"]


def audit_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn audit --bootstrap B [--port P] [--host H]``; the credential comes from
    UNLEARN_AUDIT_TOKEN / UNLEARN_AUDIT_BASIC (never the command line: other users see it)."""
    ap = argparse.ArgumentParser(prog="unlearn audit", description=(
        "Read-only web pages for a data-protection officer: subjects, heads, pending deletes (docs/audit.md)."))
    add_worker_args(ap, HeadSettings, ErasureSettings, AuditSettings)
    ap.add_argument("--port", type=int, help="listen port (default: UNLEARN_AUDIT_PORT; 0: a free one)")
    ap.add_argument("--host", help="listen address (default: UNLEARN_AUDIT_HOST, 127.0.0.1; any other address "
                    "needs UNLEARN_AUDIT_TOKEN or UNLEARN_AUDIT_BASIC)")
    try:
        args = ap.parse_args(argv)
        settings = settings_from_args(args, audit_port=args.port, audit_host=args.host)
        AuditSettings.of(settings)  # validated now: refuse a non-loopback address without a credential
    except (SystemExit, ValueError) as exc:
        return cli_exit_code(exc)
    setup_logging(args.loglevel)
    a = AuditSettings.of(settings)
    auth = "bearer" if a.audit_token else "basic" if a.audit_basic else "none (loopback only)"
    return run_app(lambda: build_app(settings), a.audit_host, a.audit_port,
                   lambda port: log_ready("audit", url=f"http://{a.audit_host}:{port}", auth=auth))
