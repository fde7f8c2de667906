"""Transit sealing on the producer side (services/client/transit_key_cache.py).

Threads producing through one SDK client share its transit sealers
(services/client/transit_key_cache.py, schemas/transit.TransitSealer): no derived key ever seals
more than its bound, every sealed add opens, and the cache holds one sealer per by-head
partition. The bound is set low so that the threads roll many ephemeral keys. No broker: topic
metadata and the published key are stand-ins (as in tests/streams/featurizer/test_transit_open.py).

``UNLEARN_TRANSIT_SEAL=auto`` never sends an add in plaintext for want of a transit key
(docs/client.md "Transit sealing"): it waits, bounded by ``UNLEARN_TRANSIT_WAIT_SECONDS``, for the
featurizer's key, seals under it once published, and raises instead of producing when none comes.
Real broker: the key is published on ``transit-keys`` as a featurizer would."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from tests.thread_support import run_racing
from unlearn.common.by_head import head_partition
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import producer_config
from unlearn.runtime.topic_reader import read_topic
from unlearn.schemas.envelope import Request, parse_request
from unlearn.schemas.request_inputs import FeaturesInput, SealedInput, TextInput
from unlearn.schemas.transit import TransitPublicKey, encode_public_record, new_transit_key, open_request
from unlearn.services.client.errors import ClientError
from unlearn.services.client.sdk import UnlearnClient
from unlearn.services.client.transit_key_cache import TransitKeyCache, seal_for_transit


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


def publish_later(s: Settings, head: str, delay: float) -> tuple[threading.Thread, object]:
    """Publish a transit key for ``head``'s by-head partition after ``delay`` seconds."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from unlearn.runtime.clients import admin_config

    md = AdminClient(admin_config(s)).list_topics(timeout=30).topics
    p = head_partition(head, len(md[s.topic("requests.by-head")].partitions))
    n_keys = len(md[s.topic("transit-keys")].partitions)
    pair = new_transit_key()

    def run() -> None:
        time.sleep(delay)
        pub = TransitPublicKey(p, pair.key_id, pair.public_key, time.time(), time.time() + 600)
        prod = Producer(producer_config(s))
        prod.produce(s.topic("transit-keys"), key=f"p{p}".encode(), value=encode_public_record(pub),
                     partition=p % n_keys)
        assert prod.flush(30) == 0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, pair


def test_auto_waits_for_the_first_transit_key_and_seals_under_it(settings: Settings) -> None:
    s = settings.with_(transit_seal="auto", transit_wait_seconds=30.0)
    publisher, pair = publish_later(s, "fresh", 3.0)
    with UnlearnClient(s, client_id="early") as client:
        client.add("fresh", "alice", "a1", 0, features=[0.25, -0.5, 0.75]).wait_delivered(30)
    publisher.join(30)
    # sealed under the key published after the add was called: it waited rather than sent plaintext
    (rec,) = read_topic(s, s.topic("requests"), timeout=30)
    sent = parse_request(rec.value or b"")
    assert isinstance(sent.input, SealedInput) and sent.input.key_id == pair.key_id  # type: ignore[attr-defined]
    opened = open_request(sent, pair)  # type: ignore[arg-type]
    assert isinstance(opened.input, FeaturesInput) and list(opened.input.values) == [0.25, -0.5, 0.75]


def test_auto_raises_and_produces_nothing_when_no_key_comes(settings: Settings) -> None:
    s = settings.with_(transit_seal="auto", transit_wait_seconds=2.0)
    with UnlearnClient(s, client_id="early") as client:
        with pytest.raises(ClientError, match="not sent rather than sent in plaintext") as exc:
            client.add("nobody", "bob", "b1", 1, features=[1.0, 2.0, 3.0])
        assert "UNLEARN_TRANSIT_WAIT_SECONDS" in str(exc.value) and "UNLEARN_TRANSIT_SEAL=off" in str(exc.value)
        client.delete("nobody", "b1", "bob").wait_delivered(30)  # deletes carry no input: never held back
    recs = read_topic(s, s.topic("requests"), timeout=30)
    assert [parse_request(r.value or b"").op for r in recs] == ["delete"]  # the add never left the client
