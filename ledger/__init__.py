"""Pure math core: the exact integer ledger of a ridge head, and heads from it (no I/O).

Public API (other packages and external checks use these names):
``Quantizer``, ``QuantizationError``, ``l2_normalize``, ``with_intercept``, ``ExactLedger``,
``solve_head``, ``SMWTracker``, ``CholeskyTracker``, ``TrackedHead``, ``retrain_deviation``, Bayesian helpers.
"""

from .bayes import kl_matrix_normal, posterior_covariance, predictive_variance, predictive_variance_cholesky
from .cholesky_tracker import CholeskyTracker
from .errors import LedgerError, NonMemberDelete, OverflowBudgetError, QuantizationError
from .exact_ledger import ExactLedger, SufficientStatistics
from .float_ledger import FloatLedger
from .multiset_hash import MultisetHash
from .quantization import QMAX, Quantizer, l2_normalize, quantize_targets, with_intercept
from .retrain import centralized_retrain, one_hot, retrain_deviation
from .smw_tracker import SMWTracker
from .solve import cholesky_factor, posterior_inverse, regularized_gram, solve_head
from .tracked_head import TrackedHead, UpdateReport
from .tracker_checks import DowndateCheck, relative_deviation

__all__ = [
    "QMAX", "Quantizer", "QuantizationError", "l2_normalize", "with_intercept", "quantize_targets",
    "ExactLedger", "SufficientStatistics", "FloatLedger", "LedgerError", "NonMemberDelete", "OverflowBudgetError",
    "MultisetHash",
    "solve_head", "cholesky_factor", "posterior_inverse", "regularized_gram",
    "SMWTracker", "CholeskyTracker", "DowndateCheck", "TrackedHead", "UpdateReport",
    "relative_deviation", "retrain_deviation", "centralized_retrain", "one_hot",
    "posterior_covariance", "predictive_variance", "predictive_variance_cholesky", "kl_matrix_normal",
]
