"""``unlearn verify``: replay a head's deltas through the pure exact ledger and certify the live head.

docs/verifier.md has the full story. The package, by concept:

- ``reading``: what is read (the shared ``runtime.topic_reader``), which head update is live.
- ``export``: the ``ULDX`` export file (``unlearn export-deltas``, ``verify --deltas-file``): deltas,
  head updates and receipts.
- ``replay``: the log-order replay with the live ledger's own rules (``streams/ledger/delta_rules.py``).
- ``orders``: the add-before-delete DAG, shuffled orders, partitionings, the retained rows.
- ``evidence``: the replay's ``Evidence`` of one head, what every check looks at.
- ``checks``: one function per check on the ``Evidence``, and ``run_checks`` in the certificate's order.
- ``live_head_checks``: the checks of the published head (live digest, retained hash, canonical head).
- ``certificate``: ``Check`` and ``Certificate`` (``unlearn.verify/v1``).
- ``certify``: ``verify`` (pure, records in memory), ``verify_broker``, ``verify_head``, ``verify_file``.
- ``cli``: ``verify_main``, ``export_deltas_main``.
- ``errors``: ``VerifyError``, "could not run" as opposed to a failed check.

Records are ``unlearn.runtime.topic_reader.LogRecord``.
"""

from __future__ import annotations

from .certificate import CERTIFICATE_SCHEMA, Certificate, Check
from .certify import verify, verify_broker, verify_file, verify_head
from .cli import export_deltas_main, verify_main
from .errors import VerifyError
from .export import EXPORT_MAGIC, Export, export_deltas, read_export, write_export
from .reading import read_head_updates
from .replay import replay_log

__all__ = [
    "CERTIFICATE_SCHEMA",
    "EXPORT_MAGIC",
    "Certificate",
    "Check",
    "Export",
    "VerifyError",
    "export_deltas",
    "export_deltas_main",
    "read_export",
    "read_head_updates",
    "replay_log",
    "verify",
    "verify_broker",
    "verify_file",
    "verify_head",
    "verify_main",
    "write_export",
]
