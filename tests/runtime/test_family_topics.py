"""runtime.family_topics against the session's real broker: generations created with
their config and listed; retired ones kept through the grace and deleted once due (trimmed in
place instead where the broker has DeleteRecords); a new holder finds every family again; and
the holder's admin client is shared and renewed before every retry. What the broker holds is
read with a client of the test's own, not through the holder."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from tests.topic_support import broker_topics, topic_configs
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import consumer_config, producer_config, quirks
from unlearn.runtime.family_topics import FamilyTopics
from unlearn.runtime.topic_family import TopicFamily
from unlearn.runtime.topics import trimmed_changelog_config

HOUR = 3600.0


def _produce(s: Settings, topic: str, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer(producer_config(s, **{"batch.num.messages": 1, "linger.ms": 0}))
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"v", partition=0)
        p.flush(30)  # one record per batch: ListOffsets(latest) is exact on every broker then
    assert p.flush(30) == 0


def _low(s: Settings, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(consumer_config(s, f"{s.topic_prefix}low"))  # never joined
    try:
        low, _high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        return int(low)
    finally:
        c.close()


def test_generations_are_created_with_their_config_listed_retired_and_found_again(settings: Settings) -> None:
    s = settings
    fam, other = TopicFamily(s.topic_prefix, "fam"), TopicFamily(s.topic_prefix, "other")
    extra = {"delete.retention.ms": "12345"}
    holder = FamilyTopics(s, grace_s=HOUR, config=extra)
    for p, g in [(0, 0), (0, 1), (1, 0)]:
        holder.ensure(fam.topic(p, g))
    holder.ensure(other.topic(0, 3))
    holder.ensure(fam.topic(0, 1))  # again: no error, nothing new
    assert fam.generations(broker_topics(s), 0) == [0, 1] and fam.generations(broker_topics(s), 1) == [0]
    assert holder.generations(fam, 0) == [0, 1] and holder.generations(other, 0) == [3]
    if quirks(s).compaction_runs:  # a broker that reports topic configs as Kafka does
        conf = topic_configs(s, fam.topic(0, 0))
        assert conf["cleanup.policy"] == "compact" and conf["delete.retention.ms"] == "12345"

    # retired: kept through the grace, deleted once forced due; a second retire_due has nothing
    holder.retire([fam.topic(0, 0)])
    holder.retire([])  # nothing to retire: no entry
    assert holder.retire_due() == [] and fam.generations(broker_topics(s), 0) == [0, 1]
    assert holder.retire_due(force=True) == [fam.topic(0, 0)]
    assert fam.generations(broker_topics(s), 0) == [1] and holder.retire_due(force=True) == []

    # a grace of zero is due at once, without force
    quick = FamilyTopics(s, grace_s=0.0)
    quick.retire([fam.topic(1, 0)])
    assert quick.retire_due() == [fam.topic(1, 0)] and fam.generations(broker_topics(s), 1) == []

    # a restarted holder (a new process) finds what the broker holds, and creating it again is no error
    again = FamilyTopics(s, grace_s=HOUR, config=extra)
    assert again.generations(fam, 0) == [1] and again.generations(other, 0) == [3]
    again.ensure(fam.topic(0, 1))
    assert again.delete([other.topic(0, 3), other.topic(0, 4)])  # a missing topic is fine
    assert again.generations(other, 0) == []

    # the first holder still believes other.p0.g3 exists; its next listing tells it otherwise,
    # so ensuring it creates it again instead of writing to a topic that is gone
    assert other.topic(0, 3) in holder.created
    holder.listed()
    holder.ensure(other.topic(0, 3))
    assert other.generations(broker_topics(s), 0) == [3]


def test_a_generation_is_trimmed_in_place_where_the_broker_has_delete_records(settings: Settings) -> None:
    s = settings
    fam = TopicFamily(s.topic_prefix, "fam")
    topic = fam.topic(0, 0)
    holder = FamilyTopics(s, grace_s=HOUR, config=trimmed_changelog_config(s))
    holder.ensure(topic)
    _produce(s, topic, 5)
    assert holder.end_offset(topic) == 5
    if not quirks(s).delete_records:  # tansu: no DeleteRecords; its writers rotate and delete instead
        holder.retire([topic])
        assert holder.retire_due(force=True) == [topic] and topic not in broker_topics(s)
        return
    compact_only = FamilyTopics(s, grace_s=HOUR)  # Kafka refuses DeleteRecords there: False, logged
    compact_only.ensure(fam.topic(1, 0))
    _produce(s, fam.topic(1, 0), 2)
    assert not compact_only.trim(fam.topic(1, 0), 1) and _low(s, fam.topic(1, 0)) == 0
    assert holder.trim(topic, 3)
    assert _low(s, topic) == 3 and holder.end_offset(topic) == 5  # the newer records stay
    assert holder.trim(topic, 3)  # again: idempotent


def test_the_admin_client_is_shared_and_renewed_before_each_retry() -> None:
    """No broker needed: a client is made, never connected (a transient error is raised by the test)."""
    s = Settings.from_env(bootstrap="127.0.0.1:9", broker_retry_seconds=30.0)
    first = FamilyTopics(s, grace_s=HOUR)
    second = FamilyTopics(s, grace_s=HOUR, share=first)
    assert second.admin() is first.admin()
    seen: list[Any] = []

    def flaky() -> int:
        seen.append(second.admin())
        if len(seen) < 3:
            raise KafkaException(KafkaError(KafkaError.FENCED_LEADER_EPOCH, "from the test"))
        return len(seen)

    assert second.call("a flaky step", flaky) == 3
    assert len({id(a) for a in seen}) == 3  # a new client for every try
    assert first.admin() is second.admin() is seen[-1]  # still one client for both
