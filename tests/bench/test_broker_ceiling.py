"""Smoke test of bench/broker_ceiling.py on each local engine (tansu, Apache Kafka) at a tiny size: every message is
acknowledged and read back, and the rates are well-formed. No timing assertions."""

from __future__ import annotations

import argparse
import math

import pytest

from bench import broker_ceiling


@pytest.mark.parametrize("engine", ["tansu", "kafka"])
def test_broker_ceiling_round_trips_every_message(engine: str) -> None:
    args = argparse.Namespace(n=60, sizes="100,900", partitions=2, linger_ms=1, repeats=1, engine=engine)
    res = broker_ceiling.run(args)
    assert [r["bytes"] for r in res["sizes"]] == [100, 900]
    for row in res["sizes"]:
        for key in ("produce_median", "consume_median"):
            assert math.isfinite(row[key]) and row[key] > 0
