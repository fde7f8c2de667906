"""Opening inputs sealed for transit (docs/erasure.md section 5), right after parsing and before
anything is judged.

Every add whose input is sealed (``schemas/sealed.py``) is opened under its by-head partition's
transit key (:func:`open_sealed`); one that cannot be opened becomes an :class:`UnopenedRequest`
(an ``InvalidRequest`` that keeps the parsed request, so its dead letter names the event) with one
of :data:`TRANSIT_REASONS`; the dead letter keeps the sealed bytes, noise once the transit key is
destroyed. With ``UNLEARN_REQUIRE_SEALED_INPUT`` a plaintext add is refused the same way. A
producer reuses one ephemeral key for many requests, so the AES key derived per (transit key id,
epk) is kept in :class:`DerivedKeys`, a bounded LRU: one X25519 exchange and HKDF per producer
session and epoch instead of per request. Its entries for a transit key are dropped when that key
is destroyed or its partition revoked (``erasure.TransitKeys.forget`` / ``drop``): no derived key
outlives its private key.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from unlearn.schemas.envelope import Request
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.request_inputs import SealedInput
from unlearn.schemas.transit import TransitError, TransitKeyPair, open_request, opening_key

__all__ = [
    "TRANSIT_REASONS",
    "UnopenedRequest",
    "DERIVED_KEYS",
    "DerivedKeys",
    "TransitGate",
    "open_sealed",
]


TRANSIT_REASONS: dict[str, str] = {
    "transit_key_unknown": "a sealed input names a transit key this featurizer does not hold for the head's by-head "
                           "partition (never issued, issued for another partition, destroyed before this featurizer "
                           "took the partition over, or no transit keys here: federated or UNLEARN_SEAL_ROWS off)",
    "transit_key_destroyed": "a sealed input names a transit key this featurizer already destroyed (sealed after its "
                             "use_until, or delivered after its grace period)",
    "transit_open_failed": "a sealed input does not open under its transit key (moved to another event, head, "
                           "subject or sample, or corrupt)",
    "unsealed_input": "a plaintext add while UNLEARN_REQUIRE_SEALED_INPUT is on",
}
"""Reason codes of opening sealed inputs (part of ``FEATURIZER_REASONS``; ``bad_sealed_input`` is the envelope's)."""


class UnopenedRequest(InvalidRequest):
    """A parsed request refused before judging; ``request`` names its ids for the dead letter."""

    def __init__(self, request: Request, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.request = request


DERIVED_KEYS = 4096  # AES keys a featurizer keeps (a few per producer session and transit key)


class DerivedKeys:
    """The AES keys derived per (transit key id, epk), least recently used dropped beyond
    ``size`` (0: none kept, every request derives its own). Not thread-safe: one per featurizer,
    used by its batch loop."""

    def __init__(self, size: int = DERIVED_KEYS) -> None:
        self.size = size
        self._keys: OrderedDict[tuple[str, bytes], AESGCM] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:  # never print key material
        return f"DerivedKeys({len(self._keys)}/{self.size})"

    def get(self, pair: TransitKeyPair, epk: bytes) -> AESGCM:
        """The key for ``pair`` and ``epk``, derived on a miss (TransitError: unusable epk; not kept)."""
        k = (pair.key_id, bytes(epk))
        aead = self._keys.get(k)
        if aead is not None:
            self._keys.move_to_end(k)
            return aead
        aead = opening_key(pair, k[1])
        if self.size > 0:
            self._keys[k] = aead
            while len(self._keys) > self.size:
                self._keys.popitem(last=False)
        return aead

    def drop(self, key_ids: Iterable[str]) -> int:
        """Forget every key derived from these transit keys (destroyed or handed over); how many."""
        gone = set(key_ids)
        stale = [k for k in self._keys if k[0] in gone]
        for k in stale:
            del self._keys[k]
        return len(stale)

    def key_ids(self) -> set[str]:
        """The transit key ids with a derived key here (for tests and erasure checks)."""
        return {kid for kid, _ in self._keys}


@dataclass(frozen=True)
class TransitGate:
    """One by-head partition's transit keys, as the batch sees them; ``derived``: the
    featurizer's derived-key cache (None: derive per request)."""

    lookup: Callable[[str], TransitKeyPair | None]
    was_destroyed: Callable[[str], bool]
    derived: DerivedKeys | None = None


def _open(r: Request, gate: TransitGate | None) -> Request:
    assert isinstance(r.input, SealedInput)
    kid = r.input.key_id
    pair = gate.lookup(kid) if gate is not None else None
    if gate is None or pair is None:
        if gate is not None and gate.was_destroyed(kid):
            raise UnopenedRequest(r, "transit_key_destroyed", f"transit key {kid} was destroyed")
        raise UnopenedRequest(r, "transit_key_unknown", f"transit key {kid} is not held for this head's partition")
    try:
        return open_request(r, pair, gate.derived.get(pair, r.input.epk) if gate.derived is not None else None)
    except TransitError as exc:
        raise UnopenedRequest(r, "transit_open_failed", str(exc)) from None
    except InvalidRequest as exc:  # the opened input is not a valid inner input
        raise UnopenedRequest(r, exc.reason, f"opened sealed input: {exc.detail}") from None


def open_sealed(reqs: Sequence[Request | InvalidRequest], gate: TransitGate | None,
                require_sealed: bool = False) -> list[Request | InvalidRequest]:
    """``reqs`` with every sealed input opened (or the request refused: :class:`UnopenedRequest`);
    with ``require_sealed``, plaintext adds are refused (``unsealed_input``)."""
    out: list[Request | InvalidRequest] = []
    for r in reqs:
        if isinstance(r, Request) and r.op == "add":
            try:
                if isinstance(r.input, SealedInput):
                    r = _open(r, gate)
                elif require_sealed:
                    raise UnopenedRequest(r, "unsealed_input", "this featurizer accepts only adds sealed for transit")
            except UnopenedRequest as exc:
                out.append(exc)
                continue
        out.append(r)
    return out
