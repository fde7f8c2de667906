"""The broker options every ``unlearn`` command shares, and the ``Settings`` built from them."""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from typing import Any, Literal

from unlearn.infra.settings import Section, SecuritySettings, Settings, help_epilog

BrokerArg = Literal["bootstrap", "prefix", "profile"]

#: The message of a command that needs a broker and was given none.
NO_BROKER = "no broker: pass --bootstrap or set UNLEARN_BOOTSTRAP / KAFKA_BOOTSTRAP"

_BROKER_ARGS: dict[BrokerArg, dict[str, Any]] = {
    "bootstrap": {"help": "host:port (default: UNLEARN_BOOTSTRAP/KAFKA_BOOTSTRAP)"},
    "prefix": {"help": "topic prefix (default: UNLEARN_TOPIC_PREFIX)"},
    "profile": {"choices": ("tansu", "kafka"), "help": "default: UNLEARN_PROFILE"},
}


class CliUsageError(ValueError):
    """A command was given no broker; ``str(exc)`` is ready to print after ``error: ``."""


def add_broker_args(parser: argparse.ArgumentParser, *only: BrokerArg) -> None:
    """Add ``--bootstrap``, ``--prefix`` and ``--profile`` (or only the named ones, in that order)."""
    for name in only or tuple(_BROKER_ARGS):
        parser.add_argument(f"--{name}", **_BROKER_ARGS[name])


def add_worker_args(parser: argparse.ArgumentParser, *sections: type[Section]) -> None:
    """The options every long-running command takes (featurizer, ledger, serve): the broker
    options, ``--data-dir`` and ``--loglevel``, and in ``--help`` the variables of the cluster
    sections and ``sections``. Read back with ``settings_from_args`` (which maps ``--data-dir``)
    and ``setup_logging(args.loglevel)``."""
    add_broker_args(parser)
    parser.add_argument("--data-dir", help="local state dir (default: UNLEARN_DATA_DIR)")
    parser.add_argument("--loglevel", default="info", choices=("debug", "info", "warning", "error"),
                        help="log level (default: info; the readiness line is logged at info)")
    settings_help(parser, *sections)


def add_loglevel_arg(parser: argparse.ArgumentParser) -> None:
    """Only ``--loglevel`` (same choices and default as ``add_worker_args``), for a long-running
    command that takes no broker options (``unlearn broker``)."""
    parser.add_argument("--loglevel", default="info", choices=("debug", "info", "warning", "error"),
                        help="log level (default: info; the readiness line is logged at info)")


def settings_help(parser: argparse.ArgumentParser, *sections: type[Section], cluster: bool = True) -> None:
    """List the variables of ``sections`` (after the shared ``Settings`` and ``SecuritySettings``
    unless ``cluster`` is false) with default and meaning at the end of the command's ``--help``."""
    shown = ((Settings, SecuritySettings) if cluster else ()) + sections
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    own = textwrap.fill(parser.epilog, 100) if parser.epilog else ""
    parser.epilog = "\n\n".join(filter(None, (own, help_epilog(*shown))))


def setup_logging(level: str) -> None:
    """One log format for every command: ``time [LEVEL] logger: message``."""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s [%(levelname)s] %(name)s: %(message)s")


def log_ready(component: str, **fields: object) -> str:
    """Log (and return) the one readiness line of a long-running command:
    ``unlearn <component> ready key=value ...``. Operators and tests wait for it; values are
    ``repr``-quoted where they are strings so that no input can forge a log line."""
    parts = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in fields.items())
    line = f"unlearn {component} ready {parts}".rstrip()
    logging.getLogger(f"unlearn.{component}").info("%s", line)
    return line


def settings_from_args(args: argparse.Namespace, *, require_broker: bool = True, **overrides: object) -> Settings:
    """``Settings.from_env`` with the broker options in ``args`` (absent or unset ones fall back to the
    environment) and ``overrides``. Raises ``ValueError`` for invalid settings and ``CliUsageError``
    (also a ``ValueError``) when ``require_broker`` and no broker is configured."""
    if getattr(args, "data_dir", None) and "data_dir" not in overrides:
        overrides["data_dir"] = args.data_dir
    settings = Settings.from_env(bootstrap=args.bootstrap, topic_prefix=getattr(args, "prefix", None),
                                 profile=getattr(args, "profile", None), **overrides)
    if require_broker and not settings.bootstrap:
        raise CliUsageError(NO_BROKER)
    return settings


def cli_exit_code(exc: SystemExit | ValueError) -> int:
    """The exit code of a command stopped by ``parse_args`` (its code) or by bad settings
    (prints ``error: <exc>`` to stderr, returns 2)."""
    if isinstance(exc, SystemExit):
        return int(exc.code or 0)
    print(f"error: {exc}", file=sys.stderr)
    return 2
