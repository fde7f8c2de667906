"""``UNLEARN_TRANSIT_SEAL=auto`` never sends an add in plaintext for want of a transit key
(docs/client.md "Transit sealing"): it waits, bounded by ``UNLEARN_TRANSIT_WAIT_SECONDS``, for the
featurizer's key, seals under it once published, and raises instead of producing when none comes.
Real broker: the key is published on ``transit-keys`` as a featurizer would."""

from __future__ import annotations

import threading
import time

import pytest

from unlearn.infra.between_stages import head_partition
from unlearn.infra.settings import Settings, producer_config
from unlearn.infra.topic_reader import read_topic
from unlearn.schemas.envelope import FeaturesInput, SealedInput, parse_request
from unlearn.schemas.sealed import TransitPublicKey, encode_public_record, new_transit_key, open_request
from unlearn.services.client.sdk import ClientError, UnlearnClient


def publish_later(s: Settings, head: str, delay: float) -> tuple[threading.Thread, object]:
    """Publish a transit key for ``head``'s by-head partition after ``delay`` seconds."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from unlearn.infra.settings import admin_config

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
