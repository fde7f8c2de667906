"""The head pages' verifier certificates, computed in the background, one at a time.

A head page never waits for the verifier: it shows the latest certificate finished for the head
(with the version it certifies) and asks for one of the live version, which a single worker
computes in a thread; the page says when one is being computed or waiting for the worker. Only
the newest version asked for is kept per head, so the queue holds at most one entry per head.
Certificates are kept in memory, the latest per head (the version is the seed: the ``unlearn
verify`` line the page shows runs the same checks again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CertKey", "CertState", "Certifier"]

log = logging.getLogger("unlearn.audit")

#: (head, version, mode) of a live head update: what a certificate certifies.
CertKey = tuple[str, int, str]


@dataclass
class CertState:
    """What a head page shows: the latest finished certificate and what it certifies (None: none
    yet), and the live version's state: ``"done"``, ``"computing"`` or ``"waiting"`` (queued
    behind another head's)."""

    certificate: dict[str, Any] | None
    certifies: CertKey | None
    live: CertKey
    status: str

    @property
    def current(self) -> bool:
        return self.certifies == self.live


class Certifier:
    """Runs ``run(head, seed)`` (blocking: the verifier; None when it could not run) in a worker
    thread for one key at a time; ``state(key)`` answers at once and queues ``key`` when it has
    no certificate yet. A run that fails is not kept: the next request asks again."""

    def __init__(self, run: Callable[[str, int], dict[str, Any] | None]) -> None:
        self._run = run
        self.done: dict[str, tuple[CertKey, dict[str, Any]]] = {}  # head -> latest finished
        self.wanted: dict[str, CertKey] = {}  # head -> newest key asked for, not started
        self.running: CertKey | None = None
        self.failed: dict[str, CertKey] = {}  # head -> the last key whose run could not finish
        self._task: asyncio.Task[None] | None = None

    def state(self, key: CertKey) -> CertState:
        head = key[0]
        have = self.done.get(head)
        if have is not None and have[0] == key:
            return CertState(have[1], key, key, "done")
        if self.running != key:
            self.wanted[head] = key
            self._start_next()
        status = "computing" if self.running == key else "waiting"
        if self.failed.get(head) == key:
            status += " again"  # the last run of this key could not finish (see the server log)
        return CertState(have[1] if have else None, have[0] if have else None, key, status)

    def _start_next(self) -> None:
        if self.running is not None or not self.wanted:
            return
        head = next(iter(self.wanted))
        self.running = self.wanted.pop(head)
        self._task = asyncio.get_running_loop().create_task(self._compute(self.running))

    async def _compute(self, key: CertKey) -> None:
        try:
            cert = await asyncio.to_thread(self._run, key[0], key[1])
        except Exception:  # a crash of one run must not stop the worker
            log.exception("verify %s version %s", key[0], key[1])
            cert = None
        if cert is None:
            self.failed[key[0]] = key
        else:
            self.failed.pop(key[0], None)
            prev = self.done.get(key[0])
            if prev is None or (prev[0][1], prev[0][2] == "exact") <= (key[1], key[2] == "exact"):
                self.done[key[0]] = (key, cert)
        self.running = None
        self._start_next()

    async def idle(self) -> None:
        """Wait until nothing runs or is queued (tests, shutdown)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
