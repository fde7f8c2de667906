"""The quick chaos benchmark as a test: random kill -9 of the ledger and the featurizer while
5k events flow through a real broker; every correctness count must be zero. Times are printed by
the benchmark, never asserted."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench import chaos

pytestmark = pytest.mark.broker


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
