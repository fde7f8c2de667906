"""The verifier's own error: the verification could not run, as opposed to a failed check."""

from __future__ import annotations


class VerifyError(RuntimeError):
    """The verification could not run (no such topic, unreadable file, ...): not a failed check."""
