"""The verifier judges event ids again (``services/verifier/event_ids.py``): in log order, no
applied add or delete may reuse the event id of an add still retained (check ``event_ids``, in
the certificate only when it fails)."""

from __future__ import annotations

import numpy as np

from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.delta_codec import Delta, RowsEntry, encode_delta
from unlearn.services.verifier.checks import run_checks
from unlearn.services.verifier.event_ids import check_event_ids
from unlearn.services.verifier.evidence import Evidence


def _rows(sign: int, ev: str, sample: str, label: int = 0, q: tuple[int, int] = (1, 2)) -> RowsEntry:
    return RowsEntry(sign, [ev], [sample], ["u"], np.array([label]), np.array([q]), [10], False, [""])


def _names(ev: Evidence) -> list[str]:
    checks = run_checks(ev, np.random.default_rng(0), orders=1, partitionings=1, tolerance=1e-6, require_live=False,
                        gamma=None)
    return [c.name for c in checks]


def _evidence(*entries: RowsEntry) -> Evidence:
    records = [LogRecord(0, i, 0, b"h", encode_delta(Delta("h", f"requests.by-head/0@{i}", 2, 30, 0, [e])))
               for i, e in enumerate(entries)]
    return Evidence.gather(records, None, "h")


def test_two_retained_adds_under_one_event_id_fail() -> None:
    """The reported case: samples rp-a and rp-b, labels 0 and 1, both event replay-1."""
    ev = _evidence(_rows(1, "replay-1", "rp-a", 0), _rows(1, "replay-1", "rp-b", 1, (2, 1)))
    check = check_event_ids(ev.replay.ids)
    assert check is not None and check.status == "fail" and check.data["violations"] == 1, check
    assert "event_ids" in _names(ev)


def test_a_delete_under_a_retained_add_id_fails_and_reuse_after_removal_passes() -> None:
    bad = _evidence(_rows(1, "e1", "x"), _rows(1, "e2", "y"), _rows(-1, "e1", "y"))
    check = check_event_ids(bad.replay.ids)
    assert check is not None and check.data["violations"] == 1
    # distinct ids, a delete, and an id whose add was removed: the log shows no reuse it can judge
    good = _evidence(_rows(1, "e1", "x"), _rows(-1, "d1", "x"), _rows(1, "e2", "x"), _rows(1, "e3", "y"))
    assert check_event_ids(good.replay.ids) is None
    assert "event_ids" not in _names(good)
