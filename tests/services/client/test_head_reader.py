"""`unlearn head`, ``read_heads`` and ``HeadFollower`` against a real broker: the newest update per
head wins by ``HeadUpdate.supersedes`` (version, then exact over fast), whatever the topic order."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from confluent_kafka import Producer

from unlearn.common.families import heads_family
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import producer_config
from unlearn.runtime.topics import ensure_topic
from unlearn.schemas.head import HeadUpdate, encode_head


def update(head: str, version: int, mode: str, n: int = 3) -> HeadUpdate:
    digest = f"{version:02x}{'e' if mode == 'exact' else 'f'}".ljust(64, "0")
    return HeadUpdate(head, version, mode, digest, n, 10 * version, ((0, version),), 0.0, 1.0,  # type: ignore[arg-type]
                      1700000000.0, np.full((2, 3), float(version)))


def heads_topic(settings: Settings) -> str:
    """A topic of the heads family, as the ledger of deltas partition 0 writes."""
    topic = heads_family(settings.topic_prefix).topic(0, 0)
    ensure_topic(settings, topic)
    return topic


def publish(settings: Settings, *updates: HeadUpdate) -> None:
    p = Producer(producer_config(settings))
    for u in updates:
        p.produce(heads_topic(settings), key=u.head_id.encode(), value=encode_head(u))
    assert p.flush(10) == 0


def test_read_heads_keeps_the_newest_update_per_head(settings: Settings) -> None:
    from unlearn.services.client.head_reader import read_heads

    assert read_heads(settings) == {}
    # out of order on purpose: a reader must not trust the topic order
    publish(settings, update("a", 2, "fast"), update("a", 1, "exact"), update("a", 2, "exact"),
            update("a", 2, "fast"), update("b", 1, "fast"))
    p = Producer(producer_config(settings))
    p.produce(heads_topic(settings), key=b"a", value=b"not a head")  # skipped, not fatal
    p.produce(heads_topic(settings), key=b"a", value=None)  # a tombstone: skipped
    assert p.flush(10) == 0
    latest = read_heads(settings)
    assert sorted(latest) == ["a", "b"]
    assert (latest["a"].version, latest["a"].mode) == (2, "exact")
    assert read_heads(settings, ["b"]) == {"b": latest["b"]}
    assert read_heads(settings, ["nobody"]) == {}


def test_read_heads_on_a_missing_topic_is_a_topic_read_error(settings: Settings) -> None:
    from unlearn.runtime.topic_reader import TopicReadError
    from unlearn.services.client.head_reader import read_heads

    with pytest.raises(TopicReadError, match="does not exist"):
        read_heads(settings.with_(topic_prefix=settings.topic_prefix + "none."), timeout=5)


def test_head_follower_sees_updates_as_they_come(settings: Settings) -> None:
    from unlearn.services.client.head_reader import HeadFollower

    publish(settings, update("h", 1, "fast"))
    with HeadFollower(settings, ["h"]) as heads:
        assert heads.wait("h", lambda u: u.version == 1, timeout=20).mode == "fast"
        later = threading.Timer(0.3, publish, (settings, update("h", 2, "fast"), update("h", 2, "exact"),
                                               update("other", 9, "exact")))
        later.start()
        got = heads.wait("h", lambda u: u.mode == "exact", timeout=20)
        later.join()
        assert got.version == 2
        assert heads.get("other") is None  # not followed
        with pytest.raises(TimeoutError, match=r"'h' did not reach .* version 2 \(exact"):
            heads.wait("h", lambda u: u.version == 3, timeout=0.5)


def test_unlearn_head_prints_the_latest_head(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    from unlearn.services.client.head_reader import head_main

    publish(settings, update("cli", 1, "fast"), update("cli", 1, "exact", n=7))
    common = ["--bootstrap", settings.bootstrap, "--prefix", settings.topic_prefix, "--profile", settings.profile]
    assert head_main([*common, "--head", "cli"]) == 0
    out = capsys.readouterr().out
    assert "head cli  version 1  mode exact  n_retained 7" in out and "weights 2 x 3" in out
    assert head_main([*common, "--head", "cli", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["version"] == 1 and doc["mode"] == "exact"
    assert head_main([*common, "--head", "nobody"]) == 1
    assert "no head 'nobody'" in capsys.readouterr().err
    assert head_main([*common[:2], "--prefix", "no.such.prefix.", "--head", "cli", "--timeout", "5"]) == 1
    assert "does not exist" in capsys.readouterr().err
