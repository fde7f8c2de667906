"""The featurizer service enforces the head registry, on the real broker: the label 100000 add
is dead-lettered with its reason, and `unlearn heads extend` then admits a new class."""

from __future__ import annotations

import time

import pytest

from tests.sealed_support import plain_delta
from tests.streams.featurizer.test_service import Reader, Running, add, produce
from unlearn.infra.registry import read_contracts
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.services.cli import main

pytestmark = pytest.mark.broker


def heads(settings: Settings, *argv: str) -> int:
    return main(["heads", argv[0], "--bootstrap", settings.bootstrap, "--prefix", settings.topic_prefix,
                 "--profile", settings.profile, *argv[1:]])


def test_declared_label_space_is_enforced_and_extend_grows_it(settings: Settings, tmp_path) -> None:
    s = settings.with_(data_dir=str(tmp_path))
    assert heads(s, "create", "--head", "faces", "--dim", "4", "--classes", "3") == 0
    run = Running(s)
    reader = Reader(s)
    try:
        produce(s, [add("e1", "faces", "u", "x1", [1, 0, 0, 0], 100000),
                    add("e2", "faces", "u", "x2", [1, 0, 0, 0], 2),
                    add("e3", "faces", "u", "x3", [1, 0, 0, 0], 3),
                    add("e4", "auto", "u", "y1", [0, 1], 7)])
        got = reader.until(lambda g: len(g["deadletter"]) >= 2 and len(g["deltas"]) >= 2)
        dls = {d.event_id: d for d in (decode_deadletter(m.value()) for m in got["deadletter"])}
        assert {e: d.reason for e, d in dls.items()} == {"e1": "label_out_of_range", "e3": "label_out_of_range"}
        assert "0..2 (contract v1)" in dls["e1"].detail
        # each delta names the contract it was judged under: the head's columns, whatever labels came
        first = {d.head_id: d for d in (plain_delta(m.value(), m.topic()) for m in got["deltas"])}
        assert (first["faces"].n_classes, first["faces"].contract_version) == (3, 1)
        assert (first["auto"].n_classes, first["auto"].contract_version) == (HeadSettings.of(s).default_classes, 1)
        # the undeclared head was auto-created, its contract published with its first delta
        deadline = time.monotonic() + 20
        while "auto" not in (contracts := read_contracts(s)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (contracts["auto"].origin, contracts["auto"].n_classes) == ("auto", HeadSettings.of(s).default_classes)
        assert heads(s, "extend", "--head", "faces", "--classes", "4") == 0
        while run.service.registry is None or run.service.registry.get("faces").version < 2:  # type: ignore[union-attr]
            assert time.monotonic() < deadline + 20
            time.sleep(0.05)
        produce(s, [add("e5", "faces", "u", "x3", [1, 0, 0, 0], 3)])
        got = reader.until(lambda g: len(g["deltas"]) >= 3)
        last = plain_delta(got["deltas"][-1].value(), got["deltas"][-1].topic())
        assert (last.head_id, int(last.entries[0].labels[0])) == ("faces", 3)
        assert (last.n_classes, last.contract_version) == (4, 2)
    finally:
        reader.close()
        assert run.stop() == 0
