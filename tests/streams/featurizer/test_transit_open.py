"""The featurizer's derived transit keys (streams/featurizer/transit_open.DerivedKeys, docs/erasure.md
section 5): one X25519 exchange per (transit key, producer epk), a bounded LRU, and no derived key
outlives its private key: destroying a transit key (or handing its partition over) drops every
AES key derived from it. The SDK side (services/client/sdk.py) reuses one ephemeral key
per transit key. No broker: key families and topic metadata are stand-ins."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from unlearn.infra.settings import Settings
from unlearn.schemas.envelope import Request
from unlearn.schemas.request_inputs import SealedInput, TextInput
from unlearn.schemas.transit import TransitError, TransitPublicKey, TransitSealer, new_transit_key
from unlearn.services.client.transit_key_cache import TransitKeyCache, seal_for_transit
from unlearn.streams.featurizer.erasure import TransitKeys
from unlearn.streams.featurizer.transit_keys import Epoch
from unlearn.streams.featurizer.transit_open import DerivedKeys, UnopenedRequest, open_sealed


def _add(i: int) -> Request:
    return Request(f"ev{i}", "add", "faces", "app", "alice", f"x{i}", 1, TextInput(f"secret {i}"), 1.0)


def _transit() -> tuple[TransitKeys, list[Epoch]]:
    s = Settings.from_env()
    transit = TransitKeys(s, cast(Any, SimpleNamespace(drop=lambda p: None)), "t.requests", "t.requests.by-head")
    eps = [Epoch(p, new_transit_key(), 0.0, 1e12) for p in (0, 0, 1)]
    for e in eps:
        transit.epochs.setdefault(e.partition, {})[e.pair.key_id] = e
    return transit, eps


def test_one_derivation_per_producer_session_and_every_request_opens() -> None:
    transit, (e0, _, _) = _transit()
    producers = [TransitSealer(e0.public) for _ in range(3)]
    batch = [sealer.seal_request(_add(i)) for i in range(12) for sealer in producers]
    opened = open_sealed(batch, transit.gate(0))
    assert opened == [_add(i) for i in range(12) for _ in producers]
    assert transit.derived is not None and len(transit.derived) == 3  # one per (key, epk)


def test_the_cache_is_bounded_least_recently_used_and_keeps_no_failed_derivation() -> None:
    pair = new_transit_key()
    epks = [TransitSealer(TransitPublicKey(0, pair.key_id, pair.public_key, 0.0, 1.0)).epk for _ in range(4)]
    cache = DerivedKeys(2)
    a = cache.get(pair, epks[0])
    cache.get(pair, epks[1])
    assert cache.get(pair, epks[0]) is a  # a hit, and now the most recent
    cache.get(pair, epks[2])  # evicts epks[1]
    assert len(cache) == 2 and cache.get(pair, epks[0]) is a
    with pytest.raises(TransitError):
        cache.get(pair, bytes(32))
    assert len(cache) == 2 and repr(cache) == "DerivedKeys(2/2)"
    none = DerivedKeys(0)
    none.get(pair, epks[3])
    assert len(none) == 0


def test_destroying_a_transit_key_drops_every_key_derived_from_it() -> None:
    transit, (e0, e1, e2) = _transit()
    for e in (e0, e1, e2):
        for _ in range(2):
            (opened,) = open_sealed([TransitSealer(e.public).seal_request(_add(0))], transit.gate(e.partition))
            assert isinstance(opened, Request)
    derived = transit.derived
    assert derived is not None and derived.key_ids() == {e0.pair.key_id, e1.pair.key_id, e2.pair.key_id}
    late = TransitSealer(e0.public).seal_request(_add(1))
    transit.forget(0, [e0.ref])  # what destroy() does once the key family rotated it out
    assert derived.key_ids() == {e1.pair.key_id, e2.pair.key_id} and len(derived) == 4
    (refused,) = open_sealed([late], transit.gate(0))
    assert isinstance(refused, UnopenedRequest) and refused.reason == "transit_key_destroyed"
    assert e0.pair.key_id not in derived.key_ids()
    transit.drop(1)  # partition handed over: its keys leave this featurizer, derived ones too
    assert derived.key_ids() == {e1.pair.key_id}


def test_the_sdk_reuses_one_ephemeral_key_per_transit_key_and_rolls_it() -> None:
    s = Settings.from_env(transit_seal="always")
    cache = TransitKeyCache(s)
    cache._partitions = (1, 1)  # topic metadata as if read: one by-head partition
    first, second = new_transit_key(), new_transit_key()
    cache.keys[0] = TransitPublicKey(0, first.key_id, first.public_key, time.time(), time.time() + 3600)
    sealed = [seal_for_transit(_add(i), cache, "always").input for i in range(3)]
    assert all(isinstance(x, SealedInput) for x in sealed)
    assert len({x.epk for x in sealed if isinstance(x, SealedInput)}) == 1  # one ephemeral key
    sealer = cache.sealer_for("faces")
    assert sealer is not None and sealer.sealed == 3
    sealer.sealed = sealer.max_messages  # exhausted: a new ephemeral key
    rolled = cache.sealer_for("faces")
    assert rolled is not None and rolled is not sealer and rolled.epk != sealer.epk
    cache.keys[0] = TransitPublicKey(0, second.key_id, second.public_key, time.time(), time.time() + 3600)
    changed = cache.sealer_for("faces")  # the transit key changed: a new ephemeral key for it
    assert changed is not None and changed.public.key_id == second.key_id and changed.epk != rolled.epk
    changed.public = TransitPublicKey(0, second.key_id, second.public_key, 0.0, 1.0)  # its use_until passed
    cache.keys[0] = changed.public
    cache._tried[0] = time.time()  # no re-read: no key now
    assert cache.sealer_for("faces") is None and cache.sealers == {}  # the stale derived key is dropped
    cache.sealers[0] = rolled
    cache.close()
    assert cache.sealers == {}
