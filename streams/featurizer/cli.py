"""``unlearn featurizer``: the command-line shell around ``FeaturizerService`` (service.py).

Parses the options, sets up logging and signals, checks what restarting would not fix (bad
arguments, missing topics, an unavailable device: exit 2) and runs the service until SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from unlearn.infra import tracing
from unlearn.infra.cli_args import add_worker_args, cli_exit_code, log_ready, settings_from_args, setup_logging
from unlearn.infra.settings import ErasureSettings, HeadSettings, MetricsSettings
from unlearn.runtime.heap import freeze_heap
from unlearn.runtime.log_position import StaleStateError
from unlearn.streams.featurizer.add_encoding import RegistryEncoder
from unlearn.streams.featurizer.service import FeaturizerService
from unlearn.streams.featurizer.settings import FeaturizerSettings

log = logging.getLogger("unlearn.featurizer")

def build_parser() -> argparse.ArgumentParser:
    """The ``unlearn featurizer`` options: the shared worker options (``add_worker_args``) plus the
    featurizer's own."""
    parser = argparse.ArgumentParser(prog="unlearn featurizer", description=(__doc__ or "").splitlines()[0])
    add_worker_args(parser, HeadSettings, FeaturizerSettings, ErasureSettings, MetricsSettings)
    parser.add_argument("--group", help="consumer group (default: <prefix>featurizer[.<client-id>])")
    parser.add_argument("--federated", action="store_true",
                        help="data-owner site: send only packed exact statistics per micro-batch")
    parser.add_argument("--client-id", help="federated: the one client id this site serves")
    parser.add_argument("--requests-topic", help="full topic name to read (default: <prefix>requests)")
    parser.add_argument("--max-batch", type=int, help="events per micro-batch (default: UNLEARN_BATCH_MAX_EVENTS)")
    parser.add_argument("--max-ms", type=int, help="micro-batch time bound (default: UNLEARN_BATCH_MAX_MS)")
    parser.add_argument("--device", help="auto | cpu | cuda[:N] (default: UNLEARN_DEVICE)")
    parser.add_argument("--metrics-port", type=int,
                        help="serve Prometheus /metrics on this port (default: UNLEARN_METRICS_PORT; -1: off)")
    return parser


def featurizer_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn featurizer``: run until SIGINT/SIGTERM, then finish the current batch and exit 0.
    Exit 2 for bad arguments, missing topics or an unavailable device (restarting will not help);
    exit 1 for a fatal error at run time (restarting resumes from the cache)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return cli_exit_code(exc)
    setup_logging(args.loglevel)
    stop = threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        # Installed before the startup checks, so a stop request at any point ends cleanly.
        def _on_signal(signum: int, _frame: object) -> None:
            log.info("signal %d: finishing the current batch", signum)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, _on_signal)
    try:
        return _run_cli(args, stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run_cli(args: argparse.Namespace, stop: threading.Event) -> int:
    try:
        settings = settings_from_args(args, device=args.device, metrics_port=args.metrics_port)
    except ValueError as exc:
        return cli_exit_code(exc)
    tracing.configure_from_env("unlearn-featurizer")
    try:
        service = FeaturizerService(settings, group=args.group, federated=args.federated, client_id=args.client_id,
                                    requests_topic=args.requests_topic, max_batch=args.max_batch,
                                    max_ms=args.max_ms, device=args.device)
        if service.device not in ("auto", "cpu"):
            from unlearn.features.backbones import resolve_device

            resolve_device(service.device)  # fail now, not on the first text/image request
        from unlearn.runtime.topics import wait_for_topics

        # Never subscribe to a missing topic: tansu would auto-create it with 4 partitions.
        c = service.config
        wait_for_topics(settings, [c.requests_topic, c.deltas_topic, c.deadletter_topic, c.receipts_topic,
                                   c.registry_topic,
                                   *([service.topics.changelog] if service.topics.changelog else [])])
    except Exception as exc:  # bad arguments, missing topics, no CUDA: exit 2, a restart will not help
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if stop.is_set():
        return 0
    def on_ready() -> None:
        log_ready("featurizer", group=service.group, requests_topic=service.topics.requests,
                  routed_topic=service.topics.by_head, data_dir=str(settings.data_dir))
        freeze_heap()  # this process's long-lived heap: out of the collector's full passes

    service.on_ready = on_ready
    if isinstance(service.encoder, RegistryEncoder):
        service.encoder.on_load = freeze_heap  # a backbone (torch) is most of a heap
    metrics = MetricsSettings.of(settings)
    if metrics.metrics_port >= 0:
        try:  # before run: the consumer it makes feeds the lag gauges
            service.metrics.serve(metrics.metrics_port, metrics.metrics_host)
        except OSError as exc:
            print(f"error: cannot serve /metrics on {metrics.metrics_host}:{metrics.metrics_port}: {exc}",
                  file=sys.stderr)
            return 2
    try:
        return service.run(stop)
    except StaleStateError as exc:  # a restart would not help: the operator must decide
        log.error("featurizer stopped: %s", exc)
        return 2
    except Exception as exc:  # fatal: report and exit non-zero (a restart resumes from the cache)
        log.error("featurizer failed: %s", exc, exc_info=True)
        return 1
    finally:
        service.metrics.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(featurizer_main())
