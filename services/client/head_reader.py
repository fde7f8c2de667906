"""Read the latest head updates from ``heads`` (what `unlearn head`, the demo and tests use).

``heads`` is compacted on Kafka; tansu never compacts, so readers scan the whole topic to its end
(``runtime.topic_reader.read_topic``) and keep the newest update per head
(``HeadUpdate.supersedes``: a higher version wins, and at equal versions an exact update
supersedes a fast one). ``HeadFollower`` keeps that answer current without rescanning, for
callers that ask again and again (the demo).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Iterable

import orjson

from unlearn.common.families import heads_family
from unlearn.infra.cli_args import add_broker_args, settings_from_args, settings_help
from unlearn.infra.polling import poll_until
from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import LogRecord, TopicFollower, TopicReadError, keys_in, read_topic
from unlearn.runtime.topics import prefixed_topics
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.head import HeadUpdate, decode_head, head_to_json, retained_class_list

__all__ = ["HeadFollower", "head_main", "latest_heads", "read_heads", "wait_for_head"]

HeadPredicate = Callable[[HeadUpdate], bool]


def _decode(record: LogRecord) -> HeadUpdate | None:
    """The head update in ``record``, or None for a tombstone or a message that is not one (not
    ours to judge here: the serving layer reports bad updates)."""
    if record.value is None:
        return None
    try:
        return decode_head(record.value)
    except CodecError:
        return None


def latest_heads(records: Iterable[LogRecord]) -> dict[str, HeadUpdate]:
    """The newest update per head among ``records`` (any order: ``supersedes`` decides)."""
    latest: dict[str, HeadUpdate] = {}
    for record in records:
        h = _decode(record)
        if h is not None and h.supersedes(latest.get(h.head_id)):
            latest[h.head_id] = h
    return latest


def read_heads(settings: Settings, head_ids: Iterable[str] | None = None,
               timeout: float = 30.0) -> dict[str, HeadUpdate]:
    """Latest update per head (all heads, or only ``head_ids``), reading every topic of the heads
    family to its end. Raises ``TopicReadError`` if the end is not reached in ``timeout``."""
    keep = keys_in(head_ids) if head_ids is not None else None
    records = read_topic(settings, heads_family(settings.topic_prefix), keep=keep, timeout=timeout, role="head-reader")
    if not records and settings.topic("deltas") not in prefixed_topics(settings):
        # No head topic is normal before the first publication; no deltas topic is a wrong prefix or broker.
        raise TopicReadError(f"topic {settings.topic('deltas')} does not exist on {settings.bootstrap}: no "
                             f"pipeline under prefix {settings.topic_prefix!r} (run `unlearn topics create`)")
    return latest_heads(records)


def wait_for_head(settings: Settings, head_id: str, predicate: HeadPredicate, timeout: float = 60.0,
                  poll: float = 0.5) -> HeadUpdate:
    """Poll until the head's latest update satisfies ``predicate`` (tests and the demo use it).
    Raises ``TimeoutError`` saying what the head last was."""
    last: HeadUpdate | None = None

    def reached(remaining: float) -> HeadUpdate | None:
        nonlocal last
        last = read_heads(settings, [head_id], timeout=max(1.0, remaining)).get(head_id)
        return last if last is not None and predicate(last) else None

    return poll_until(reached, timeout, interval=poll, timed_out=lambda: TimeoutError(
        f"head {head_id!r} did not reach the expected state within {timeout}s (last: {_describe(last)})"))


def _describe(h: HeadUpdate | None) -> str:
    return "nothing" if h is None else f"version {h.version} ({h.mode}, n={h.n_retained})"


class HeadFollower:
    """The latest update per head, kept current by a ``TopicFollower`` on the heads family (from
    the beginning): one consumer for a caller that asks many times, instead of a scan per question.
    Use as a context manager, or ``start()`` / ``stop()``."""

    def __init__(self, settings: Settings, head_ids: Iterable[str] | None = None, *,
                 poll_interval: float = 0.1) -> None:
        self.settings = settings
        self._latest: dict[str, HeadUpdate] = {}
        self._changed = threading.Condition()
        keep = keys_in(head_ids) if head_ids is not None else None
        self._follower = TopicFollower(settings, heads_family(settings.topic_prefix), self._on_record,
                                       start_at="beginning", role="head-follower", poll_interval=poll_interval,
                                       keep=keep)

    def start(self, timeout: float | None = None) -> HeadFollower:
        """Start following; returns once partitions are assigned (``TopicReadError`` if not in
        ``timeout`` seconds, default the admin timeout)."""
        self._follower.start(wait_assigned=self.settings.admin_timeout if timeout is None else timeout)
        return self

    def stop(self) -> None:
        """Stop the thread and close its consumer (call before the broker goes away)."""
        self._follower.stop()

    @property
    def error(self) -> str | None:
        """Why the follower is waiting or why it stopped (None while all is well)."""
        return self._follower.error

    def get(self, head_id: str) -> HeadUpdate | None:
        """The newest update of ``head_id`` seen so far (non-blocking)."""
        with self._changed:
            return self._latest.get(head_id)

    def wait(self, head_id: str, predicate: HeadPredicate, timeout: float) -> HeadUpdate:
        """Block until the head's newest update satisfies ``predicate``; ``TimeoutError`` if not in
        ``timeout`` seconds (naming the last update seen and any follower error)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                h = self._latest.get(head_id)
                if h is not None and predicate(h):
                    return h
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    why = f"; reader: {self.error}" if self.error else ""
                    raise TimeoutError(f"head {head_id!r} did not reach the expected state within {timeout:g}s "
                                       f"(last: {_describe(h)}){why}")
                self._changed.wait(min(remaining, 1.0))

    def _on_record(self, record: LogRecord) -> None:
        h = _decode(record)
        if h is None:
            return
        with self._changed:
            if h.supersedes(self._latest.get(h.head_id)):
                self._latest[h.head_id] = h
                self._changed.notify_all()

    def __enter__(self) -> HeadFollower:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _head_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="unlearn head", description="Print the latest published head.")
    add_broker_args(ap)
    settings_help(ap)
    ap.add_argument("--head", required=True)
    ap.add_argument("--json", action="store_true", help="one JSON object incl. weights (d rows x c columns)")
    ap.add_argument("--timeout", type=float, default=30.0)
    return ap


