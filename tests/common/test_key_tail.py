"""KeyTail (issue 29): the live ledger's follower of the key family. Its generation rules without a
broker (a rotation half copied hides no key; a completed one drops what it did not copy), then on
a real broker: keys written after it started are found without reading the family, a destroyed
key disappears, and a RowOpener with a tail opens new keys without a ring read."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

import numpy as np

from unlearn.common.by_head import head_partition
from unlearn.common.families import keys_family
from unlearn.common.key_ring import COMPLETE_KEY, key_record_key
from unlearn.common.key_tail import KeyTail
from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.delta_codec import Delta, RowsEntry
from unlearn.schemas.sealed import SampleKey, encode_key_record, seal_delta
from unlearn.streams.featurizer.key_store import KeyStore
from unlearn.streams.ledger.row_opener import RowOpener


def _key() -> SampleKey:
    return SampleKey(os.urandom(16).hex(), os.urandom(32))


class _Feed:
    """Hands records to a tail that was never started (the follower's callback, called directly)."""

    def __init__(self, tail: KeyTail) -> None:
        self.tail = tail
        self.offsets: dict[str, int] = {}

    def put(self, p: int, g: int, key: bytes, value: bytes | None) -> None:
        topic = self.tail.family.topic(p, g)
        off = self.offsets.get(topic, 0)
        self.offsets[topic] = off + 1
        self.tail._on_record(LogRecord(0, off, 0, key, value, topic))


def test_generations_replace_each_other_only_once_complete() -> None:
    tail = KeyTail(Settings.from_env(bootstrap="unused:9092", topic_prefix="t."))
    feed = _Feed(tail)
    kept, dropped, later = _key(), _key(), _key()
    a, b, c = ("h", "s1", kept.key_id), ("h", "s2", dropped.key_id), ("h", "s3", later.key_id)
    feed.put(0, 0, key_record_key(*a), encode_key_record(kept))
    feed.put(0, 0, key_record_key(*b), encode_key_record(dropped))
    assert tail.get(a) == kept and tail.get(b) == dropped  # generation 0: complete from its creation

    feed.put(0, 1, key_record_key(*a), encode_key_record(kept))  # a rotation copying the live keys...
    assert tail.get(b) == dropped  # ...half way: the complete generation still answers
    feed.put(0, 1, COMPLETE_KEY, b"1")
    assert tail.get(a) == kept and tail.get(b) is None  # not copied: gone from memory with generation 0
    feed.put(0, 0, key_record_key(*c), encode_key_record(later))  # a late record of the superseded one
    assert tail.get(c) is None
    feed.put(0, 1, key_record_key(*a), None)  # a tombstone destroys
    assert tail.get(a) is None


def _delta(head: str, samples: list[str]) -> Delta:
    n = len(samples)
    entry = RowsEntry(+1, tuple(f"e-{s}" for s in samples), tuple(samples), ("subj",) * n,
                      np.zeros(n, dtype=np.int64), np.arange(n * 2, dtype=np.int64).reshape(n, 2))
    return Delta(head, "requests.by-head/0@1", 2, 8, 8, (entry,))


def _until(pred: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


HEAD = "h0"


@contextlib.contextmanager
def _store_and_tail(settings: Settings) -> Iterator[tuple[KeyStore, KeyTail, int]]:
    """A key store owning every partition, a started follower, and the head's key partition."""
    store = KeyStore(settings)
    tail = KeyTail(settings)
    try:
        for part in range(settings.partitions):
            store.load(part)
        tail.start(wait_assigned=60)
        yield store, tail, head_partition(HEAD, settings.partitions)
    finally:
        tail.stop()
        store.close()


def _destroyed(store: KeyStore, tail: KeyTail, p: int, sample: str, key: SampleKey) -> None:
    """Destroy a key the follower holds, and wait until it holds it no more."""
    ref = (HEAD, sample, key.key_id)
    assert tail.get(ref, wait=30.0) == key  # followed, so "gone" below means destroyed
    assert store.destroy(p, [ref]) == 1
    assert _until(lambda: tail.get(ref) is None)


def test_keys_written_after_the_start_are_followed_and_destroyed_ones_leave(settings: Settings) -> None:
    with _store_and_tail(settings) as (store, tail, p):
        key = store.create(p, HEAD, "s1")
        store.flush()
        assert tail.get((HEAD, "s1", key.key_id), wait=30.0) == key
        assert tail.family == keys_family(settings.topic_prefix)
        _destroyed(store, tail, p, "s1", key)


def test_an_opener_with_a_tail_opens_new_keys_without_reading_the_family(settings: Settings) -> None:
    with _store_and_tail(settings) as (store, tail, p):
        opener = RowOpener(settings, tail=tail)
        keys = {s: store.create(p, HEAD, s) for s in ("s1", "s2")}
        store.flush()
        # the follower has them (on a loaded box it may take longer than the opener's 0.1 s wait,
        # after which the opener reads the family instead: correct, and not what this test checks)
        assert all(tail.get((HEAD, s, k.key_id), wait=30.0) == k for s, k in keys.items())
        opened = opener.open(seal_delta(_delta(HEAD, ["s1", "s2"]), lambda h, s: keys[s]))
        assert not opened.erased and opened.delta.entries[0].sample_ids == ("s1", "s2")
        assert opener.ring is None or not opener.ring.reads  # the follower had them: no read of the family

        gone = store.create(p, HEAD, "gone")
        store.flush()
        _destroyed(store, tail, p, "gone", gone)
        opened = opener.open(seal_delta(_delta(HEAD, ["gone"]), lambda h, s: gone))
        assert [e.sample_id for e in opened.erased] == ["gone"]  # declared destroyed by the exact read
        assert opener.ring is not None and set(opener.ring.reads) == set(range(settings.partitions))
