"""What the verifier reads: the live head by ``HeadUpdate.supersedes``, tombstones, key filtering."""

from __future__ import annotations

import time
from typing import Literal

import numpy as np

from tests.services.verifier.support import StreamBuilder
from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.delta_codec import Delta, encode_delta
from unlearn.schemas.head import HeadUpdate, encode_head
from unlearn.services.verifier.reading import delta_head, key_filter, live_updates, read_head_updates


def update(version: int, mode: Literal["exact", "fast"], head: str = "h") -> HeadUpdate:
    return HeadUpdate(head, version, mode, "0" * 64, 1, 1, ((0, version),), 0.0, 0.5, time.time(),
                      np.zeros((2, 2)), np.eye(2) if mode == "exact" else None)


def test_the_live_head_is_the_newest_update_and_exact_wins_a_tie() -> None:
    f3, e3, e2, f4 = update(3, "fast"), update(3, "exact"), update(2, "exact"), update(4, "fast")
    assert live_updates([e2, f3, e3]) == (e3, e3)
    assert live_updates([e2, e3, f3]) == (e3, e3)  # the fast republish of the same version does not win
    assert live_updates([e2, f3, e3, f4]) == (f4, e3)
    assert live_updates([f3]) == (f3, None)
    assert live_updates([]) == (None, None)


def test_head_updates_of_one_head_and_undecodable_ones_counted() -> None:
    recs = [LogRecord(0, 0, 0, b"h", encode_head(update(1, "exact"))),
            LogRecord(0, 1, 0, b"h", None),  # a tombstone
            LogRecord(0, 2, 0, b"h", b"junk"),
            LogRecord(0, 3, 0, b"g", encode_head(update(1, "exact", head="g")))]
    ups, bad = read_head_updates(recs, "h")
    assert [u.version for u in ups] == [1] and bad == 2


def test_key_filter_and_delta_head() -> None:
    keep = key_filter("h")
    assert keep(b"h") and keep(None) and keep(b"") and not keep(b"g")
    b = StreamBuilder(head="g", seed=1)
    raw = encode_delta(Delta("g", "requests/0@1", 8, 30, 0, (b.add(),)))
    assert delta_head(LogRecord(0, 0, 0, None, raw)) == "g"
    assert delta_head(LogRecord(0, 0, 0, b"k", raw)) == "k"  # the key decides, as in the ledger
    assert delta_head(LogRecord(0, 0, 0, None, None)) is None
    assert delta_head(LogRecord(0, 0, 0, None, b"junk")) is None
