"""The served heads: one immutable :class:`ServedHead` per head id, swapped in one assignment.

A request reads ONE reference and computes everything (scores, variance, version, digest) from
it, so a response can never mix two heads. Which update is newer is ``HeadUpdate.supersedes``:
the one ordering of head updates every reader in the project uses.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from unlearn.schemas.head import HeadUpdate, retained_class_list

__all__ = ["HeadStore", "OfferResult", "ServedHead"]

#: What ``HeadStore.offer`` did with an update.
OfferResult = Literal["accepted", "stale"]


@dataclass(frozen=True, eq=False)
class ServedHead:
    """One immutable served state of a head: the update and the posterior used for variance.

    ``posterior`` is the update's own T when it carries one, else the T of the last exact update
    of this head that carried one (``posterior_version`` says which; None when never seen), so
    variance stays available between resets and the response can name how stale it is.
    """

    update: HeadUpdate
    received_at: float  # wall clock when this update was accepted
    posterior: np.ndarray | None
    posterior_version: int | None
    posterior_digest: str | None

    @property
    def posterior_source(self) -> str | None:
        """"current_head" | "last_exact_head" | None: where the variance comes from."""
        if self.posterior is None:
            return None
        return "current_head" if self.update.posterior is not None else "last_exact_head"

    def summary(self, now: float | None = None) -> dict[str, Any]:
        """The JSON summary of ``GET /v1/heads/{head}`` (ages relative to ``now``)."""
        now = time.time() if now is None else now
        u = self.update
        return {
            "head_id": u.head_id,
            "version": u.version,
            "mode": u.mode,
            "digest": u.digest,
            "n_retained": u.n_retained,
            "events_covered": u.events_covered,
            "d": u.d,
            "c": u.c,
            "retained_classes": retained_class_list(u),
            "gamma": u.gamma,
            "contract_version": u.contract_version,
            "drift": u.drift,
            "offsets": [[p, o] for p, o in u.offsets],
            "created_ts": u.created_ts,
            "age_seconds": max(0.0, now - u.created_ts),
            "received_age_seconds": max(0.0, now - self.received_at),
            "has_posterior": u.posterior is not None,
            "posterior_version": self.posterior_version,
        }


class HeadStore:
    """head id -> current :class:`ServedHead`. Writers (the follower) serialize on a lock;
    readers take one reference with ``get`` (a dict read: atomic) and never lock, so requests
    never wait for a swap."""

    def __init__(self) -> None:
        self._heads: dict[str, ServedHead] = {}
        self._lock = threading.Lock()

    def offer(self, update: HeadUpdate, now: float | None = None) -> OfferResult:
        """Serve ``update`` if it supersedes the current head: returns "accepted" or "stale"."""
        now = time.time() if now is None else now
        with self._lock:
            cur = self._heads.get(update.head_id)
            if cur is not None and not update.supersedes(cur.update):
                return "stale"
            post: np.ndarray | None
            pv: int | None
            pd: str | None
            if update.posterior is not None:
                post, pv, pd = update.posterior, update.version, update.digest
            elif cur is not None and cur.posterior is not None and cur.posterior.shape[0] == update.d:
                post, pv, pd = cur.posterior, cur.posterior_version, cur.posterior_digest
            else:
                post, pv, pd = None, None, None
            # One reference replaced: a reader holds either the old or the new object, never a mix.
            self._heads[update.head_id] = ServedHead(update, now, post, pv, pd)
            return "accepted"

    def get(self, head_id: str) -> ServedHead | None:
        """The current served state of ``head_id`` (one reference: use it for the whole request)."""
        return self._heads.get(head_id)

    def all(self) -> dict[str, ServedHead]:
        """A snapshot copy: head id -> served head."""
        return dict(self._heads)

    def __len__(self) -> int:
        return len(self._heads)
