"""The quick chaos benchmark as a test: random kill -9 of the ledger and the featurizer while
5k events flow through a real broker; every correctness count must be zero. Times are printed by
the benchmark, never asserted."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench import chaos
from bench.chaos_pipeline import Config


@pytest.mark.broker
def test_quick_chaos_run_is_exact(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    code = chaos.main(["--quick", "--workdir", str(tmp_path / "work"), "--json", str(out)])
    report = orjson.loads(out.read_bytes())
    assert report["events_produced"] == 5000 and len(report["kills"]) == 6
    for key in ("lost_events", "doubled_events", "digest_mismatched_heads", "versions_with_two_digests",
                "retained_hash_mismatched_heads", "versions_with_two_retained_hashes", "receipts_missing",
                "receipts_conflicting"):
        assert report[key] == 0, (key, report)
    assert code == 0
    assert report["recovery_s"]["ledger"], "the ledger was killed and came back at least once"


@pytest.mark.parametrize(("kills", "node_kills", "cluster"), [(12, 3, True), (2, 1, True), (0, 2, False), (5, 0, True)])
def test_kafka_schedule_spreads_the_broker_faults(kills: int, node_kills: int, cluster: bool) -> None:
    cfg = Config(kills=kills, engine="kafka", nodes=3, node_kills=node_kills, cluster_restart=cluster)
    actions = chaos._schedule(cfg)
    assert actions.count("worker") == kills and actions.count("node") == node_kills
    assert actions.count("cluster") == int(cluster)
    if kills:  # a broker fault never opens the run
        assert actions[0] == "worker"


def test_tansu_schedule_is_worker_kills_only() -> None:
    assert chaos._schedule(Config(kills=4)) == ["worker"] * 4


@pytest.mark.parametrize("argv", [["--nodes", "3"], ["--node-kills", "1"], ["--cluster-restart"],
                                  ["--engine", "kafka", "--nodes", "1", "--node-kills", "1"],
                                  ["--engine", "kafka", "--broker-restart"]])
def test_kafka_options_are_refused_where_they_cannot_run(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        chaos.main(argv)
