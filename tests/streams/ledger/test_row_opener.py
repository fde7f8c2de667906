"""RowOpener on a real broker (issue 12): a deltas message whose keys are new to the opener makes
it read only its head's key partition; a key destroyed there is still reported erased, after the
whole family was read."""

from __future__ import annotations

import numpy as np

from unlearn.common.by_head import head_partition
from unlearn.infra.settings import Settings
from unlearn.schemas.delta_codec import Delta, RowsEntry
from unlearn.schemas.sealed import seal_delta
from unlearn.streams.featurizer.key_store import KeyStore
from unlearn.streams.ledger.row_opener import RowOpener


def _delta(head: str, samples: list[str]) -> Delta:
    n = len(samples)
    entry = RowsEntry(+1, tuple(f"e-{s}" for s in samples), tuple(samples), ("subj",) * n,
                      np.zeros(n, dtype=np.int64), np.arange(n * 2, dtype=np.int64).reshape(n, 2))
    return Delta(head, "requests.by-head/0@1", 2, 8, 8, (entry,))


def _heads_in_distinct_partitions(count: int) -> tuple[str, str]:
    heads = [f"h{i}" for i in range(64)]
    a = heads[0]
    b = next(h for h in heads if head_partition(h, count) != head_partition(a, count))
    return a, b


def test_new_keys_read_only_their_heads_partition_and_a_destroyed_key_is_still_erased(settings: Settings) -> None:
    count = settings.partitions  # create_topics made the by-head topic with this many partitions
    assert count >= 2
    head, other = _heads_in_distinct_partitions(count)
    p, q = head_partition(head, count), head_partition(other, count)
    store = KeyStore(settings)
    try:
        for part in range(count):
            store.load(part)
        opener = RowOpener(settings)
        opener.lookup(other, "warm", "k")  # the ring's first read: P then, not found, every partition
        assert opener.ring is not None
        before = opener.ring.reads.copy()

        keys = {s: store.create(p, head, s) for s in ("s1", "s2")}
        store.create(q, other, "elsewhere")
        store.flush()
        sealed = seal_delta(_delta(head, ["s1", "s2"]), lambda h, s: keys[s])
        opened = opener.open(sealed)
        assert not opened.erased and opened.delta.entries[0].sample_ids == ("s1", "s2")
        assert opener.ring.reads - before == {p: 1}  # one read, of P only, for two new keys

        keys["gone"] = store.create(p, head, "gone")  # not read by the opener before its destruction
        store.flush()
        assert store.destroy(p, [(head, "gone", keys["gone"].key_id)]) == 1
        before = opener.ring.reads.copy()
        opened = opener.open(seal_delta(_delta(head, ["gone"]), lambda h, s: keys[s]))
        assert [e.sample_id for e in opened.erased] == ["gone"] and opener.erased == 1
        read = opener.ring.reads - before
        assert read[p] == 2 and set(read) == set(range(count))  # P, then every partition once
    finally:
        store.close()


def test_without_a_by_head_topic_the_whole_family_is_read(settings: Settings) -> None:
    count = settings.partitions
    head = "h0"
    p = head_partition(head, count)
    store = KeyStore(settings)
    try:
        for part in range(count):
            store.load(part)
        key = store.create(p, head, "s1")
        store.flush()
        opener = RowOpener(settings)
        opener.by_head = settings.topic("no-such-topic")  # the mapping cannot be established
        opened = opener.open(seal_delta(_delta(head, ["s1"]), lambda h, s: key))
        assert not opened.erased
        assert opener.ring is not None and opener.ring.reads == {part: 1 for part in range(count)}
    finally:
        store.close()
