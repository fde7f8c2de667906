"""``unlearn serve``: run the serving app until SIGTERM/SIGINT.

Takes the options every long-running command shares (``unlearn.infra.cli_args``) plus
``--host``/``--port``, and logs the one readiness line (``unlearn serve ready url=... heads_topic=...``)
once the socket listens: operators, the demo and the tests wait for it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Sequence

from aiohttp import web

from unlearn.common.families import heads_family
from unlearn.infra.cli_args import add_worker_args, cli_exit_code, log_ready, settings_from_args, setup_logging
from unlearn.infra.settings import HeadSettings
from unlearn.runtime.heap import freeze_heap
from unlearn.services.serving.http import build_app, listen
from unlearn.services.serving.settings import ServeSettings

__all__ = ["run_app", "serve_app", "serve_main"]

log = logging.getLogger("unlearn.serve")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="unlearn serve", description="HTTP predictions from the latest heads.")
    add_worker_args(ap, HeadSettings, ServeSettings)
    ap.add_argument("--port", type=int, help="listen port (default: UNLEARN_SERVE_PORT; 0: a free one)")
    ap.add_argument("--host", help="listen address (default: UNLEARN_SERVE_HOST)")
    return ap


async def serve_app(make_app: Callable[[], web.Application], host: str, port: int,
                    ready: Callable[[int], object]) -> None:
    """Listen on host:port, call ``ready(bound port)``, wait for SIGTERM/SIGINT, then clean up
    (the runner's cleanup stops what the app started: the heads follower, the model pool)."""
    stop = asyncio.Event()
    got: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        got.append(sig.name)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        runner, bound = await listen(make_app(), host, port)
        try:
            ready(bound)
            await stop.wait()
            log.info("stopping (%s)", got[0])
        finally:
            await runner.cleanup()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def run_app(make_app: Callable[[], web.Application], host: str, port: int, ready: Callable[[int], object]) -> int:
    """``serve_app`` until a signal (exit 0), or 1 when the address cannot be bound (``unlearn
    serve`` and ``unlearn audit``)."""
    try:
        asyncio.run(serve_app(make_app, host, port, ready))
    except OSError as exc:
        print(f"error: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    return 0


def serve_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn serve [--bootstrap B] [--port P] [--host H] [--prefix P] ...``: serve until SIGTERM/SIGINT
    (exit 0); 2 for bad options or settings, 1 if the address cannot be bound."""
    ap = _parser()
    try:
        args = ap.parse_args(argv)
        settings = settings_from_args(args, serve_port=args.port, serve_host=args.host)
    except (SystemExit, ValueError) as exc:
        return cli_exit_code(exc)
    setup_logging(args.loglevel)
    serve = ServeSettings.of(settings)

    def ready(port: int) -> None:
        log_ready("serve", url=f"http://{serve.serve_host}:{port}",
                  heads_topics=heads_family(settings.topic_prefix).pattern)
        freeze_heap()  # a prediction never waits for a full collection of what was loaded to start

    return run_app(lambda: build_app(settings), serve.serve_host, serve.serve_port, ready)
