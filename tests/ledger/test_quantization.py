"""The grid (ledger/quantization.py): out-of-bound or non-finite features are rejected, never clipped;
the grid rounds half to even and keeps bound * 2^k within 2^30."""

from __future__ import annotations

import numpy as np
import pytest

from unlearn.ledger import (
    QMAX,
    QuantizationError,
    Quantizer,
)


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
