"""Threads producing through one SDK client share its transit sealers (services/client/sdk.py,
schemas/sealed.TransitSealer): no derived key ever seals more than its bound, every sealed add
opens, and the cache holds one sealer per by-head partition. The bound is set low so that the
threads roll many ephemeral keys. No broker: topic metadata and the published key are stand-ins
(as in tests/streams/featurizer/test_transit_keys.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter

from tests.thread_support import run_racing
from unlearn.infra.settings import Settings
from unlearn.schemas.envelope import Request, SealedInput, TextInput
from unlearn.schemas.sealed import TransitPublicKey, new_transit_key, open_request
from unlearn.services.client.sdk import TransitKeyCache, seal_for_transit


def test_threads_sharing_a_client_never_seal_past_the_bound_of_one_derived_key() -> None:
    cap, threads, each = 16, 8, 60
    pair = new_transit_key()
    cache = TransitKeyCache(Settings.from_env(transit_seal="always"), max_messages=cap)
    cache._partitions = (1, 1)  # topic metadata as if read: one by-head partition
    cache.keys[0] = TransitPublicKey(0, pair.key_id, pair.public_key, time.time(), time.time() + 3600)
    barrier = threading.Barrier(threads)
    out: list[list[tuple[Request, Request]]] = [[] for _ in range(threads)]

    def work(t: int) -> None:
        barrier.wait()
        for i in range(each):
            req = Request(f"ev{t}-{i}", "add", "faces", "app", "alice", f"x{t}-{i}", 1, TextInput(f"s{t}-{i}"), 1.0)
            out[t].append((req, seal_for_transit(req, cache, "always")))

    run_racing(work, threads)
    pairs = [p for o in out for p in o]
    assert len(pairs) == threads * each
    per_key = Counter(s.input.epk for _, s in pairs if isinstance(s.input, SealedInput))
    assert sum(per_key.values()) == threads * each  # every add sealed
    assert max(per_key.values()) <= cap  # no derived key past its bound
    assert len(per_key) >= threads * each // cap
    assert all(open_request(s, pair) == req for req, s in pairs)
    assert len(cache.sealers) == 1 and cache.sealers[0].sealed <= cap
    cache.close()
