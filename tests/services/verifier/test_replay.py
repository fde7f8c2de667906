"""The log-order replay decides like the live ledger (HeadRuntime): the same skips, rejections,
versions and digest, on a stream with every anomaly the live ledger handles."""

from __future__ import annotations

import numpy as np
import orjson

from tests.services.verifier.support import CFG, StreamBuilder, anomalous_stream, records_of, simulate
from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.delta_codec import Delta, RowsEntry, decode_delta, encode_delta
from unlearn.services.verifier import replay_log, verify
from unlearn.streams.ledger.head_runtime import HeadRuntime


def test_replay_certifies_the_live_head_with_the_live_skip_rules() -> None:
    b = anomalous_stream(seed=1)
    recs = records_of(b.msgs)
    ups, rt, reasons = simulate(recs, "h", final_reset=True)
    assert ups[-1].mode == "exact"
    cert = verify(recs, ups, "h", orders=3, partitionings=3, seed=5)
    assert cert.ok, cert.summary()
    assert {c.name: c.status for c in cert.checks} == {
        "log_replay": "pass", "shuffled_orders": "pass", "repartitionings": "pass", "from_scratch": "pass",
        "live_digest": "pass", "retained_hash": "pass", "canonical_head": "pass", "retrain_deviation": "pass",
        "remove_wins": "pass"}
    # the same skip decisions as the live rules
    assert cert.replay["version"] == rt.version and cert.replay["digest"] == rt.ledger.digest()
    assert cert.replay["digest"] == b.reference().digest()
    assert cert.replay["skipped_counts"] == {"duplicate_source": 1, "bad_delta": 1}
    assert sorted(r["reason"] for r in cert.replay["rejected_entries"]) == sorted(reasons)
    assert sorted(reasons) == ["non_member_delete", "unknown_head"]
    dev = next(c for c in cert.checks if c.name == "retrain_deviation")
    assert dev.data["deviation"] < 1e-10
    # orders and partitionings really differed (different batch/partition structures)
    parts = next(c for c in cert.checks if c.name == "repartitionings").data["partitionings"]
    assert all(p["partitions"] >= 2 for p in parts)
    js = cert.to_json()
    assert js["ok"] and js["schema"] == "unlearn.verify/v1" and js["seed"] == 5
    orjson.dumps(js)  # JSON-ready


def test_redelivered_offsets_and_grid_mismatches_follow_the_runtime() -> None:
    """A redelivered offset (a partition replayed by the consumer) is skipped and a delta on another
    grid is rejected entry by entry, with the runtime's own reasons and details."""
    b = StreamBuilder(seed=11)
    for _ in range(4):
        b.random_message()
    recs = records_of(b.msgs)
    recs.append(recs[2])  # the same offset again: redelivered
    wrong = StreamBuilder(seed=12, d=5).add(n=2)
    recs.append(LogRecord(0, len(recs), 0, b"h", encode_delta(Delta("h", "requests/0@99", 5, 30, 0, (wrong,)))))
    rep = replay_log(recs, "h")
    rt: HeadRuntime | None = None
    runtime_skips: list[str] = []
    runtime_rejections: list[tuple[str, str]] = []
    for r in recs:
        assert r.value is not None
        delta = decode_delta(r.value)
        rt = rt or HeadRuntime.new("h", delta, CFG)
        out = rt.apply(delta, r.offset, r.partition)
        if out.skipped:
            runtime_skips.append(out.skipped)
        runtime_rejections += [(x.reason, x.detail) for x in out.rejections]
    assert rt is not None
    assert [s.reason for s in rep.skipped] == runtime_skips == ["redelivered"]
    assert [(s.reason, s.detail) for s in rep.rejected] == runtime_rejections
    assert [s.reason for s in rep.rejected] == ["dimension_mismatch"]
    assert rep.final_version == rt.version and rep.ledger is not None and rep.ledger.digest() == rt.ledger.digest()


def test_tombstones_are_bad_deltas_when_keyed_and_ignored_when_not() -> None:
    """The shared reader hands tombstones over as value None; the live ledger dead-letters a keyed one."""
    b = StreamBuilder(seed=13)
    for _ in range(3):
        b.random_message()
    recs = records_of(b.msgs)
    recs += [LogRecord(0, len(recs), 0, b"h", None), LogRecord(0, len(recs) + 1, 0, None, None)]
    rep = replay_log(recs, "h")
    assert rep.counts() == {"bad_delta": 1} and rep.final_version == 3
    assert rep.ledger is not None and rep.ledger.digest() == b.reference().digest()


def test_stop_version_captures_and_counts_pending() -> None:
    b = StreamBuilder(seed=14)
    for _ in range(6):
        b.random_message()
    recs = records_of(b.msgs)
    full = replay_log(recs, "h")
    rep = replay_log(recs, "h", stop_version=4, capture=[2, 4])
    assert rep.version == 4 and rep.final_version == full.final_version == 6 and rep.pending == 2
    assert sorted(rep.at_version) == [2, 4] and rep.ledger is not None
    assert rep.at_version[4].digest() == rep.ledger.digest() != full.ledger.digest()  # type: ignore[union-attr]
    assert rep.offset_of_version[4] == (0, 3)
    # the retained-rows hash at every replayed version, as the full replay has it there
    assert sorted(rep.retained_hash_at) == [1, 2, 3, 4] and rep.retained_hash == full.retained_hash_at[4]
    assert full.retained_hash != rep.retained_hash
    # a delete-only delta before the first add creates no head: unknown_head, no version
    ghost = RowsEntry(-1, ("e",), ("s",), ("u",), np.array([0]), np.zeros((1, 8), np.int64))
    first = LogRecord(0, 0, 0, b"h", encode_delta(Delta("h", "requests/0@0", 8, 30, 0, (ghost,))))
    rep2 = replay_log([first], "h")
    assert [s.reason for s in rep2.rejected] == ["unknown_head"] and rep2.ledger is None and rep2.final_version == 0
