"""The fold rules both versioned registries share (common/registry.py), through each
registry's public fold, without a broker: highest version wins (the later record on a tie),
tombstones are ignored, invalid records and records under another key are skipped with a
warning in the registry's own words."""

from __future__ import annotations

import base64
import logging
from typing import Any

import orjson
import pytest

from unlearn.common.registry import fold_clients, fold_contracts
from unlearn.runtime.topic_reader import LogRecord

CLIENT = {"schema": "unlearn.client/v1", "client_id": "c1", "version": 1,
          "keys": [{"key_id": "k", "public_key": base64.b64encode(b"x" * 32).decode(), "revoked": False}],
          "heads": ["h"], "may_delete_others": False, "rate_per_second": 1, "burst": 2, "revoked": False}
HEAD = {"schema": "unlearn.head-contract/v1", "head_id": "faces", "version": 1, "dimension": 4,
        "backbone": "features", "input_kind": "features", "normalization": "l2", "feature_bound": 1.0,
        "frac_bits": 20, "label_frac_bits": 0, "label_kind": "class", "gamma": 1.0, "origin": "declared",
        "n_classes": 5}

# (fold, a valid document, its id field, logger, topic, what an invalid record is called)
REGISTRIES = {
    "clients": (fold_clients, CLIENT, "client_id", "unlearn.clients", "client-registry", "record"),
    "heads": (fold_contracts, HEAD, "head_id", "unlearn.registry", "head-registry", "contract"),
}


def _log(*entries: tuple[str | None, dict[str, Any] | bytes | None]) -> list[LogRecord]:
    return [LogRecord(0, i, 0, None if key is None else key.encode(),
                      value if value is None or isinstance(value, bytes) else orjson.dumps(value))
            for i, (key, value) in enumerate(entries)]


@pytest.mark.parametrize("name", sorted(REGISTRIES))
def test_highest_version_wins_later_on_a_tie(name: str) -> None:
    fold, doc, idf, *_ = REGISTRIES[name]
    key = doc[idf]
    v3, v2 = dict(doc, version=3), dict(doc, version=2)
    v3_again = dict(v3, gamma=2.0) if name == "heads" else dict(v3, burst=9)
    latest = fold(_log((key, v3), (key, v2), (key, None), (key, v3_again)))
    assert list(latest) == [key]
    assert latest[key].to_dict() == v3_again


@pytest.mark.parametrize("name", sorted(REGISTRIES))
def test_bad_records_are_skipped_with_a_warning(name: str, caplog: pytest.LogCaptureFixture) -> None:
    fold, doc, idf, logger, topic, noun = REGISTRIES[name]
    key = doc[idf]
    with caplog.at_level(logging.WARNING, logger=logger):
        latest = fold(_log((key, b"junk"), ("other", doc), (key, dict(doc, version=0)), (key, doc)))
    assert latest[key].version == 1 and list(latest) == [key]
    got = [(r.name, r.getMessage()) for r in caplog.records]
    assert got[0][0] == logger and got[0][1].startswith(f"{topic} 0@0: skipped, invalid {noun}: not JSON: ")
    assert got[1:] == [(logger, f"{topic} 0@1: skipped, key 'other' is not {idf} {key!r}"),
                       (logger, f"{topic} 0@2: skipped, invalid {noun}: version must be >= 1, got 0")]
