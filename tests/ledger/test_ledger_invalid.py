"""Every invalid input gets a clear error and leaves the ledger exactly as it was."""

from __future__ import annotations

import numpy as np
import pytest

from unlearn.ledger import (
    QMAX,
    ExactLedger,
    LedgerError,
    NonMemberDelete,
    OverflowBudgetError,
    QuantizationError,
    Quantizer,
)
from unlearn.ledger.exact import MAX_COUNT


@pytest.fixture()
def ledger() -> ExactLedger:
    rng = np.random.default_rng(0)
    led = ExactLedger(4, 3)
    led.add(Quantizer().quantize(rng.uniform(-0.1, 0.1, (6, 4))), [0, 1, 2, 0, 1, 2])
    return led


def _q(*rows: list[float]) -> np.ndarray:
    return Quantizer().quantize(np.array(rows, dtype=float))


BAD_UPDATES = [
    ("float Q", "add", lambda: (np.zeros((1, 4)), [0]), "integer array"),
    ("wrong width", "add", lambda: (np.zeros((1, 5), np.int64), [0]), r"shape \(r, 4\)"),
    ("3-d Q", "add", lambda: (np.zeros((1, 1, 4), np.int64), [0]), "shape"),
    ("q beyond 2^30", "add", lambda: (np.full((1, 4), QMAX + 1, np.int64), [0]), "exceeds 2\\^30"),
    ("label count", "add", lambda: (np.zeros((2, 4), np.int64), [0]), "2 rows"),
    ("negative class", "add", lambda: (np.zeros((1, 4), np.int64), [-1]), "class indices"),
    ("float labels", "add", lambda: (np.zeros((1, 4), np.int64), [0.5]), "dtype"),
    ("narrow targets", "add", lambda: (np.zeros((1, 4), np.int64), np.zeros((1, 2), np.int64)), "columns"),
    ("targets beyond 2^30", "add", lambda: (np.zeros((1, 4), np.int64), np.full((1, 3), QMAX + 1, np.int64)), "2\\^30"),
    ("delete unseen class", "delete", lambda: (np.zeros((1, 4), np.int64), [7]), "never seen|class"),
    ("delete beyond class count", "delete", lambda: (np.zeros((3, 4), np.int64), [0, 0, 0]), "class 0"),
    ("delete more than held", "delete", lambda: (np.zeros((7, 4), np.int64), np.zeros((7, 3), np.int64)), "holding 6"),
    ("delete never-added row", "delete", lambda: (_q([1, 1, 1, 1]), [0]), r"S\[\d,\d\] negative"),
]


@pytest.mark.parametrize("name,op,make,message", BAD_UPDATES, ids=[b[0] for b in BAD_UPDATES])
def test_bad_update_is_rejected_and_changes_nothing(ledger: ExactLedger, name: str, op: str, make,
                                                    message: str) -> None:
    before, blob = ledger.digest(), ledger.to_bytes()
    Q, y = make()
    with pytest.raises(LedgerError, match=message):
        getattr(ledger, op)(Q, y)
    assert ledger.digest() == before
    assert ledger.to_bytes() == blob


def test_non_member_delete_is_its_own_error_type(ledger: ExactLedger) -> None:
    with pytest.raises(NonMemberDelete):
        ledger.delete(_q([1, 1, 1, 1]), [0])


def test_overflow_budget_is_enforced(ledger: ExactLedger) -> None:
    ledger._count = MAX_COUNT  # white-box: reaching 2^32 samples for real takes hours
    before = ledger.to_bytes()
    with pytest.raises(OverflowBudgetError, match="2\\^32"):
        ledger.add(np.zeros((1, 4), np.int64), [0])
    assert ledger.to_bytes() == before


def test_incompatible_merge_is_rejected(ledger: ExactLedger) -> None:
    with pytest.raises(LedgerError, match="incompatible"):
        ledger.merge(ExactLedger(5, 3))
    with pytest.raises(LedgerError, match="incompatible"):
        ledger.merge(ExactLedger(4, 3, frac_bits=20))


@pytest.mark.parametrize("bad,message", [
    ([[np.nan, 0.0]], "row 0: feature is NaN"),
    ([[0.0, 0.0], [np.inf, 0.0]], "row 1: feature is NaN or infinite"),
    ([[0.5, 0.5], [0.1, 1.0000001]], r"row 1: \|feature\[1\]\|"),
    ([["a", "b"]], "numeric"),
])
def test_quantizer_rejects_never_clips(bad, message: str) -> None:
    with pytest.raises(QuantizationError, match=message):
        Quantizer().quantize(np.array(bad))


def test_quantizer_grid_and_budget() -> None:
    q = Quantizer(frac_bits=30)
    assert q.quantize([[1.0, -1.0, 0.5 / 2**30, 1.5 / 2**30]]).tolist() == [[QMAX, -QMAX, 0, 2]]  # half to even
    with pytest.raises(ValueError, match="exceeds 2\\^30"):
        Quantizer(frac_bits=30, bound=2.0)
    assert Quantizer(frac_bits=29, bound=2.0).quantize([[2.0]]).tolist() == [[QMAX]]