def _print_head(h: HeadUpdate, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(orjson.dumps(head_to_json(h)).decode() + "\n")
        return
    digest = h.digest or "(none: a fast head; exact updates carry it)"
    print(f"head {h.head_id}  version {h.version}  mode {h.mode}  n_retained {h.n_retained}  "
          f"events {h.events_covered}\ndigest {digest}\nweights {h.weights.shape[0]} x {h.weights.shape[1]}  "
          f"gamma {h.gamma}  drift {h.drift:.3g}\nclasses with retained samples {_classes(h)}")


def _classes(h: HeadUpdate) -> str:
    """The classes a prediction may name, for people (docs/formats.md, "Heads", flag bit 4)."""
    classes = retained_class_list(h)
    if classes is None:
        return "(every column: a head of target vectors)"
    shown = ", ".join(map(str, classes[:20])) + (f", ... ({len(classes)} in all)" if len(classes) > 20 else "")
    return f"{shown or 'none'} of {h.c}"


def head_main(argv: list[str] | None = None) -> int:
    """``unlearn head --bootstrap B [--prefix P] --head H [--json]``: print the latest head.
    Exit 1 when the head was never published or ``heads`` cannot be read."""
    ap = _head_parser()
    args = ap.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValueError as exc:  # no broker given (CliUsageError) or invalid settings
        ap.error(str(exc))
    try:
        h = read_heads(settings, [args.head], timeout=args.timeout).get(args.head)
    except TopicReadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if h is None:
        print(f"error: no head {args.head!r} published on {heads_family(settings.topic_prefix)}", file=sys.stderr)
        return 1
    _print_head(h, args.json)
    return 0
