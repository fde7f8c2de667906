"""Serving over HTTP: the aiohttp app, its handlers and an in-process server.

Endpoints (``openapi.json`` next to this module is their document, served at
``GET /openapi.json``; docs/serving.md): ``POST /v1/heads/{head}/predict``, ``GET /v1/heads/{head}``,
``GET /v1/heads``, ``GET /healthz``, ``GET /metrics``, and the Open Inference Protocol v2 under
``/v2`` (module ``oip``). Every handler reads the served head ONCE from
the store and answers from that reference only, so a response never mixes two head versions.
The store is filled by ``heads_follower``; the metrics are ``metrics``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Any

import orjson
from aiohttp import web

from unlearn.common.registry import ContractSource, RegistryView, contract_at
from unlearn.infra.settings import Settings
from unlearn.schemas.head import head_to_json
from unlearn.services.serving.heads_follower import HeadsFollower
from unlearn.services.serving.metrics import Metrics
from unlearn.services.serving.oip import OipState, add_oip_routes
from unlearn.services.serving.openapi import openapi_document
from unlearn.services.serving.predict import (
    MAX_TOP_K,
    HeadStore,
    PredictError,
    parse_predict_body,
    predict,
    prepare_inputs,
)
from unlearn.services.serving.settings import ServeSettings

__all__ = [
    "ServingServer",
    "build_app",
    "follower_of",
    "listen",
    "metrics_of",
    "store_of",
]

log = logging.getLogger("unlearn.serving")


#: Largest accepted request body (a batch of images).
MAX_BODY_BYTES = 64 * 1024 * 1024


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), status=status,
                        content_type="application/json")


def _error(status: int, reason: str, detail: str) -> web.Response:
    return _json({"error": reason, "detail": detail}, status)


_SETTINGS = web.AppKey("settings", Settings)
_STORE = web.AppKey("store", HeadStore)
_METRICS = web.AppKey("metrics", Metrics)
_FOLLOWER: web.AppKey[HeadsFollower | None] = web.AppKey("follower")
_POOL = web.AppKey("pool", concurrent.futures.ThreadPoolExecutor)
_CONTRACTS: web.AppKey[ContractSource] = web.AppKey("contracts")
_STARTED = web.AppKey("started", float)


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own refusals (a body over MAX_BODY_BYTES: 413; an unknown path: 404; another
    method: 405) in the document's ``Error`` shape, so every response is JSON the contract names."""
    try:
        resp: web.StreamResponse = await handler(request)
        return resp
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        out = _error(exc.status, (exc.reason or "error").lower().replace(" ", "_"), exc.text or exc.reason or "")
        for name in ("Allow",):
            if name in exc.headers:
                out.headers[name] = exc.headers[name]
        return out


@web.middleware
async def _observe(request: web.Request, handler: Any) -> web.StreamResponse:
    """Count and time every request, labelled by route template (not by head id)."""
    t0 = time.perf_counter()
    status = 500
    try:
        resp: web.StreamResponse = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        info = request.match_info.route.resource
        route = info.canonical if info is not None else "other"
        request.app[_METRICS].observe(route, request.method, status, time.perf_counter() - t0)


#: The query parameters each route takes, and the values it accepts (openapi.json says the same).
_WEIGHTS_VALUES = ("1", "true", "yes")


def _query_error(request: web.Request, allowed: tuple[str, ...]) -> web.Response | None:
    """400 ``bad_query`` for a parameter a route does not take or one given twice; None if fine."""
    for name in request.query:
        if name not in allowed:
            return _error(400, "bad_query", f"unknown query parameter {name!r} (this route takes {list(allowed)})")
        if len(request.query.getall(name)) > 1:
            return _error(400, "bad_query", f"query parameter {name!r} given more than once")
    return None


def _top_k(request: web.Request) -> int | web.Response:
    """The ``top_k`` query parameter of a predict request: an integer 1..MAX_TOP_K (default 1)."""
    raw = request.query.get("top_k")
    if raw is None:
        return 1
    # the length first: int() of thousands of digits raises (Python's int-from-str limit)
    if not (len(raw) <= 6 and raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_TOP_K):
        return _error(400, "bad_query", f"top_k must be an integer in 1..{MAX_TOP_K}, got {raw[:40]!r}")
    return int(raw)


async def _predict(request: web.Request) -> web.Response:
    settings = request.app[_SETTINGS]
    head_id = request.match_info["head"]
    bad = _query_error(request, ("top_k",))
    if bad is not None:
        return bad
    top_k = _top_k(request)
    if isinstance(top_k, web.Response):
        return top_k
    head = request.app[_STORE].get(head_id)  # the ONE reference this request uses
    if head is None:
        return _error(404, "unknown_head", f"no head {head_id!r} has been published (yet)")
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return _error(400, "not_json", f"body is not JSON: {exc}")
    try:
        kind, items, batched = parse_predict_body(body)
        # the contract the head update names (it was built under it), not whatever is latest
        contract = contract_at(request.app[_CONTRACTS], head_id, head.update.contract_version)
        if kind == "features":
            X = prepare_inputs(settings, head, kind, items, contract)
        else:  # a model forward: off the event loop
            loop = asyncio.get_running_loop()
            X = await loop.run_in_executor(request.app[_POOL], prepare_inputs, settings, head, kind, items, contract)
    except PredictError as exc:
        return _error(exc.status, exc.reason, exc.detail)
    out = predict(head, X, ServeSettings.of(settings).serve_sigma2, top_k)
    out["batched"] = batched
    out["contract_version"] = contract.version if contract is not None else None
    return _json(out)


