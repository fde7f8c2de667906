"""Tests that read the featurizer's ``deltas`` from the broker open its sealed rows here, with the
keys of the test's ``subject-keys`` family (docs/erasure.md), as the ledger worker does."""

from __future__ import annotations

from unlearn.infra.settings import Settings
from unlearn.schemas.delta_codec import Delta, decode_delta
from unlearn.schemas.sealed import is_sealed
from unlearn.streams.ledger.row_opener import RowOpener

_SETTINGS: dict[str, Settings] = {}
_OPENERS: dict[str, RowOpener] = {}


def register(settings: Settings) -> None:
    """Called by the ``settings`` fixture: the prefix's broker, for :func:`plain_delta`."""
    _SETTINGS[settings.topic_prefix] = settings


def opener_for(topic: str) -> RowOpener:
    prefix = next(p for p in sorted(_SETTINGS, key=len, reverse=True) if topic.startswith(p))
    if prefix not in _OPENERS:
        _OPENERS[prefix] = RowOpener(_SETTINGS[prefix])
    return _OPENERS[prefix]


def plain_delta(raw: bytes, topic: str) -> Delta:
    """The delta of a ``deltas`` message of ``topic`` with its sealed rows opened."""
    d = decode_delta(raw)
    if not is_sealed(d):
        return d
    opened = opener_for(topic).open(d)
    assert not opened.erased, f"rows under destroyed keys: {opened.erased[:3]}"
    return opened.delta
