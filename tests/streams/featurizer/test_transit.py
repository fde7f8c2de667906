"""Transit keys on a real broker (streams/featurizer/erasure.py, docs/erasure.md section 5): the
public half is published after the private half is durable; a superseded key is destroyed only
once its grace has passed AND the router (the group's committed requests offsets) and the
featurizer (its durable by-head position) have passed every record that could carry it; a
request sealed under it afterwards is refused with the documented reason; destroying it rotates
only the ``transit-private`` family, never the sample keys' ``subject-keys``. Time is a test clock:
nothing here waits for a rotation."""

from __future__ import annotations

import pytest

from unlearn.infra.between_stages import (
    TRANSIT_HEAD,
    head_partition,
    keys_family,
    read_partition_keys,
    transit_private_family,
)
from unlearn.infra.settings import Settings, consumer_config, producer_config
from unlearn.infra.topic_reader import read_topic
from unlearn.schemas.envelope import Request, TextInput
from unlearn.schemas.sealed import decode_public_record, seal_request
from unlearn.services.client.sdk import TransitKeyCache
from unlearn.streams.featurizer.core import UnopenedRequest, open_sealed
from unlearn.streams.featurizer.key_store import KeyStore
from unlearn.streams.featurizer.transit_keys import TransitKeys, router_committed

pytestmark = pytest.mark.broker


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _produce(s: Settings, topic: str, partition: int, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer(producer_config(s))
    for i in range(n):
        p.produce(topic, value=b"x%d" % i, partition=partition)
    assert p.flush(30) == 0


def test_a_lagging_router_keeps_a_superseded_transit_key_until_everything_is_routed_and_judged(
        settings: Settings) -> None:
    from confluent_kafka import Consumer, TopicPartition

    s = settings.with_(transit_rotate_seconds=10.0, transit_grace_seconds=5.0, shred_every_seconds=0.0)
    requests, by_head = s.topic("requests"), s.topic("requests.by-head")
    n_req = s.partitions
    fam = transit_private_family(s.topic_prefix)
    samples = KeyStore(s)
    keys = KeyStore(s, fam, samples)
    clock = Clock(1_000_000.0)
    transit = TransitKeys(s, keys, requests, by_head, clock=clock)
    group = Consumer(consumer_config(s, f"{s.topic_prefix}featurizer",
                                     **{"enable.auto.commit": False, "enable.partition.eof": True}))
    try:
        samples.load(0)
        transit.load(0)
        (first,) = transit.epochs[0].values()
        # the private half is durable in the transit-private family, the public half published
        stored = read_partition_keys(s, fam, [fam.topic(0, 0)], 0)
        assert stored is not None and first.ref in stored.keys and first.ref[0] == TRANSIT_HEAD
        pubs = [decode_public_record(r.value or b"") for r in read_topic(s, s.topic("transit-keys"), timeout=30)]
        assert [(p.partition, p.key_id) for p in pubs] == [(0, first.pair.key_id)]
        head = next(h for h in (f"h{i}" for i in range(100)) if head_partition(h, s.partitions) == 0)
        sealed = seal_request(Request("ev", "add", head, "c", "alice", "x1", 1, TextInput("secret"), 1.0), first.public)
        cache = TransitKeyCache(s)
        cache.keys[0] = first.public  # what a producer read before the clock moved on
        _produce(s, requests, 1, 3)  # records that could carry the key, not yet routed
        _produce(s, by_head, 0, 2)

        def tick(positions: dict[int, int]) -> dict[int, list[tuple[str, str, str]]]:
            return transit.tick(lambda: group, lambda: router_committed(group, requests, n_req, 30), positions)

        clock.t = first.use_until - 1.0  # the successor is published ahead of use_until
        assert tick({0: 0}) == {} and len(transit.epochs[0]) == 2
        clock.t = first.use_until + 4.0  # within the grace: kept
        assert tick({0: 0}) == {}
        for _ in range(3):  # grace over, but the router has committed nothing: kept
            clock.t += 1.0
            assert tick({0: 99}) == {}
        group.commit(offsets=[TopicPartition(requests, 1, 3)], asynchronous=False)  # the router caught up
        clock.t += 1.0
        assert tick({0: 1}) == {}  # ... but this featurizer has judged only 1 of the 2 by-head records
        clock.t += 1.0
        due = tick({0: 2})
        assert due == {0: [first.ref]}
        assert transit.lookup(0, first.pair.key_id) is not None  # nothing destroyed until the rotation
        assert transit.destroy(0, due[0]) == 1
        assert transit.lookup(0, first.pair.key_id) is None
        # a request sealed under the destroyed key gets the documented dead-letter reason
        (refused,) = open_sealed([sealed], transit.gate(0))
        assert isinstance(refused, UnopenedRequest) and refused.reason == "transit_key_destroyed"
        assert refused.request.event_id == "ev"
        # the new generation no longer holds it; the successor is kept
        topics = [fam.topic(0, g) for g in range(keys.next_gen[0])]
        stored = read_partition_keys(s, fam, topics, 0)
        assert stored is not None and first.ref not in stored.keys
        assert [r for r in stored.keys if r[0] == TRANSIT_HEAD] == [e.ref for e in transit.epochs[0].values()]
        # the sample key family was never rotated: it holds no transit key, still generation 0
        assert samples.next_gen[0] == 1 and samples.live(0) == []
        assert keys_family(s.topic_prefix).generations(list(samples.admin.list_topics(timeout=30).topics), 0) == [0]
        # a featurizer taking the partition over finds only the successor
        again = TransitKeys(s, KeyStore(s, fam), requests, by_head, clock=clock)
        again.load(0)
        assert set(again.epochs[0]) == set(transit.epochs[0])
        again.keys.close()
    finally:
        group.close()
        keys.retire_due(force=True)
        samples.close()
