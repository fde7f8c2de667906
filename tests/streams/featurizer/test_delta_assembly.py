"""Assembling deltas (streams/featurizer/delta_assembly.py): when a head's delta carries packed
ledgers instead of rows."""

from __future__ import annotations

from tests.streams.featurizer.test_featurize import K, cfg
from unlearn.streams.featurizer.cache_view import HeadInfo
from unlearn.streams.featurizer.delta_assembly import use_packed


def test_packed_choice() -> None:
    head = HeadInfo("h", "features", "features", 4, "class", 0, K, 0)
    assert not use_packed(head, 10, cfg())
    assert use_packed(head, 11, cfg(max_message_bytes=800))  # 11 * 5 * 8 = 440 > 400
    assert use_packed(head, 1, cfg(federated=True, client_id="c1"))
