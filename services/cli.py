"""``unlearn``: one entry point for every service and tool. Subcommands import lazily so that
`unlearn head` does not pay for torch, and `unlearn broker` does not pay for numpy."""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import sys
from collections.abc import Callable

USAGE = """usage: unlearn <command> [options]   (unlearn <command> --help for its options)

services
  broker          run a local broker: tansu, or --engine kafka (prints bootstrap=127.0.0.1:PORT)
  topics          create/list the topics (unlearn topics create --bootstrap B)
  featurizer      requests -> exact deltas (backbones, feature cache, deadletters)
  ledger          deltas -> exact ledger per head -> heads, receipts (consumer-group worker)
  serve           HTTP predictions from the latest heads
tools
  head            print the latest head of a head id
  heads           declare heads: create | extend (grow the classes) | show | list (head registry)
  clients         signing clients: keygen | create | add-key | revoke | show | list (client registry)
  acls            the broker ACL matrix: docs | commands (kafka-acls.sh lines)
  kafka-init      SCRAM users and the ACL matrix on a secured Kafka (infra/kafka/init.sh)
  certs           TLS certificates of the secured Kafka: a throwaway CA, or yours checked
  add | delete | delete-subject   produce request events (optionally --wait for the receipt)
  verify          replay a head's deltas in shuffled orders/partitions and certify it
  export-deltas   write a head's deltas to a file (verify --deltas-file works offline)
  erasure-report  check that none of a subject's data can still be read (docs/erasure.md)
  audit           read-only web pages: a subject's data, heads, pending deletes (docs/audit.md)
  cdc             a PostgreSQL table's inserts, updates and deletes -> a head's requests (Debezium)
  demo            the whole system end to end on offline data (make demo)
"""


def _ledger_main(argv: list[str]) -> int:
    """``unlearn ledger``: the worker options every long-running command takes, plus --worker-id."""
    import argparse

    from unlearn.infra.cli_args import add_worker_args, settings_from_args, setup_logging
    from unlearn.infra.settings import ErasureSettings, HeadSettings, MetricsSettings
    from unlearn.streams.ledger.settings import LedgerSettings

    ap = argparse.ArgumentParser(prog="unlearn ledger", description="Run one ledger processor worker.")
    add_worker_args(ap, HeadSettings, LedgerSettings, ErasureSettings, MetricsSettings)
    ap.add_argument("--worker-id", default="ledger-0", help="names this worker in logs and as its Kafka client.id")
    ap.add_argument("--metrics-port", type=int,
                    help="serve Prometheus /metrics on this port (default: UNLEARN_METRICS_PORT; -1: off)")
    args = ap.parse_args(argv)
    setup_logging(args.loglevel)
    try:
        settings = settings_from_args(args, metrics_port=args.metrics_port)
    except ValueError as exc:  # no broker (CliUsageError) or invalid settings
        ap.error(str(exc))
    from unlearn.infra.worker_metrics import WorkerMetrics
    from unlearn.streams.ledger.worker import run_ledger_worker

    metrics, where = WorkerMetrics("ledger"), MetricsSettings.of(settings)
    if where.metrics_port >= 0:
        try:
            metrics.serve(where.metrics_port, where.metrics_host)
        except OSError as exc:
            ap.error(f"cannot serve /metrics on {where.metrics_host}:{where.metrics_port}: {exc}")
    try:
        return run_ledger_worker(settings, args.worker_id, args.loglevel, metrics)
    finally:
        metrics.close()


