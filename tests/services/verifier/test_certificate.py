"""The certificate: verdict rules, JSON with its integrity hash, the human summary."""

from __future__ import annotations

import hashlib

import orjson

from unlearn.services.verifier import CERTIFICATE_SCHEMA, Certificate, Check

REPLAY = {"messages": 2, "applied_versions": 2, "version": 2, "pending": 0, "digest": "ab" * 32, "n_retained": 3,
          "d": 4, "c": 2, "units": 3, "skipped_counts": {"bad_delta": 1},
          "rejected_entries": [{"partition": 0, "offset": 1, "entry_index": 0, "op": "delete", "events": 1,
                                "reason": "non_member_delete", "detail": "not a member"}]}


def test_ok_needs_a_pass_and_no_fail() -> None:
    def cert(*statuses: str) -> Certificate:
        return Certificate("h", {}, [Check(f"c{i}", s, "") for i, s in enumerate(statuses)],  # type: ignore[arg-type]
                           REPLAY, None, 1)

    assert cert("pass", "skipped").ok
    assert not cert("skipped", "skipped").ok  # certifies nothing
    assert not cert("pass", "fail").ok
    assert not cert().ok


def test_json_hash_and_summary() -> None:
    checks = [Check("log_replay", "pass", "fine", {"digest": "ab" * 32}),
              Check("retrain_deviation", "fail", "too far", {"deviation": 0.5}),
              Check("canonical_head", "skipped", "not checkable")]
    c = Certificate("h", {"kind": "file", "path": "x.uldx"}, checks, REPLAY, None, 7, ["careful"], created_ts=1.0)
    js = c.to_json()
    assert js["schema"] == CERTIFICATE_SCHEMA and not js["ok"] and js["seed"] == 7 and js["retrain_deviation"] == 0.5
    body = {k: v for k, v in js.items() if k != "certificate_sha256"}
    assert js["certificate_sha256"] == hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert js["summary"] == c.summary_line()
    assert c.summary_line().startswith("FAIL: 1 passed, 1 failed (retrain_deviation), 1 skipped; version 2")
    text = c.summary()
    assert "file x.uldx" in text and "[fail   ] retrain_deviation: too far" in text
    assert "rejected entry: partition 0 offset 1 entry 0 (delete, 1 events): non_member_delete" in text
    assert "warning: careful" in text
