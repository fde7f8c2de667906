"""``unlearn heads`` against the real broker: create, show, list, extend, and the registry reader."""

from __future__ import annotations

import time

import orjson
import pytest

from unlearn.common.registry import RegistryView, publish_contract, read_contracts
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.schemas.head_contract import HeadContract
from unlearn.services.cli import main


def heads(settings: Settings, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["heads", argv[0], "--bootstrap", settings.bootstrap, "--prefix", settings.topic_prefix,
               "--profile", settings.profile, *argv[1:]])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_create_show_list_extend(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = heads(settings, capsys, "create", "--head", "faces", "--dim", "4", "--classes", "3", "--json")
    assert rc == 0
    doc = orjson.loads(out)
    assert (doc["head_id"], doc["version"], doc["dimension"], doc["n_classes"], doc["backbone"]) == \
        ("faces", 1, 4, 3, "features")
    defaults = HeadSettings.of(settings)
    assert (doc["frac_bits"], doc["label_frac_bits"], doc["gamma"], doc["origin"]) == \
        (defaults.frac_bits, defaults.label_frac_bits, defaults.gamma, "declared")

    rc, _, err = heads(settings, capsys, "create", "--head", "faces", "--dim", "8", "--classes", "2")
    assert rc == 1 and "exists (contract v1)" in err

    rc, out, _ = heads(settings, capsys, "create", "--head", "tweets", "--backbone", "minilm",
                       "--labels", "neg,pos")
    assert rc == 0 and "tweets\tv1\td=384\tbackbone=minilm (text)" in out and "2 classes (neg, pos)" in out

    rc, out, _ = heads(settings, capsys, "extend", "--head", "faces", "--classes", "5")
    assert rc == 0 and "faces\tv2\t" in out and "5 classes" in out
    rc, _, err = heads(settings, capsys, "extend", "--head", "faces", "--classes", "4")
    assert rc == 1 and "extend needs more" in err
    rc, _, err = heads(settings, capsys, "extend", "--head", "tweets", "--classes", "4")
    assert rc == 1 and "extend it with new names" in err
    rc, out, _ = heads(settings, capsys, "extend", "--head", "tweets", "--add-labels", "neutral")
    assert rc == 0 and "3 classes (neg, pos, neutral)" in out
    rc, _, err = heads(settings, capsys, "extend", "--head", "nobody", "--classes", "4")
    assert rc == 1 and "not declared" in err

    rc, out, _ = heads(settings, capsys, "show", "--head", "faces", "--json")
    assert rc == 0 and orjson.loads(out)["version"] == 2 and orjson.loads(out)["n_classes"] == 5
    rc, out, _ = heads(settings, capsys, "list", "--json")
    assert rc == 0 and [(d["head_id"], d["version"]) for d in orjson.loads(out)] == [("faces", 2), ("tweets", 2)]
    rc, out, _ = heads(settings, capsys, "list")
    assert rc == 0 and len(out.splitlines()) == 2


def test_create_refuses_what_the_deployment_cannot_take(settings: Settings,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = heads(settings, capsys, "create", "--head", "big", "--dim", "4", "--classes", str(2**20))
    assert rc == 1 and "UNLEARN_MAX_CLASSES" in err
    rc, _, err = heads(settings, capsys, "create", "--head", "big", "--dim", "100000", "--classes", "2")
    assert rc == 1 and "UNLEARN_MAX_FEATURE_DIM" in err
    rc, _, err = heads(settings, capsys, "create", "--head", "big", "--classes", "2")
    assert rc == 1 and "give --dim" in err
    rc, _, err = heads(settings, capsys, "create", "--head", "img", "--backbone", "minilm", "--dim", "5",
                       "--classes", "2")
    assert rc == 1 and "d=384" in err
    assert read_contracts(settings) == {}


def test_reader_takes_the_highest_version_and_skips_bad_records(settings: Settings) -> None:
    from confluent_kafka import Producer

    from unlearn.runtime.clients import producer_config

    c1 = HeadContract("h", 1, 4, "features", "features", "l2", 1.0, 30, 0, "class", 1.0, n_classes=2)
    view = RegistryView(settings).start(wait_caught_up=30)
    try:
        publish_contract(settings, c1.extend(3))
        publish_contract(settings, c1)  # a stale writer: the higher version stays
        p = Producer(producer_config(settings))
        topic = settings.topic("head-registry")
        p.produce(topic, key=b"h", value=b"not json")
        p.produce(topic, key=b"other", value=b'{"schema": "unlearn.head-contract/v1"}')
        p.produce(topic, key=b"wrong-key", value=c1.to_dict().__repr__().encode())
        p.flush(10)
        assert read_contracts(settings) == {"h": c1.extend(3)}
        deadline = time.monotonic() + 10
        while view.get("h") != c1.extend(3) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert view.snapshot() == {"h": c1.extend(3)}
    finally:
        view.stop()
