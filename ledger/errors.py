"""Error types of the exact core. All are ``ValueError``s so callers can treat bad input uniformly."""


class QuantizationError(ValueError):
    """A feature or label cannot be quantized (NaN/Inf, out of the declared bound)."""


class LedgerError(ValueError):
    """An update the ledger refuses: wrong shape/dtype, overflow, or a delete of a non-member."""


class NonMemberDelete(LedgerError):
    """A delete that would make a count or a diagonal of S negative: it removes something never added."""


class OverflowBudgetError(LedgerError):
    """The ledger would exceed its exactness budget (n < 2^32 retained samples)."""
