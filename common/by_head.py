"""The by-head topic and a head's partition in it. The featurizer's router forwards every request
to ``<requests>.by-head`` at :func:`head_partition` of its head id; the featurizer that owns that
partition keeps the head's sample and transit keys, so the ledger (opening sealed rows) and the
SDK (sealing inputs) find a head's keys by the same function."""

from __future__ import annotations

import hashlib

ROUTED_SUFFIX = ".by-head"
"""The by-head topic of a requests topic is its name plus this suffix."""


def routed_topic_name(requests_topic: str) -> str:
    """The by-head topic a requests topic is routed into (``unlearn.requests`` ->
    ``unlearn.requests.by-head``)."""
    return requests_topic + ROUTED_SUFFIX


def head_partition(head_id: str, partitions: int) -> int:
    """The by-head partition of a head: the first 8 bytes of SHA-256(UTF-8 head id) as a
    big-endian unsigned integer, modulo the partition count. Part of the contract (any language
    can compute it), and independent of every client library's partitioner."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    digest = hashlib.sha256(head_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % partitions
