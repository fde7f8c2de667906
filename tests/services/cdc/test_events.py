"""The pure change -> request mapping of `unlearn cdc` (services/cdc/events.py), no broker, no database."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unlearn.services.cdc.events import REASONS, Refusal, TableMap, change_requests, features_input

M = TableMap("public.samples", "h1", "id", "owner", "label", "feat")
TS_US = 1_790_000_000_123_456
F4 = {"type": "array", "items": {"type": "float", "optional": True}, "optional": True, "field": "feat"}
F8 = {"type": "array", "items": {"type": "double", "optional": True}, "optional": True, "field": "feat"}
BY = {"type": "bytes", "optional": True, "field": "feat"}


def schema(feat: dict | None = None) -> dict:
    cols = [{"type": "string", "optional": False, "field": "id"},
            {"type": "string", "optional": True, "field": "owner"},
            {"type": "int32", "optional": True, "field": "label"}, feat or F4]
    row = {"type": "struct", "fields": cols, "optional": True, "name": "x.Value"}
    return {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                                         {"type": "struct", "fields": [], "field": "source"}]}


def ev(op: str, before: dict | None, after: dict | None, lsn: int = 100, feat: dict | None = None,
       table: str = "samples") -> dict:
    return {"schema": schema(feat), "payload": {
        "before": before, "after": after, "op": op, "ts_ms": 1, "transaction": None,
        "source": {"schema": "public", "table": table, "lsn": lsn, "ts_ms": TS_US // 1000, "ts_us": TS_US,
                   "snapshot": "false"}}}


def row(i: str = "s1", owner: str = "alice", label: int | None = 3, feat: object = (0.1, -0.5, 2.0)) -> dict:
    return {"id": i, "owner": owner, "label": label, "feat": list(feat) if isinstance(feat, tuple) else feat}


def test_insert_and_snapshot_read_are_adds_at_commit_time_with_float32_bits() -> None:
    for op in ("c", "r"):
        [req] = change_requests(M, ev(op, None, row()))
        assert isinstance(req, dict)
        assert req["op"] == "add" and req["head_id"] == "h1" and req["sample_id"] == "s1"
        assert req["subject_id"] == "alice" and req["label"] == 3 and req["client_id"] == "cdc"
        assert round(req["ts"] * 1_000_000) == TS_US
        assert req["event_id"] == f"cdc:public.samples:100:{op}:s1"
        # Connect writes a float4 as its shortest decimal ("0.1"): the request carries the float32 itself.
        assert req["input"]["kind"] == "features_bin" and req["input"]["dtype"] == "<f4"
        got = np.frombuffer(base64.b64decode(req["input"]["data"]), "<f4")
        assert np.array_equal(got, np.array([0.1, -0.5, 2.0], dtype=np.float32))


def test_double_precision_array_is_float64_values() -> None:
    [req] = change_requests(M, ev("c", None, row(feat=(0.1, 0.2)), feat=F8))
    assert isinstance(req, dict) and req["input"] == {"kind": "features", "values": [0.1, 0.2]}


def test_bytea_is_f4_bytes_or_a_png_image() -> None:
    raw = struct.pack("<3f", 1.0, 2.0, 3.0)
    [req] = change_requests(M, ev("c", None, row(feat=base64.b64encode(raw).decode()), feat=BY))
    assert isinstance(req, dict) and req["input"] == {"kind": "features_bin", "dtype": "<f4",
                                                      "data": base64.b64encode(raw).decode()}
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 20).decode()
    [req] = change_requests(M, ev("c", None, row(feat=png), feat=BY))
    assert isinstance(req, dict) and req["input"] == {"kind": "image", "format": "png", "data": png}


def test_delete_is_a_delete_of_the_old_row_at_commit_time() -> None:
    [req] = change_requests(M, ev("d", row(), None, lsn=200))
    assert isinstance(req, dict)
    assert req == {"schema": "unlearn.request/v1", "event_id": "cdc:public.samples:200:d:s1", "op": "delete",
                   "head_id": "h1", "client_id": "cdc", "subject_id": "alice", "sample_id": "s1", "ts": TS_US / 1e6}


def test_update_of_label_or_features_is_delete_then_a_later_add_other_columns_nothing() -> None:
    old = row()
    for new in (row(label=4), row(feat=(0.3, 0.3, 0.3)), row(owner="bob")):
        d, a = change_requests(M, ev("u", old, new, lsn=300))
        assert isinstance(d, dict) and isinstance(a, dict)
        assert (d["op"], a["op"]) == ("delete", "add")
        assert d["subject_id"] == "alice" and a["subject_id"] == new["owner"]
        # remove wins breaks ties for the delete: the add must be strictly later
        assert round(a["ts"] * 1e6) == round(d["ts"] * 1e6) + 1
        assert d["event_id"] != a["event_id"]
    unchanged = {**row(), "note": "x"}
    assert change_requests(M, ev("u", {**row(), "note": "y"}, unchanged)) == []


@pytest.mark.parametrize(("r", "feat", "reason"), [
    (row(feat=None), F4, "cdc_null_column"),
    (row(feat=[0.1, None]), F4, "cdc_null_column"),
    (row(label=None), F4, "cdc_null_column"),
    (row(feat=[]), F4, "cdc_wrong_length"),
    (row(feat=base64.b64encode(b"\0" * 6).decode()), BY, "cdc_wrong_length"),
    (row(feat=base64.b64encode(struct.pack("<f", float("nan"))).decode()), BY, "cdc_non_finite"),
    (row(feat="not an array"), {"type": "string", "field": "feat"}, "cdc_wrong_type"),
    (row(label="three"), F4, "cdc_wrong_type"),  # type: ignore[arg-type]
    (row(i="bad id/with slash"), F4, "cdc_bad_id"),
    (row(owner=None), F4, "cdc_null_column"),  # type: ignore[arg-type]
])
def test_bad_rows_are_refused_with_a_documented_reason(r: dict, feat: dict, reason: str) -> None:
    [out] = change_requests(M, ev("c", None, r, feat=feat))
    assert isinstance(out, Refusal) and out.reason == reason and reason in REASONS


def test_truncate_and_deletes_without_old_row_are_refused_not_skipped() -> None:
    [t] = change_requests(M, ev("t", None, None))
    assert isinstance(t, Refusal) and t.reason == "cdc_truncate_refused"
    [d] = change_requests(M, ev("d", {"id": "s1", "owner": None, "label": None, "feat": None}, None))
    assert isinstance(d, Refusal) and d.reason == "cdc_no_before_image" and d.event_id
    [u] = change_requests(M, ev("u", None, row()))
    assert isinstance(u, Refusal) and u.reason == "cdc_no_before_image"
    [x] = change_requests(M, ev("c", None, row(), table="other"))
    assert isinstance(x, Refusal) and x.reason == "cdc_bad_event"
    assert change_requests(M, None) == []  # a Debezium tombstone is no change
    [y] = change_requests(M, {"no": "payload"})
    assert isinstance(y, Refusal) and y.reason == "cdc_bad_event"


def test_update_to_a_bad_row_deletes_the_old_and_refuses_the_new() -> None:
    d, a = change_requests(M, ev("u", row(), row(feat=None)))
    assert isinstance(d, dict) and d["op"] == "delete"
    assert isinstance(a, Refusal) and a.reason == "cdc_null_column"


ids = st.text("abcXYZ019._-", min_size=1, max_size=20)
floats32 = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


@given(op=st.sampled_from(["c", "r", "d", "u"]), lsn=st.integers(0, 2**63), sample=ids, owner=ids,
       label=st.integers(0, 99), feat=st.lists(floats32, min_size=1, max_size=8), label2=st.integers(0, 99))
def test_a_redelivered_change_is_the_same_requests_and_distinct_changes_distinct_ids(
        op: str, lsn: int, sample: str, owner: str, label: int, feat: list[float], label2: int) -> None:
    # Connect prints a float4 as its shortest repr: what Python's float32 repr prints too.
    as_json = [float(str(np.float32(x))) for x in feat]
    before = row(sample, owner, label, as_json) if op in ("d", "u") else None
    after = row(sample, owner, label2 if op == "u" else label, as_json) if op != "d" else None
    first = change_requests(M, ev(op, before, after, lsn=lsn))
    assert first == change_requests(M, ev(op, before, after, lsn=lsn))  # same id, same content
    other = change_requests(M, ev(op, before, after, lsn=lsn + 1))
    ids_first = {r["event_id"] for r in first if isinstance(r, dict)}
    assert not ids_first & {r["event_id"] for r in other if isinstance(r, dict)}
    for r in first:
        assert isinstance(r, dict)
        if r["op"] == "add":
            got = np.frombuffer(base64.b64decode(r["input"]["data"]), "<f4")
            assert np.array_equal(got, np.array(feat, dtype=np.float32))


def test_features_input_names_the_column_in_refusals() -> None:
    with pytest.raises(Refusal, match="'emb'"):
        features_input(None, F4, "emb")


def test_streamed_changes_are_dated_no_earlier_than_the_snapshot_floor() -> None:
    floor = TS_US + 500
    [snap] = change_requests(M, ev("r", None, row()), floor)
    assert isinstance(snap, dict) and round(snap["ts"] * 1e6) == TS_US  # a read keeps its own date
    [d] = change_requests(M, ev("d", row(), None), floor)
    assert isinstance(d, dict) and round(d["ts"] * 1e6) == floor
    dd, aa = change_requests(M, ev("u", row(), row(label=1)), floor)
    assert isinstance(dd, dict) and isinstance(aa, dict)
    assert (round(dd["ts"] * 1e6), round(aa["ts"] * 1e6)) == (floor, floor + 1)


def test_offsets_state_tells_a_snapshot_in_progress_from_a_stream(tmp_path: Path) -> None:
    from unlearn.services.cdc.state import offsets_state

    f = tmp_path / "connect.offsets"
    assert offsets_state(f) == "none"
    key = b'\xac\xed\x00\x05sr\x00\x11java.util.HashMap["c",{"server":"x"}]uq\x00~\x00\x00\x00w'
    f.write_bytes(key + b'{"last_snapshot_record":false,"lsn":22,"txId":7,"ts_usec":1,"snapshot":"INITIAL"}x')
    assert offsets_state(f) == "snapshotting"
    f.write_bytes(key + b'{"last_snapshot_record":true,"lsn":22,"txId":7,"ts_usec":1,"snapshot":"INITIAL"}x')
    assert offsets_state(f) == "streaming"
    f.write_bytes(key + b'{"lsn_proc":22282200,"messageType":"INSERT","lsn_commit":22282200,"lsn":22282200}x')
    assert offsets_state(f) == "streaming"


def test_debezium_is_started_only_where_it_cannot_snapshot_over_a_stream(tmp_path: Path) -> None:
    from unlearn.services.cdc.postgres import CdcSourceError
    from unlearn.services.cdc.state import check_resumable

    check_resumable(tmp_path, False, "slot")  # first start: fresh slot, no offsets
    with pytest.raises(CdcSourceError, match="no source offsets"):
        check_resumable(tmp_path, True, "slot")  # crashed before Connect saved anything
    (tmp_path / "connect.offsets").write_bytes(b'{"last_snapshot_record":false,"lsn":1,"snapshot":"INITIAL"}')
    with pytest.raises(CdcSourceError, match="before its snapshot completed"):
        check_resumable(tmp_path, True, "slot")
    (tmp_path / "connect.offsets").write_bytes(b'{"lsn_proc":5,"lsn_commit":5,"lsn":5}')
    check_resumable(tmp_path, True, "slot")  # a restart past the snapshot
    with pytest.raises(CdcSourceError, match="no replication slot"):
        check_resumable(tmp_path, False, "slot")
