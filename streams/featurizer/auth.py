"""Signed requests in the featurizer: who sent a request, and may it do this?

With ``UNLEARN_AUTH_MODE=signed`` every request of a batch is screened, in offset order and
before any backbone runs (:meth:`Authorizer.screen`), against a snapshot of the client registry
(``common/registry.py``). The checks, in order, each with its reason code
(:data:`AUTH_REASONS`):

1. the record carries the signature headers (``unsigned``) and they decode (``bad_signature``);
2. the envelope's ``client_id`` is registered (``unknown_client``), has the header's key id
   (``unknown_key``), and neither is revoked (``revoked_client``, ``revoked_key``);
3. the signature verifies over the exact value bytes (``bad_signature``); the key is looked up
   under the envelope's client, so a signature made with another client's key never passes;
4. the client may write the head (``head_not_allowed``);
5. the envelope's ``ts`` is within the replay window of the featurizer's clock (``stale_request``),
   and the client has not used the event id in the window (``replayed``);
6. the client's token bucket has a token (``rate_limited``); only authenticated requests spend
   tokens, so nobody can drain another client's bucket with unsigned requests.

Refusals are dead letters; a refused delete also gets a rejected receipt only when its
signature was valid (:data:`NO_RECEIPT_REASONS`), and an invalid envelope gets none in signed
mode: only a client's own key can make the featurizer answer under that client's event ids.

Deletes are checked once more when judged (:meth:`Authorizer.check_owner`): a delete of a
sample another client added (the cache records who added each sample) needs
``may_delete_others`` (``not_owner``).

The replay window and the buckets are per by-head partition and in memory (:class:`AuthState`):
bounded by the window, lost on a restart or a partition move (docs/security.md says what that
leaves open).

The decisions (:class:`Authorizer`, :class:`AuthState`) do no I/O. :class:`AuthGate` is the part
that does: it follows the client registry and keeps each by-head partition's :class:`AuthState`;
with ``UNLEARN_AUTH_MODE=off`` the featurizer has none.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from unlearn.common.registry import ClientRegistryView
from unlearn.features.contract import FeatureRejected
from unlearn.infra.settings import Settings
from unlearn.runtime.retry import RetryPolicy
from unlearn.schemas.client_record import ClientRecord
from unlearn.schemas.envelope import Request
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.signature import SignatureFormatError, read_signature, verify_value
from unlearn.streams.featurizer.settings import FeaturizerSettings

__all__ = [
    "AUTH_REASONS",
    "NO_RECEIPT_REASONS",
    "UNAUTHENTICATED_REASONS",
    "AuthState",
    "Authorizer",
    "Screened",
    "AuthGate",
]

if TYPE_CHECKING:
    from unlearn.streams.featurizer.batch_io import InMessage
    from unlearn.streams.featurizer.cache_view import CachedSample

AUTH_REASONS: dict[str, str] = {
    "unsigned": "UNLEARN_AUTH_MODE=signed: the request has no signature headers (unlearn-sig-key, unlearn-sig)",
    "bad_signature": "signed mode: malformed signature headers, or the Ed25519 signature does not verify over the "
                     "value's exact bytes with the named key of the envelope's client",
    "unknown_client": "signed mode: the envelope's client_id is not in the client registry",
    "unknown_key": "signed mode: the client has no key with the unlearn-sig-key id",
    "revoked_key": "signed mode: the signing key is revoked",
    "revoked_client": "signed mode: the client is revoked",
    "head_not_allowed": "signed mode: the client may not write this head (its registry `heads`)",
    "not_owner": "signed mode: a delete of a sample another client added, by a client without may_delete_others",
    "stale_request": "signed mode: no ts, or ts further than UNLEARN_AUTH_REPLAY_WINDOW_SECONDS from the "
                     "featurizer's clock",
    "replayed": "signed mode: an event id the client already used within the replay window (dead letter only: "
                "the first copy's receipt answers the event)",
    "rate_limited": "signed mode: the client's token bucket (rate_per_second, burst) is empty",
}
"""Every reason code of this module (part of ``FEATURIZER_REASONS``)."""

UNAUTHENTICATED_REASONS = frozenset({"unsigned", "bad_signature", "unknown_client", "unknown_key", "revoked_client",
                                     "revoked_key"})
"""Refusals of requests no valid, unrevoked key vouches for."""
NO_RECEIPT_REASONS = UNAUTHENTICATED_REASONS | {"replayed"}
"""Refusals that get a dead letter but no rejected receipt: receipts are matched by event id, so a
receipt for an unauthenticated request would let anyone who can write ``requests`` answer another
client's pending delete with a forged rejection; and a replay's event id was answered already."""


@dataclass
class AuthState:
    """What one by-head partition remembers between batches: the event ids used within the
    window (per client, with their expiry ``ts + window``) and each client's token bucket
    ``(tokens, at)``."""

    seen: dict[tuple[str, str], float] = field(default_factory=dict)
    expiries: list[tuple[float, str, str]] = field(default_factory=list)
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def forget_expired(self, now: float) -> None:
        """Drop event ids whose window has passed: a copy of them is now ``stale_request``."""
        while self.expiries and self.expiries[0][0] < now:
            expiry, client, event = heapq.heappop(self.expiries)
            if self.seen.get((client, event)) == expiry:
                del self.seen[(client, event)]

    def remember(self, client: str, event: str, expiry: float) -> None:
        """Record an event id as used until ``expiry``."""
        self.seen[(client, event)] = expiry
        heapq.heappush(self.expiries, (expiry, client, event))

    def take_token(self, c: ClientRecord, now: float) -> bool:
        """Spend one token of ``c``'s bucket (refilled at ``rate_per_second`` up to ``burst``);
        False when empty. A rate of 0 means no limit."""
        if c.rate_per_second == 0:
            return True
        tokens, at = self.buckets.get(c.client_id, (float(c.burst), now))
        tokens = min(float(c.burst), tokens + max(0.0, now - at) * c.rate_per_second)
        if tokens < 1.0:
            self.buckets[c.client_id] = (tokens, now)
            return False
        self.buckets[c.client_id] = (tokens - 1.0, now)
        return True


@dataclass
class Screened:
    """The outcome of screening a batch: refusals and the authenticated client, by index."""

    denied: dict[int, FeatureRejected] = field(default_factory=dict)
    clients: dict[int, ClientRecord] = field(default_factory=dict)

    def admitted(self, reqs: Sequence[Request | InvalidRequest]) -> list[Request | InvalidRequest]:
        """``reqs`` with the refused ones masked, for encoding: a refused add costs no backbone time."""
        return [InvalidRequest("screened", "") if i in self.denied else r for i, r in enumerate(reqs)]


class Authorizer:
    """Screens requests against one registry snapshot, with one partition's :class:`AuthState`."""

    def __init__(self, clients: Mapping[str, ClientRecord], state: AuthState, window: float) -> None:
        if not window > 0:
            raise ValueError(f"the replay window must be > 0 seconds, got {window}")
        self.clients = clients
        self.state = state
        self.window = float(window)

    def admit(self, m: InMessage, r: Request, now: float) -> ClientRecord:
        """The client that sent ``r``, if every check of the module docstring passes; raises
        ``FeatureRejected`` with the first failing check's reason. Spends a token and records the
        event id only when the request is admitted. (:meth:`screen` forgets expired event ids first.)"""
        try:
            sig = read_signature(m.headers)
        except SignatureFormatError as exc:
            raise FeatureRejected("bad_signature", str(exc)) from None
        if sig is None:
            raise FeatureRejected("unsigned", "UNLEARN_AUTH_MODE=signed and the request carries no signature")
        key_id, signature = sig
        c = self.clients.get(r.client_id)
        if c is None:
            raise FeatureRejected("unknown_client", f"client {r.client_id!r} is not registered")
        key = c.key(key_id)
        if key is None:
            raise FeatureRejected("unknown_key", f"client {r.client_id!r} has no key {key_id[:128]!r}")
        if c.revoked:
            raise FeatureRejected("revoked_client", f"client {r.client_id!r} is revoked")
        if key.revoked:
            raise FeatureRejected("revoked_key", f"key {key_id!r} of client {r.client_id!r} is revoked")
        if m.value is None or not verify_value(m.value, signature, key.public_key):
            raise FeatureRejected("bad_signature", f"the signature does not verify with key {key_id!r} of client "
                                                   f"{r.client_id!r}")
        if not c.may_write(r.head_id):
            raise FeatureRejected("head_not_allowed", f"client {r.client_id!r} may not write head {r.head_id!r}")
        if r.ts is None or abs(now - r.ts) > self.window:
            got = "no ts" if r.ts is None else f"ts {r.ts:.3f} is {now - r.ts:+.1f} s from now"
            raise FeatureRejected("stale_request", f"{got}; signed requests must be within "
                                                   f"{self.window:g} s of the featurizer's clock")
        if (c.client_id, r.event_id) in self.state.seen:
            raise FeatureRejected("replayed", f"client {r.client_id!r} already used event id {r.event_id!r} "
                                              f"within {self.window:g} s")
        if not self.state.take_token(c, now):
            raise FeatureRejected("rate_limited", f"client {r.client_id!r} is over {c.rate_per_second:g} "
                                                  f"requests/s (burst {c.burst})")
        self.state.remember(c.client_id, r.event_id, r.ts + self.window)
        return c

    def screen(self, messages: Sequence[InMessage], reqs: Sequence[Request | InvalidRequest],
               now: float) -> Screened:
        """Screen a batch in offset order (invalid requests are left to the envelope's reasons)."""
        out = Screened()
        self.state.forget_expired(now)
        for i, (m, r) in enumerate(zip(messages, reqs, strict=True)):
            if not isinstance(r, Request):
                continue
            try:
                out.clients[i] = self.admit(m, r, now)
            except FeatureRejected as rej:
                out.denied[i] = rej
        return out

    @staticmethod
    def check_owner(client: ClientRecord, r: Request, samples: Sequence[CachedSample]) -> None:
        """Raise ``FeatureRejected("not_owner")`` when a delete would remove a sample another
        client added and ``client`` lacks ``may_delete_others`` (all or nothing for a
        delete_subject: nothing is removed)."""
        if client.may_delete_others:
            return
        others = sorted({cs.client_id for cs in samples if cs.client_id != client.client_id})
        if others:
            raise FeatureRejected("not_owner", f"client {client.client_id!r} may not delete samples added by "
                                               f"{', '.join(repr(o) for o in others[:3])} (may_delete_others "
                                               f"is off); event {r.event_id!r}")


class AuthGate:
    """Registry follower plus per-partition replay windows and token buckets (signed mode only:
    with ``UNLEARN_AUTH_MODE=off`` the featurizer has no gate)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.view: ClientRegistryView | None = None
        self.states: dict[int, AuthState] = {}

    def start(self) -> None:
        """Read the client registry to its end before judging anything (a request is never
        refused as ``unknown_client`` only because the registry was not read)."""
        # the follower rides through a broker restart itself: waited for up to the retry deadline
        self.view = ClientRegistryView(self.settings).start(wait_caught_up=RetryPolicy.of(self.settings).deadline_s)

    def stop(self) -> None:
        """Stop following the registry."""
        if self.view is not None:
            self.view.stop()
            self.view = None

    def authorizer(self, partition: int) -> Authorizer:
        """The authorizer for one batch of ``partition`` (one registry snapshot)."""
        assert self.view is not None, "AuthGate.start() first"
        state = self.states.setdefault(partition, AuthState())
        return Authorizer(self.view.snapshot(), state, FeaturizerSettings.of(self.settings).auth_replay_window_seconds)
