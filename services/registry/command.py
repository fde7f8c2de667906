"""What ``unlearn heads`` (``cli.py``) and ``unlearn clients`` (``clients_cli.py``) share: one
command over a versioned registry (``common/registry.py``).

Each action reads the registry to its end, then: ``list`` prints every latest record; ``create``
refuses a key that exists and writes version 1; any other action needs an existing key and
either writes the next version (``extend``, ``add-key``, ``revoke``) or only prints (``show``).
What was written or found is printed as one text line per record or as ``--json`` documents.
Exit 0 on success, 1 when the registry refuses (or cannot be read or written), 2 for bad
arguments or settings. Written once so the two commands keep the same flow and exit codes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import orjson

from unlearn.infra.cli_args import CliUsageError, settings_from_args
from unlearn.infra.settings import Settings

__all__ = ["Document", "print_records", "run_registry_command"]


class Document(Protocol):
    """A registry record as the commands print it: its version and its JSON object."""

    @property
    def version(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Document)


def print_records(records: Sequence[R], as_json: bool, many: bool, text: Callable[[R], str]) -> None:
    """Print ``records`` as ``text`` lines, or as JSON (a list when ``many``, else the one
    document), so scripts can read what ``show``/``list`` print and what a change wrote."""
    if as_json:
        docs = [r.to_dict() for r in records]
        print(orjson.dumps(docs if many else docs[0], option=orjson.OPT_INDENT_2).decode())
    else:
        for r in records:
            print(text(r))


def run_registry_command(
    ap: argparse.ArgumentParser, args: argparse.Namespace, *,
    read: Callable[[Settings, float], Mapping[str, R]],
    publish: Callable[[Settings, R], None],
    key_arg: str,
    create: Callable[[Settings], R],
    change: Callable[[R, Settings], R | None],
    exists: str,
    missing: str,
    text: Callable[[R], str],
    errors: tuple[type[Exception], ...],
) -> int:
    """Run one parsed registry action (module docstring) and return its exit code.

    ``key_arg``: the option naming the key (``head``, ``client``); ``create``: version 1 from
    the arguments; ``change``: the next version for the action, or None to print the current
    one; ``exists`` / ``missing``: the refusals, templates of ``{key}`` (and ``{version}``);
    ``errors``: what counts as a refusal (exit 1), besides an unreadable registry."""
    from unlearn.runtime.topic_reader import TopicReadError

    refused: tuple[type[Exception], ...] = (*errors, TopicReadError)
    try:
        settings = settings_from_args(args)
    except CliUsageError as exc:
        ap.error(str(exc))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        latest = read(settings, settings.admin_timeout)
        if args.action == "list":
            print_records([latest[k] for k in sorted(latest)], args.json, True, text)
            return 0
        key = getattr(args, key_arg)
        current = latest.get(key)
        if args.action == "create":
            if current is not None:
                print("error: " + exists.format(key=key, version=current.version), file=sys.stderr)
                return 1
            current = create(settings)
            publish(settings, current)
        elif current is None:
            print("error: " + missing.format(key=key), file=sys.stderr)
            return 1
        else:
            following = change(current, settings)
            if following is not None:
                current = following
                publish(settings, current)
        print_records([current], args.json, False, text)
        return 0
    except refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
