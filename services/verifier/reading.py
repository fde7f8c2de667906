"""What the verifier reads: a head's ``deltas``, ``heads`` and ``receipts`` messages, and which head
update is live.

Topics are read with the one shared reader (``unlearn.runtime.topic_reader``); its
``TopicReadError`` becomes a ``VerifyError`` here, so callers see one error type for "could not
run". Records may be tombstones (``value`` None): they are treated like the empty value the live
ledger sees, i.e. undecodable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import LogRecord, Source, TopicReadError, read_topic
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.delta_codec import decode_delta
from unlearn.schemas.head import HeadUpdate, decode_head
from unlearn.schemas.receipts import Receipt, decode_receipt

from .errors import VerifyError


def key_filter(head_id: str) -> Callable[[bytes | None], bool]:
    """``keep(key)`` for a head's messages: keyed by its id, or unkeyed (the live ledger refuses a
    keyed delta whose key is not its head id, but accepts an unkeyed one)."""
    want = head_id.encode("utf-8")
    return lambda key: not key or key == want


def record_value(r: LogRecord) -> bytes:
    """The record's bytes; a tombstone reads as empty, which no codec accepts (as in the live ledger)."""
    return r.value if r.value is not None else b""


def read_head_records(settings: Settings, topic: Source, head_id: str, timeout: float = 60.0) -> list[LogRecord]:
    """Every message of ``topic`` keyed by ``head_id`` or unkeyed, up to each partition's end.
    Raises VerifyError (not TopicReadError) so a missing topic is "could not verify"."""
    try:
        return read_topic(settings, topic, key_filter(head_id), timeout, role="verifier")
    except TopicReadError as exc:
        raise VerifyError(str(exc)) from None


def delta_head(r: LogRecord) -> str | None:
    """The head id a deltas message is for (key first; decoded for unkeyed messages; None when unreadable)."""
    if r.key:
        return r.key.decode("utf-8", "replace")
    try:
        return decode_delta(record_value(r)).head_id
    except CodecError:
        return None


def read_head_updates(records: Iterable[LogRecord], head_id: str) -> tuple[list[HeadUpdate], int]:
    """Decoded updates of ``head_id`` in log order, and how many messages were undecodable."""
    ups: list[HeadUpdate] = []
    bad = 0
    for r in records:
        try:
            u = decode_head(record_value(r))
        except CodecError:
            bad += 1
            continue
        if u.head_id == head_id:
            ups.append(u)
    return ups, bad


def read_receipt_records(settings: Settings, head_id: str, timeout: float = 60.0) -> list[LogRecord]:
    """The ``receipts`` messages of ``head_id``. Receipts are keyed by subject, so the whole topic is
    read and each message decoded to see its head; undecodable ones are left out (they name no head)."""
    try:
        recs = read_topic(settings, settings.topic("receipts"), None, timeout, role="verifier")
    except TopicReadError as exc:
        raise VerifyError(str(exc)) from None
    return [r for r in recs if [x.head_id for x in decode_receipts([r])] == [head_id]]


def decode_receipts(records: Iterable[LogRecord]) -> list[Receipt]:
    """The decodable receipts among ``records``, in order."""
    out: list[Receipt] = []
    for r in records:
        try:
            out.append(decode_receipt(record_value(r)))
        except CodecError:
            continue
    return out


def live_updates(updates: Iterable[HeadUpdate]) -> tuple[HeadUpdate | None, HeadUpdate | None]:
    """(the live head, the latest exact update not newer than it), by ``HeadUpdate.supersedes``:
    the live head fixes the replay's stop version, the exact one is the head checked bit for bit."""
    ups = list(updates)
    latest: HeadUpdate | None = None
    for u in ups:
        if u.supersedes(latest):
            latest = u
    latest_exact: HeadUpdate | None = None
    for u in ups:
        if u.mode == "exact" and (latest is None or u.version <= latest.version) and u.supersedes(latest_exact):
            latest_exact = u
    return latest, latest_exact
