"""The receipts a client waits for: one background reader of ``<prefix>receipts`` per client
(:class:`ReceiptListener`).

Its start offsets are fixed before the first delete is produced, and every delete's event id is
registered before its request is produced, so a receipt can never slip past unseen however fast
the pipeline answers (docs/client.md, "Why no receipt can be missed").
"""

from __future__ import annotations

import logging
import threading
import time

from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import LogRecord, TopicFollower, TopicReadError
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.receipts import Receipt, decode_receipt
from unlearn.services.client.errors import ClientError

__all__ = ["ReceiptListener"]

log = logging.getLogger("unlearn.client")


class _Waiter:
    __slots__ = ("event", "receipt")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.receipt: Receipt | None = None


class ReceiptListener:
    """Reads ``<prefix>receipts`` from "now" on (an ``runtime.topic_reader.TopicFollower`` started at
    the end) and hands receipts to waiters.

    Only receipts of registered event ids are kept (a busy deployment's other receipts are
    dropped on sight). ``start()`` returns once every partition is assigned at an explicit offset
    no later than the current end, so anything produced after ``start()`` returns is seen.
    """

    def __init__(self, settings: Settings, *, poll_interval: float = 0.2) -> None:
        self.settings = settings
        self.topic = settings.topic("receipts")
        self.poll_interval = poll_interval
        self._waiters: dict[str, _Waiter] = {}
        self._lock = threading.Lock()
        self._follower: TopicFollower | None = None
        self.received = 0  # receipts read (all event ids)
        self.bad = 0  # undecodable receipts seen

    # ------------------------------------------------------------------ lifecycle
    @property
    def running(self) -> bool:
        return self._follower is not None and self._follower.running

    def start(self, timeout: float | None = None) -> ReceiptListener:
        """Fix the start offsets (every partition's current end), then read in a daemon thread.
        Idempotent. ``ClientError`` if the broker or the topic is not there within ``timeout``."""
        if self._follower is not None:
            return self
        follower = TopicFollower(self.settings, self.topic, self._on_record, start_at="end",
                                 role="client-receipts", poll_interval=self.poll_interval)
        try:
            follower.start(wait_assigned=self.settings.admin_timeout if timeout is None else timeout)
        except TopicReadError:
            follower.stop()
            raise ClientError(f"cannot read {self.topic} on {self.settings.bootstrap}: {follower.error or 'timed out'}"
                              " (is the broker up? run `unlearn topics create` with the same --prefix first)"
                              ) from None
        self._follower = follower
        return self

    def close(self) -> None:
        """Stop the thread and close the consumer (pending waits then time out)."""
        if self._follower is not None:
            self._follower.stop()

    # ------------------------------------------------------------------ waiting
    def register(self, event_id: str) -> None:
        """Keep the receipt of ``event_id`` when it comes (call BEFORE producing the request)."""
        with self._lock:
            self._waiters.setdefault(event_id, _Waiter())

    def forget(self, event_id: str) -> None:
        """Stop keeping the receipt of ``event_id`` (collected, or its request failed)."""
        with self._lock:
            self._waiters.pop(event_id, None)

    def get(self, event_id: str) -> Receipt | None:
        """The receipt if it already arrived (non-blocking)."""
        with self._lock:
            w = self._waiters.get(event_id)
        return w.receipt if w is not None else None

    def wait(self, event_id: str, timeout: float) -> Receipt | None:
        """Block until the receipt of a registered event id arrives; None on timeout, ClientError
        if the reading thread died (its error says why)."""
        with self._lock:
            w = self._waiters.get(event_id)
        if w is None:
            raise ClientError(f"event {event_id!r} was not registered with this receipt listener")
        deadline = time.monotonic() + max(0.0, timeout)
        while not w.event.wait(min(0.25, max(0.0, deadline - time.monotonic()))):
            failure = self._failure()
            if failure is not None:
                raise ClientError(f"receipt listener failed: {failure}")
            if time.monotonic() >= deadline:
                return None
        return w.receipt

    def _failure(self) -> str | None:
        """Why the reading thread stopped by itself (None while it runs or after ``close()``)."""
        f = self._follower
        if f is None or f.running or f.error is None:
            return None
        return f.error

    # ------------------------------------------------------------------ thread
    def _on_record(self, record: LogRecord) -> None:
        """Runs in the follower's thread: decode, and hand a registered receipt to its waiter."""
        self.received += 1
        if record.value is None:
            return
        try:
            r = decode_receipt(record.value)
        except CodecError as exc:
            self.bad += 1
            log.warning("undecodable receipt at %s/%d@%d: %s", self.topic, record.partition, record.offset, exc)
            return
        with self._lock:
            w = self._waiters.get(r.event_id)
        if w is not None and w.receipt is None:
            w.receipt = r
            w.event.set()