def _broker_main(argv: list[str]) -> int:
    """``unlearn broker``: a local broker until SIGINT/SIGTERM (tansu by default, or Apache Kafka);
    the address on stdout, then the readiness line in the log (stderr)."""
    import argparse

    from unlearn.infra.cli_args import add_loglevel_arg, settings_help, setup_logging
    from unlearn.infra.settings import LocalBrokerSettings

    ap = argparse.ArgumentParser(prog="unlearn broker", description="Run a local broker: tansu (default) "
                                 "or Apache Kafka in KRaft mode.")
    ap.add_argument("--engine", choices=("tansu", "kafka"), default="tansu",
                    help="tansu (default; embedded, in memory unless --data) or kafka (Apache Kafka, the jars "
                    "of `make kafka`, needs java 17+); kafka prints `node=ID pid=PID bootstrap=HOST:PORT` per node")
    ap.add_argument("--port", type=int, help="client port (kafka: node i listens on PORT+i-1)")
    ap.add_argument("--data", metavar="DIR",
                    help="keep topics, messages and offsets in DIR across restarts (same --port): tansu on a "
                    "local s3rver, installed by `make s3` (needs node and npm); kafka in its own log dirs")
    ap.add_argument("--nodes", type=int, default=1,
                    help="kafka only: cluster size (3: replication factor 3, min.insync.replicas=2)")
    ap.add_argument("--secure", action="store_true",
                    help="kafka only: secured as the compose deployment's broker (SASL_SSL with SCRAM-SHA-512, "
                    "controllers over mutual TLS, no plaintext listener, no access without an ACL, super user admin "
                    "with the password in KAFKA_ADMIN_PASSWORD; prints ca=FILE, the CA clients trust); then "
                    "`bash infra/kafka/init.sh` creates the service users and ACLs (docs/security.md)")
    ap.add_argument("--tls-dir", metavar="DIR",
                    help="with --secure: your certificates (ca.pem, node-<id>.p12, keystore.password; "
                    "docs/security.md), checked, never changed; default: a throwaway CA made at start")
    add_loglevel_arg(ap)
    settings_help(ap, LocalBrokerSettings, cluster=False)
    args = ap.parse_args(argv)
    if args.engine == "tansu" and args.nodes != 1:
        ap.error("--nodes needs --engine kafka (tansu runs one broker)")
    if args.secure and args.engine != "kafka":
        ap.error("--secure needs --engine kafka (tansu has no authentication)")
    admin_password = os.environ.get("KAFKA_ADMIN_PASSWORD") if args.secure else None
    if args.secure and not admin_password:
        ap.error("--secure needs KAFKA_ADMIN_PASSWORD (the super user admin's password; never on the command line)")
    if args.tls_dir and not args.secure:
        ap.error("--tls-dir needs --secure")
    if args.nodes < 1:
        ap.error("--nodes must be >= 1")
    setup_logging(args.loglevel)
    from unlearn.infra.local.tansu import BrokerError, run_broker_forever

    try:
        if args.engine == "kafka":
            from unlearn.infra.local.engine import run_kafka_forever

            return run_kafka_forever(args.port, args.data, args.nodes, admin_password=admin_password,
                                     tls_dir=args.tls_dir)
        return run_broker_forever(args.port, args.data)
    except (BrokerError, ValueError) as exc:  # ValueError: an admin password the JAAS string cannot hold
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _lazy(module: str, func: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        import importlib

        return int(getattr(importlib.import_module(module), func)(argv) or 0)
    return run


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "broker": _broker_main,
    "topics": _lazy("unlearn.runtime.topics", "topics_main"),
    "featurizer": _lazy("unlearn.streams.featurizer.cli", "featurizer_main"),
    "ledger": _ledger_main,
    "serve": _lazy("unlearn.services.serving.cli", "serve_main"),
    "head": _lazy("unlearn.services.client.head_reader", "head_main"),
    "heads": _lazy("unlearn.services.registry.cli", "heads_main"),
    "clients": _lazy("unlearn.services.registry.clients_cli", "clients_main"),
    "acls": _lazy("unlearn.infra.acl_matrix", "acls_main"),
    "kafka-init": _lazy("unlearn.infra.kafka_init", "kafka_init_main"),
    "certs": _lazy("unlearn.infra.certificates", "certs_main"),
    "add": _lazy("unlearn.services.client.cli", "add_main"),
    "delete": _lazy("unlearn.services.client.cli", "delete_main"),
    "delete-subject": _lazy("unlearn.services.client.cli", "delete_subject_main"),
    "verify": _lazy("unlearn.services.verifier.cli", "verify_main"),
    "export-deltas": _lazy("unlearn.services.verifier.cli", "export_deltas_main"),
    "erasure-report": _lazy("unlearn.services.erasure.report", "erasure_report_main"),
    "audit": _lazy("unlearn.services.audit.cli", "audit_main"),
    "cdc": _lazy("unlearn.services.cdc.cli", "cdc_main"),
    "demo": _lazy("unlearn.services.demo.driver", "demo_main"),
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd = COMMANDS.get(args[0])
    if cmd is None:
        print(f"unlearn: unknown command {args[0]!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    # A crash inside a C extension (librdkafka, torch) prints every thread's Python stack to the
    # log instead of dying silently with -11: the one clue an operator has. (Called in-process
    # with a captured stderr, as tests do, there is no file descriptor to write to: skipped.)
    if not faulthandler.is_enabled():
        with contextlib.suppress(io.UnsupportedOperation, AttributeError, ValueError):
            faulthandler.enable()
    from unlearn.infra.settings import unknown_variables

    for line in unknown_variables(os.environ):  # a warning: the environment may be shared with other tools
        print(f"unlearn: warning: {line}", file=sys.stderr)
    try:
        return cmd(args[1:])
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
