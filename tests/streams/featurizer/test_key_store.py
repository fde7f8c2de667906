"""Destroying keys where the broker compacts (``BrokerQuirks.compaction_runs``: Apache Kafka): a
tombstone, no rotation, and the destroyed key's record leaves the log once its segment rolls and
the cleaner runs (docs/erasure.md section 4); where it does not (tansu), the partition rotates into
a new generation as before. Real broker, no mocks."""

from __future__ import annotations

import time
from typing import Any

from tests.topic_support import broker_topics, topic_configs
from unlearn.common.families import keys_family
from unlearn.common.key_ring import key_record_key, read_partition_keys
from unlearn.infra.polling import poll_until
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import quirks
from unlearn.runtime.topic_reader import read_topic
from unlearn.streams.featurizer.key_store import KeyStore

DEADLINE_S = 90.0  # segment.ms (2 s here) + the roll + the broker's cleaner backoff (15 s) + cleaning, with margin


def test_a_destroyed_key_leaves_the_log_by_compaction_or_rotation(settings: Settings) -> None:
    s = settings.with_(segment_ms=2000)
    fam = keys_family(s.topic_prefix)
    ks = KeyStore(s)
    try:
        ks.load(0)
        keys = [ks.create(0, "h", f"x{i}") for i in range(3)]
        assert ks.flush() == 3
        first = ks.gens[0].topic
        doomed = ("h", "x1", keys[1].key_id)
        t0 = time.monotonic()
        assert ks.destroy(0, [doomed]) == 1
        gen = read_partition_keys(s, fam, broker_topics(s), 0)
        assert gen is not None and doomed not in gen.keys and len(gen.keys) == 2  # gone for every reader at once
        if not quirks(s).compaction_runs:  # tansu: rotated into a generation without it
            assert fam.generations(broker_topics(s), 0) == [0, 1] and ks.gens[0].generation == 1
            assert ks.retire_due(force=True) == [first]
            return
        assert fam.generations(broker_topics(s), 0) == [0] and ks.gens[0].topic == first  # no rotation
        assert topic_configs(s, first)["delete.retention.ms"] == "10000"  # 5 x segment.ms: tombstones go too
        doomed_key = key_record_key(*doomed)

        def compacted(_remaining: float) -> list[Any] | None:
            """The log once the record physically left it (the roll record, then the cleaner)."""
            ks.retire_due()
            recs = read_topic(s, first, timeout=30)
            return None if any(r.key == doomed_key and r.value is not None for r in recs) else recs

        recs = poll_until(compacted, DEADLINE_S, interval=1.0, timed_out=lambda: TimeoutError(
            f"destroyed key still in {first} after the documented {DEADLINE_S}s"))
        took = time.monotonic() - t0
        live = {r.key for r in recs if r.value is not None}
        assert {key_record_key("h", f"x{i}", keys[i].key_id) for i in (0, 2)} <= live  # the others stay
        print(f"destroyed key compacted away after {took:.1f}s")
        assert not ks.rolls  # no roll left pending once its tombstones were rolled
    finally:
        ks.close()