async def _head(request: web.Request) -> web.Response:
    head_id = request.match_info["head"]
    bad = _query_error(request, ("weights",))
    if bad is not None:
        return bad
    weights = request.query.get("weights")
    if weights is not None and weights not in _WEIGHTS_VALUES:
        return _error(400, "bad_query", f"weights must be one of {list(_WEIGHTS_VALUES)}, got {weights[:40]!r}")
    head = request.app[_STORE].get(head_id)
    if head is None:
        return _error(404, "unknown_head", f"no head {head_id!r} has been published (yet)")
    out = head.summary()
    if weights is not None:
        out["weights"] = head_to_json(head.update)["weights"]
    return _json(out)


async def _heads(request: web.Request) -> web.Response:
    bad = _query_error(request, ())
    if bad is not None:
        return bad
    now = time.time()
    return _json({"heads": [h.summary(now) for _, h in sorted(request.app[_STORE].all().items())]})


async def _healthz(request: web.Request) -> web.Response:
    f = request.app[_FOLLOWER]
    store = request.app[_STORE]
    if f is None:
        return _json({"status": "ok", "consumer": None, "heads": len(store)})
    running = f.running
    body = {
        "status": "ok" if running else "error",
        "ready": f.caught_up.is_set(),
        "heads": len(store),
        "consumer": {"running": running, "topic": f.topic.pattern, "caught_up": f.caught_up.is_set(),
                     "lag": sum(f.lag().values()), "error": f.error},
        "uptime_seconds": time.monotonic() - request.app[_STARTED],
    }
    return _json(body, 200 if running else 503)


async def _metrics(request: web.Request) -> web.Response:
    metrics = request.app[_METRICS]
    return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type,
                                                        "X-Content-Type-Options": "nosniff"})


async def _openapi(request: web.Request) -> web.Response:
    return web.Response(body=openapi_document(), content_type="application/json")


def build_app(settings: Settings, *, store: HeadStore | None = None, follow: bool = True,
              contracts: ContractSource | None = None) -> web.Application:
    """The aiohttp application, with its own store, metrics registry, followers and model pool.

    ``follow=False`` serves ``store`` without reading the broker (tests, offline use); the head
    contracts then come from ``contracts`` (none: every head falls back to the settings).
    With ``follow=True`` they come from the head registry, followed like the heads.
    """
    app = web.Application(middlewares=[_observe, _json_errors], client_max_size=MAX_BODY_BYTES)
    st = store if store is not None else HeadStore()
    metrics = Metrics()
    follower = HeadsFollower(settings, st, metrics) if follow else None
    registry = RegistryView(settings) if follow else None
    metrics.watch(st, follower)
    app[_SETTINGS] = settings
    app[_STORE] = st
    app[_METRICS] = metrics
    app[_FOLLOWER] = follower
    app[_CONTRACTS] = registry if registry is not None else (contracts or {})
    # One thread: backbones are not re-entrant, and a model forward already uses every core.
    app[_POOL] = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="unlearn-backbone")
    app[_STARTED] = time.monotonic()

    async def on_startup(app: web.Application) -> None:
        if follower is not None:
            follower.start()
        if registry is not None:
            registry.start()

    async def on_cleanup(app: web.Application) -> None:
        if follower is not None:
            await asyncio.get_running_loop().run_in_executor(None, follower.stop)
        if registry is not None:
            await asyncio.get_running_loop().run_in_executor(None, registry.stop)
        app[_POOL].shutdown(wait=False, cancel_futures=True)

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/heads/{head}/predict", _predict)
    app.router.add_get("/v1/heads/{head}", _head)
    app.router.add_get("/v1/heads", _heads)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/openapi.json", _openapi)
    add_oip_routes(app, OipState(settings, st, app[_CONTRACTS], app[_POOL],
                                 ready=lambda: follower is None or follower.caught_up.is_set()))
    return app


def store_of(app: web.Application) -> HeadStore:
    """The store ``app`` serves from."""
    return app[_STORE]


def follower_of(app: web.Application) -> HeadsFollower | None:
    """The heads follower of ``app`` (None when built with ``follow=False``)."""
    return app[_FOLLOWER]


def metrics_of(app: web.Application) -> Metrics:
    """The metrics (and registry) of ``app``."""
    return app[_METRICS]


async def listen(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start ``app`` on host:port (0: a free port) without signal handling; returns the runner
    (``cleanup()`` it to stop) and the bound port, so callers can announce the real address."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return runner, int(addr[1])
    return runner, port


class ServingServer:
    """The serving app on a background thread with its own event loop (tests, the demo).

    ``port=0`` picks a free port; ``url`` is ``http://host:port`` once ``start()`` returned.
    """

    def __init__(self, settings: Settings, host: str = "127.0.0.1", port: int = 0, *, follow: bool = True,
                 store: HeadStore | None = None, contracts: ContractSource | None = None) -> None:
        self.settings = settings
        self.host = host
        self.port = port
        self.app = build_app(settings, store=store, follow=follow, contracts=contracts)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def store(self) -> HeadStore:
        return self.app[_STORE]

    @property
    def follower(self) -> HeadsFollower | None:
        return self.app[_FOLLOWER]

    @property
    def metrics(self) -> Metrics:
        return self.app[_METRICS]

    def start(self, timeout: float = 10.0) -> ServingServer:
        """Listen on a background thread; raises if it does not within ``timeout``."""

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                self._runner, self.port = loop.run_until_complete(listen(self.app, self.host, self.port))
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                loop.close()
                return
            self._ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="unlearn-serving", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"serving did not start within {timeout}s")
        if self._error is not None:
            raise RuntimeError(f"serving failed to start: {self._error}") from self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop, then clean up (stops the follower) on its thread."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> ServingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
