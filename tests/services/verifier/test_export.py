"""The ULDX export file: round trip, damaged files are errors, offline verification."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.services.verifier.support import (
    CFG,
    StreamBuilder,
    anomalous_stream,
    records_of,
    simulate,
    simulate_with_receipts,
    status,
)
from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.head import encode_head
from unlearn.schemas.receipts import encode_receipt
from unlearn.services.verifier import VerifyError, read_export, verify_file, write_export


def test_export_file_roundtrip_and_offline_verify(tmp_path: Path) -> None:
    b = anomalous_stream(seed=6, n_msgs=12)
    recs = records_of(b.msgs)
    ups, rt, _ = simulate(recs, "h", final_reset=True)
    heads = [LogRecord(0, i, 0, b"h", encode_head(u)) for i, u in enumerate(ups)]
    path = tmp_path / "h.uldx"
    write_export(path, [r for r in recs if r.key == b"h"], heads)
    d2, h2, r2 = read_export(path)
    assert r2 == [] and path.read_bytes()[4:6] == struct.pack("<H", 1)
    assert [r.value for r in d2] == [r.value for r in recs if r.key == b"h"] and len(h2) == len(ups)
    assert [(r.partition, r.offset, r.timestamp_ms, r.key) for r in d2] == \
        [(r.partition, r.offset, r.timestamp_ms, r.key) for r in recs if r.key == b"h"]
    cert = verify_file(path, orders=1, partitionings=1, seed=1)
    assert cert.ok and cert.replay["digest"] == rt.ledger.digest() and cert.source == {"kind": "file",
                                                                                         "path": str(path)}
    # deltas only: the live checks are skipped, the replay checks still certify the ledger
    write_export(tmp_path / "only.uldx", [r for r in recs if r.key == b"h"])
    cert2 = verify_file(tmp_path / "only.uldx", orders=1, partitionings=1, seed=1, gamma=CFG.gamma)
    assert cert2.ok and status(cert2, "live_digest") == "skipped"
    assert status(cert2, "retrain_deviation") == "pass"


def test_damaged_files_are_errors_not_certificates(tmp_path: Path) -> None:
    b = anomalous_stream(seed=6, n_msgs=3)
    path = tmp_path / "h.uldx"
    write_export(path, records_of(b.msgs))
    data = path.read_bytes()
    cases = {
        "cut.uldx": (data[:-10], "truncated"),
        "header.uldx": (data[:8 + 10], "truncated (header)"),
        "short.uldx": (b"UL", "too short"),
        "magic.uldx": (b"XXXX" + data[4:], "magic"),
        "version.uldx": (data[:4] + struct.pack("<H", 9) + data[6:], "version 9"),
        "kind.uldx": (data[:8] + bytes([7]) + data[9:], "unknown kind 7"),
    }
    for name, (raw, msg) in cases.items():
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(VerifyError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            read_export(tmp_path / name)
    with pytest.raises(VerifyError, match="cannot read"):
        read_export(tmp_path / "missing.uldx")
    # a file with two heads' deltas needs the head named
    other = StreamBuilder(head="other", seed=9)
    other.random_message()
    write_export(tmp_path / "two.uldx", [*records_of(b.msgs), LogRecord(0, 99, 0, b"other", other.msgs[0][1])])
    with pytest.raises(VerifyError, match="pass --head"):
        verify_file(tmp_path / "two.uldx")


def test_tombstones_are_written_as_empty_values(tmp_path: Path) -> None:
    path = tmp_path / "t.uldx"
    write_export(path, [LogRecord(0, 5, 7, b"h", None)])
    (rec,), heads, receipts = read_export(path)
    assert heads == receipts == []
    assert (rec.partition, rec.offset, rec.timestamp_ms, rec.key, rec.value) == (0, 5, 7, b"h", b"")


def test_receipts_in_the_export_are_checked_offline(tmp_path: Path) -> None:
    """Receipts are record kind 3; verify_file checks their retained-rows
    hash like the broker mode does, and a forged one fails the certificate."""
    b = anomalous_stream(seed=8, n_msgs=12)
    recs = records_of(b.msgs)
    ups, _rt, _, receipts = simulate_with_receipts(recs, "h", final_reset=True)
    deltas = [r for r in recs if r.key == b"h"]
    heads = [LogRecord(0, i, 0, b"h", encode_head(u)) for i, u in enumerate(ups)]
    rrecs = [LogRecord(1, i, 0, r.subject_id.encode(), encode_receipt(r)) for i, r in enumerate(receipts)]
    path = tmp_path / "h.uldx"
    write_export(path, deltas, heads, rrecs)
    assert path.read_bytes()[4:6] == struct.pack("<H", 1)
    back = read_export(path)
    assert [r.value for r in back.receipts] == [r.value for r in rrecs] and len(back.deltas) == len(deltas)
    cert = verify_file(path, orders=0, partitionings=0, seed=1)
    check = next(c for c in cert.checks if c.name == "retained_hash")
    assert cert.ok and check.data["compared"]["receipts"] == len(receipts) > 0
    forged = encode_receipt(type(receipts[0])(**{**{f: getattr(receipts[0], f) for f in receipts[0].__slots__},
                                                 "retained_hash": "e" * 64}))
    write_export(path, deltas, heads, [*rrecs, LogRecord(1, 99, 0, b"x", forged)])
    assert status(verify_file(path, orders=0, partitionings=0, seed=1), "retained_hash") == "fail"
    # one version: nothing else was ever released
    data = path.read_bytes()
    (tmp_path / "v2.uldx").write_bytes(data[:4] + struct.pack("<H", 2) + data[6:])
    with pytest.raises(VerifyError, match="version 2 is unknown"):
        read_export(tmp_path / "v2.uldx")
