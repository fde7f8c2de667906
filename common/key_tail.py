"""Following the key family as it is written (:class:`KeyTail`): where a live ledger looks first
for a key it has not read yet (docs/erasure.md, "Reading keys").

Why: nearly every deltas message a live ledger meets under a flow of adds holds keys it has not
read (each add has a key of its own), and reading the family on demand costs a fresh consumer, a
metadata listing and a read to the end: about 100 ms on Apache Kafka here, on the path of every
delete waiting behind those adds (bench/results/pipeline_bench.md section 19). A follower of the
newest generation of each partition holds the keys within a fetch of their acknowledgement, which
came before their ciphertext was produced. A key found here is one the featurizer wrote and had
not destroyed when it was read; one not found is looked for by the exact read as before
(``streams.ledger.row_opener``): only a read to the end may declare a key destroyed.

A generation replaces the one before it only once complete (as ``KeyRing`` reads): until then
both are searched, so a rotation half copied hides no key, and a key the rotation dropped (on a
broker without compaction that is how keys are destroyed) leaves this process's memory with the
generation that held it.
"""

from __future__ import annotations

import threading
import time

from unlearn.common.families import keys_family
from unlearn.common.key_ring import KeyGeneration, SampleRef, fold_keys
from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import LogRecord, TopicFollower
from unlearn.schemas.sealed import SampleKey

__all__ = [
    "KeyTail",
]


class KeyTail:
    """The keys of the key family's newest complete generations, followed by a daemon thread
    (``runtime.topic_reader.TopicFollower``) from :meth:`start` to :meth:`stop`."""

    def __init__(self, settings: Settings, poll_interval: float = 0.005) -> None:
        self.family = keys_family(settings.topic_prefix)
        self._live: dict[int, KeyGeneration] = {}  # partition -> newest complete generation
        self._next: dict[int, KeyGeneration] = {}  # partition -> a newer one being filled
        self._cond = threading.Condition()
        # group id "<prefix>ledger-keytail-<uuid>" (never joined): under the ledger's ACL grant
        self.follower = TopicFollower(settings, self.family, self._on_record, role="ledger-keytail",
                                      poll_interval=poll_interval)

    def start(self, wait_assigned: float | None = None) -> KeyTail:
        self.follower.start(wait_assigned)
        return self

    def stop(self) -> None:
        self.follower.stop()

    @property
    def running(self) -> bool:
        return self.follower.running

    def _on_record(self, r: LogRecord) -> None:
        where = self.family.parse(r.topic)
        if where is None:
            return
        p, g = where
        with self._cond:
            live = self._live.get(p)
            if live is not None and g == live.generation:
                fold_keys(live, [(r.offset, r.key, r.value)])
            elif live is None or g > live.generation:
                nxt = self._next.get(p)
                if nxt is None or nxt.generation < g:
                    nxt = self._next[p] = KeyGeneration(p, g, r.topic)
                elif nxt.generation > g:
                    return  # an older generation than the one being filled: superseded
                fold_keys(nxt, [(r.offset, r.key, r.value)])
                if nxt.complete or g == 0:  # generation 0 is complete from its creation
                    self._live[p] = self._next.pop(p)
            self._cond.notify_all()

    def get(self, ref: SampleRef, wait: float = 0.0) -> SampleKey | None:
        """The key of ``ref``, waiting up to ``wait`` seconds for the follower to read it; None:
        not (yet) followed, which proves nothing."""
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                for gens in (self._live, self._next):
                    for gen in gens.values():
                        key = gen.keys.get(ref)
                        if key is not None:
                            return key
                left = deadline - time.monotonic()
                if left <= 0 or not self.running:
                    return None
                self._cond.wait(left)
