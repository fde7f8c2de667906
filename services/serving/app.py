"""``unlearn serve``: HTTP predictions from the latest published heads (aiohttp).

A background thread follows ``<prefix>heads`` from the beginning (the topic is compacted on
Kafka; tansu never compacts, so the whole history is replayed and the newest update per head
wins). Every accepted update replaces ONE immutable :class:`ServedHead` reference in a dict; a
request reads that reference once and computes everything (scores, variance, version, digest)
from it, so a response can never mix two heads. An update is accepted only if its
(version, mode) is newer than what is served: a higher version wins, and at the same version an
exact head supersedes a fast one.

Inputs go through exactly the featurizer's pipeline: the head's backbone (same registry and
per-head configuration), then L2 normalization and quantization with Settings.frac_bits
(``services.featurize_core.quantize_feature_row``), then dequantization -- so a served input is
the very feature vector a training sample with that input would have contributed.

Endpoints (OpenAPI document at ``GET /openapi.json``; docs/serving.md):
``POST /v1/heads/{head}/predict``, ``GET /v1/heads/{head}``, ``GET /v1/heads``, ``GET /healthz``,
``GET /metrics`` (Prometheus text format, written by hand: no extra dependency).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import bisect
import concurrent.futures
import logging
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from unlearn.infra.cli_args import add_broker_args, cli_exit_code, settings_from_args
from unlearn.infra.settings import Settings
from unlearn.schemas.head_codec import CodecError, HeadUpdate, decode_head, head_to_json

__all__ = [
    "HeadStore",
    "HeadsFollower",
    "Metrics",
    "PredictError",
    "ServedHead",
    "ServingServer",
    "build_app",
    "openapi_spec",
    "prepare_inputs",
    "predict",
    "serve_main",
]

log = logging.getLogger("unlearn.serving")

_MODE_RANK = {"fast": 0, "exact": 1}


# --------------------------------------------------------------------------- the served heads
@dataclass(frozen=True, eq=False)
class ServedHead:
    """One immutable served state of a head: the update and the posterior used for variance.

    ``posterior`` is the update's own T when it carries one, else the T of the last exact update
    of this head that carried one (``posterior_version`` says which; None when never seen).
    """

    update: HeadUpdate
    received_at: float  # wall clock when this update was accepted
    posterior: np.ndarray | None
    posterior_version: int | None
    posterior_digest: str | None

    @property
    def key(self) -> tuple[int, int]:
        return (self.update.version, _MODE_RANK[self.update.mode])

    @property
    def posterior_source(self) -> str | None:
        """"current_head" | "last_exact_head" | None."""
        if self.posterior is None:
            return None
        return "current_head" if self.update.posterior is not None else "last_exact_head"

    def summary(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        u = self.update
        return {
            "head_id": u.head_id,
            "version": u.version,
            "mode": u.mode,
            "digest": u.digest,
            "n_retained": u.n_retained,
            "events_covered": u.events_covered,
            "d": u.d,
            "c": u.c,
            "gamma": u.gamma,
            "drift": u.drift,
            "offsets": [[p, o] for p, o in u.offsets],
            "created_ts": u.created_ts,
            "age_seconds": max(0.0, now - u.created_ts),
            "received_age_seconds": max(0.0, now - self.received_at),
            "has_posterior": u.posterior is not None,
            "posterior_version": self.posterior_version,
        }


class HeadStore:
    """head id -> current :class:`ServedHead`. Writers (the follower) serialize on a lock;
    readers take one reference with ``get`` (a dict read: atomic) and never lock."""

    def __init__(self) -> None:
        self._heads: dict[str, ServedHead] = {}
        self._lock = threading.Lock()

    def offer(self, update: HeadUpdate, now: float | None = None) -> str:
        """Serve ``update`` if it is newer than the current head: returns "accepted" or "stale"."""
        if update.mode not in _MODE_RANK:  # pragma: no cover - the codec already checks
            return "stale"
        now = time.time() if now is None else now
        with self._lock:
            cur = self._heads.get(update.head_id)
            if cur is not None and (update.version, _MODE_RANK[update.mode]) <= cur.key:
                return "stale"
            if update.posterior is not None:
                post, pv, pd = update.posterior, update.version, update.digest
            elif cur is not None and cur.posterior is not None and cur.posterior.shape[0] == update.d:
                post, pv, pd = cur.posterior, cur.posterior_version, cur.posterior_digest
            else:
                post, pv, pd = None, None, None
            # One reference replaced: a reader holds either the old or the new object, never a mix.
            self._heads[update.head_id] = ServedHead(update, now, post, pv, pd)
            return "accepted"

    def get(self, head_id: str) -> ServedHead | None:
        return self._heads.get(head_id)

    def all(self) -> dict[str, ServedHead]:
        return dict(self._heads)

    def __len__(self) -> int:
        return len(self._heads)


# --------------------------------------------------------------------------- metrics
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """Counters, a latency histogram and gauges, rendered in the Prometheus text format 0.0.4."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = {}
        self.latency: dict[str, list[float]] = {}  # route -> bucket counts + [sum, count]
        self.head_updates: dict[str, int] = {"accepted": 0, "stale": 0, "invalid": 0}
        self.lag: dict[int, int] = {}
        self.predictions = 0

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        with self._lock:
            k = (route, method, status)
            self.requests[k] = self.requests.get(k, 0) + 1
            h = self.latency.setdefault(route, [0.0] * (len(_BUCKETS) + 2))
            i = bisect.bisect_left(_BUCKETS, seconds)
            if i < len(_BUCKETS):
                h[i] += 1
            h[-2] += seconds
            h[-1] += 1

    def head_update(self, result: str) -> None:
        with self._lock:
            self.head_updates[result] = self.head_updates.get(result, 0) + 1

    def set_lag(self, lag: dict[int, int]) -> None:
        with self._lock:
            self.lag = dict(lag)

    def render(self, store: HeadStore, follower: "HeadsFollower | None") -> str:
        now = time.time()
        out: list[str] = []
        add = out.append
        with self._lock:
            add("# HELP unlearn_serving_requests_total HTTP requests by route, method and status.")
            add("# TYPE unlearn_serving_requests_total counter")
            for (route, method, status), n in sorted(self.requests.items()):
                add(f'unlearn_serving_requests_total{{route="{_esc(route)}",method="{method}",status="{status}"}} {n}')
            add("# HELP unlearn_serving_request_duration_seconds HTTP request latency.")
            add("# TYPE unlearn_serving_request_duration_seconds histogram")
            for route, h in sorted(self.latency.items()):
                cum = 0.0
                r = _esc(route)
                for b, n in zip(_BUCKETS, h):
                    cum += n
                    add(f'unlearn_serving_request_duration_seconds_bucket{{route="{r}",le="{b}"}} {int(cum)}')
                add(f'unlearn_serving_request_duration_seconds_bucket{{route="{r}",le="+Inf"}} {int(h[-1])}')
                add(f'unlearn_serving_request_duration_seconds_sum{{route="{r}"}} {h[-2]!r}')
                add(f'unlearn_serving_request_duration_seconds_count{{route="{r}"}} {int(h[-1])}')
            add("# HELP unlearn_serving_head_updates_total Head updates read from the heads topic, by outcome.")
            add("# TYPE unlearn_serving_head_updates_total counter")
            for result, n in sorted(self.head_updates.items()):
                add(f'unlearn_serving_head_updates_total{{result="{result}"}} {n}')
            add("# HELP unlearn_serving_consumer_lag Messages of the heads topic not yet read, per partition.")
            add("# TYPE unlearn_serving_consumer_lag gauge")
            for p, n in sorted(self.lag.items()):
                add(f'unlearn_serving_consumer_lag{{partition="{p}"}} {n}')
            add("# HELP unlearn_serving_consumer_lag_total Messages of the heads topic not yet read.")
            add("# TYPE unlearn_serving_consumer_lag_total gauge")
            add(f"unlearn_serving_consumer_lag_total {sum(self.lag.values())}")
        heads = store.all()
        add("# HELP unlearn_serving_heads Heads being served.")
        add("# TYPE unlearn_serving_heads gauge")
        add(f"unlearn_serving_heads {len(heads)}")
        add("# HELP unlearn_serving_head_version Version of the served head.")
        add("# TYPE unlearn_serving_head_version gauge")
        for hid, sh in sorted(heads.items()):
            add(f'unlearn_serving_head_version{{head="{_esc(hid)}",mode="{sh.update.mode}"}} {sh.update.version}')
        add("# HELP unlearn_serving_head_n_retained Retained samples behind the served head.")
        add("# TYPE unlearn_serving_head_n_retained gauge")
        for hid, sh in sorted(heads.items()):
            add(f'unlearn_serving_head_n_retained{{head="{_esc(hid)}"}} {sh.update.n_retained}')
        add("# HELP unlearn_serving_head_age_seconds Seconds since the served head was published.")
        add("# TYPE unlearn_serving_head_age_seconds gauge")
        for hid, sh in sorted(heads.items()):
            add(f'unlearn_serving_head_age_seconds{{head="{_esc(hid)}"}} {max(0.0, now - sh.update.created_ts):.3f}')
        up = 1 if (follower is not None and follower.running) else 0
        add("# HELP unlearn_serving_consumer_up 1 while the heads consumer thread runs.")
        add("# TYPE unlearn_serving_consumer_up gauge")
        add(f"unlearn_serving_consumer_up {up}")
        return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- heads consumer
class HeadsFollower:
    """Daemon thread: reads ``<prefix>heads`` from the beginning and offers every update to the
    store. ``caught_up`` turns true once every partition reached its end at least once."""

    def __init__(self, settings: Settings, store: HeadStore, metrics: Metrics | None = None,
                 poll_interval: float = 0.1) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics or Metrics()
        self.topic = settings.topic("heads")
        self.poll_interval = poll_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.caught_up = threading.Event()
        self.error: str | None = None
        self.partitions: list[int] = []

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> "HeadsFollower":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="unlearn-heads-follower", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        from unlearn.infra.profiles import consumer_config

        c = Consumer(consumer_config(
            self.settings, f"{self.settings.topic_prefix}serving-{uuid.uuid4().hex}",
            **{"enable.partition.eof": True},
        ))
        try:
            while not self._stop.is_set():  # wait for the topic (serve may start before `topics create`)
                try:
                    md = c.list_topics(timeout=5.0)  # whole metadata: naming a topic auto-creates it on tansu
                    t = md.topics.get(self.topic)
                    if t is not None and t.error is None and t.partitions:
                        self.partitions = sorted(t.partitions)
                        break
                    self.error = f"topic {self.topic} does not exist yet"
                except Exception as exc:  # broker unreachable: keep trying
                    self.error = f"metadata: {exc}"
                self._stop.wait(1.0)
            if self._stop.is_set():
                return
            self.error = None
            tps = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in self.partitions]
            c.assign(tps)
            at_end: set[int] = set()
            last_lag = 0.0
            while not self._stop.is_set():
                for m in c.consume(num_messages=256, timeout=self.poll_interval):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            at_end.add(m.partition())
                            if len(at_end) == len(self.partitions):
                                self.caught_up.set()
                        else:
                            log.warning("heads consumer: %s", err)
                        continue
                    self._offer(m)
                now = time.monotonic()
                if now - last_lag >= 0.5:
                    last_lag = now
                    self._update_lag(c, TopicPartition)
        except Exception as exc:  # pragma: no cover - reported by /healthz
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("heads follower stopped")
        finally:
            c.close()

    def _offer(self, m: Any) -> None:
        value = m.value()
        if value is None:  # a tombstone: nothing to serve
            return
        try:
            u = decode_head(value)
        except CodecError as exc:
            self.metrics.head_update("invalid")
            log.warning("undecodable head update at %s/%d@%d: %s", m.topic(), m.partition(), m.offset(), exc)
            return
        result = self.store.offer(u)
        self.metrics.head_update(result)
        if result == "accepted":
            log.debug("head %s now version %d (%s)", u.head_id, u.version, u.mode)

    def _update_lag(self, c: Any, TopicPartition: Any) -> None:
        lag: dict[int, int] = {}
        try:
            positions = c.position([TopicPartition(self.topic, p) for p in self.partitions])
            for tp in positions:
                # cached=True: the high watermark of the last fetch response (tansu's ListOffsets
                # is wrong after multi-record batches; fetch responses are right).
                _, hi = c.get_watermark_offsets(TopicPartition(self.topic, tp.partition), cached=True)
                if hi is not None and hi >= 0 and tp.offset >= 0:
                    lag[tp.partition] = max(0, int(hi) - int(tp.offset))
        except Exception:  # pragma: no cover - metrics only
            return
        self.metrics.set_lag(lag)


# --------------------------------------------------------------------------- predictions
class PredictError(ValueError):
    """A bad predict request: HTTP ``status`` with a machine-readable ``reason``."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.status = status
        self.reason = reason
        self.detail = detail


_KINDS = ("features", "text", "image_png")


def _as_list(v: Any, kind: str) -> tuple[list[Any], bool]:
    """(items, batched): a single input or a list of them."""
    if kind == "features":
        if isinstance(v, list) and v and all(isinstance(r, list) for r in v):
            return v, True
        return [v], False
    if isinstance(v, list):
        return v, True
    return [v], False


def _backbone_name(settings: Settings, head_id: str, kind: str) -> str:
    from unlearn.features.backbones import BackboneError, backbone_info
    from unlearn.streams.featurizer.core import DEFAULT_BACKBONES

    name = settings.backbone_for(head_id) or DEFAULT_BACKBONES[kind]
    try:
        info = backbone_info(name)
    except BackboneError as exc:
        raise PredictError(500, "backbone_unavailable", f"head {head_id!r}: {exc}") from None
    if info.kind != kind:
        raise PredictError(400, "backbone_mismatch",
                           f"head {head_id!r} uses backbone {name!r} ({info.kind} inputs), got a {kind} input")
    return name


def parse_predict_body(body: Any) -> tuple[str, list[Any], bool]:
    """(kind, raw items, batched) from a predict JSON body; PredictError if malformed."""
    if not isinstance(body, dict):
        raise PredictError(400, "bad_body", "the body must be a JSON object")
    given = [k for k in _KINDS if k in body]
    unknown = sorted(set(body) - set(_KINDS))
    if unknown:
        raise PredictError(400, "bad_body", f"unknown field(s) {unknown}; give one of {list(_KINDS)}")
    if len(given) != 1:
        raise PredictError(400, "bad_body", f"give exactly one of {list(_KINDS)}, got {given or 'none'}")
    kind = given[0]
    items, batched = _as_list(body[kind], kind)
    if not items:
        raise PredictError(400, "bad_body", f"{kind}: no inputs")
    if len(items) > 1024:
        raise PredictError(400, "bad_body", f"{kind}: at most 1024 inputs per request, got {len(items)}")
    for i, it in enumerate(items):
        if kind == "features":
            if (not isinstance(it, list) or not it
                    or not all(type(x) in (int, float) for x in it)):
                raise PredictError(400, "bad_features", f"input {i}: features must be a non-empty list of numbers")
        elif kind == "text":
            if not isinstance(it, str) or not it:
                raise PredictError(400, "bad_text", f"input {i}: text must be a non-empty string")
        else:
            if not isinstance(it, str):
                raise PredictError(400, "bad_base64", f"input {i}: image_png must be a base64 string")
            try:
                items[i] = base64.b64decode(it.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError) as exc:
                raise PredictError(400, "bad_base64", f"input {i}: image_png is not standard base64: {exc}") from None
    return kind, items, batched


def prepare_inputs(settings: Settings, head: ServedHead, kind: str, items: Sequence[Any]) -> np.ndarray:
    """Raw inputs -> the dequantized feature rows (n, d) the ledger would have seen for them:
    backbone (text/image; the head's configured one, as in the featurizer), L2 normalization,
    quantization with Settings.frac_bits, dequantization. Blocking (runs the model)."""
    from unlearn.ledger import Quantizer
    from unlearn.features.contract import FeatureRejected as Rejected, quantize_feature_row

    head_id = head.update.head_id
    name = _backbone_name(settings, head_id, "image" if kind == "image_png" else kind)
    if kind == "features":
        raw = [np.asarray(it, dtype=np.float64) for it in items]
    else:
        from unlearn.features.backbones import BackboneError, get_backbone

        try:
            bb = get_backbone(name, settings.device)
            feats = bb.encode(list(items))
        except BackboneError as exc:
            status = 400 if exc.index is not None else 500
            raise PredictError(status, "undecodable_input" if status == 400 else "backbone_unavailable",
                               str(exc)) from None
        except (ImportError, OSError, RuntimeError) as exc:  # package/weights missing, bad device
            raise PredictError(500, "backbone_unavailable",
                               f"cannot load backbone {name!r}: {type(exc).__name__}: {exc}") from None
        raw = [feats[i] for i in range(feats.shape[0])]
    d = head.update.d
    rows = []
    for i, f in enumerate(raw):
        if f.shape[0] != d:
            raise PredictError(400, "dimension_mismatch",
                               f"input {i}: {f.shape[0]} features, head {head_id!r} has d = {d}")
        try:
            rows.append(quantize_feature_row(f, settings.frac_bits, settings.feature_bound,
                                             settings.normalize_features))
        except Rejected as exc:
            raise PredictError(400, exc.reason, f"input {i}: {exc.detail}") from None
    return Quantizer(settings.frac_bits, settings.feature_bound).dequantize(np.stack(rows))


def predict(head: ServedHead, X: np.ndarray, sigma2: float = 1.0) -> dict[str, Any]:
    """Scores X @ W, predicted class, predictive variance sigma^2 f^T T f -- all from ``head``."""
    from unlearn.ledger.bayes import predictive_variance

    u = head.update
    W = np.asarray(u.weights)
    scores = X @ W
    var = predictive_variance(X, head.posterior, sigma2) if head.posterior is not None else None
    preds = []
    for i in range(X.shape[0]):
        row = scores[i]
        preds.append({
            "scores": row.tolist(),
            "predicted_class": int(np.argmax(row)) if row.shape[0] else None,
            "variance": float(var[i]) if var is not None else None,
        })
    src = head.posterior_source
    note = {
        "current_head": "posterior T of this head version",
        "last_exact_head": (f"this {u.mode} head (version {u.version}) carries no posterior: variance uses T "
                            f"of the last exact head of {u.head_id!r}, version {head.posterior_version}"),
        None: f"no posterior published for head {u.head_id!r} yet (exact heads carry T when "
              "UNLEARN_PUBLISH_POSTERIOR is on): variance unavailable",
    }[src]
    return {
        "head_id": u.head_id,
        "version": u.version,
        "mode": u.mode,
        "digest": u.digest,
        "n_retained": u.n_retained,
        "predictions": preds,
        "variance": {
            "available": var is not None,
            "source": src,
            "posterior_version": head.posterior_version,
            "posterior_digest": head.posterior_digest,
            "sigma2": sigma2,
            "note": note,
        },
    }


# --------------------------------------------------------------------------- HTTP
def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), status=status,
                        content_type="application/json")


def _error(status: int, reason: str, detail: str) -> web.Response:
    return _json({"error": reason, "detail": detail}, status)


_SETTINGS = web.AppKey("settings", Settings)
_STORE = web.AppKey("store", HeadStore)
_METRICS = web.AppKey("metrics", Metrics)
_FOLLOWER = web.AppKey("follower", object)
_POOL = web.AppKey("pool", object)
_STARTED = web.AppKey("started", float)


@web.middleware
async def _observe(request: web.Request, handler: Any) -> web.StreamResponse:
    t0 = time.perf_counter()
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        info = request.match_info.route.resource
        route = info.canonical if info is not None else "other"
        request.app[_METRICS].observe(route, request.method, status, time.perf_counter() - t0)


async def _predict(request: web.Request) -> web.Response:
    settings = request.app[_SETTINGS]
    head_id = request.match_info["head"]
    head = request.app[_STORE].get(head_id)  # the ONE reference this request uses
    if head is None:
        return _error(404, "unknown_head", f"no head {head_id!r} has been published (yet)")
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return _error(400, "not_json", f"body is not JSON: {exc}")
    try:
        kind, items, batched = parse_predict_body(body)
        if kind == "features":
            X = prepare_inputs(settings, head, kind, items)
        else:  # a model forward: off the event loop
            loop = asyncio.get_running_loop()
            X = await loop.run_in_executor(request.app[_POOL], prepare_inputs, settings, head, kind, items)
    except PredictError as exc:
        return _error(exc.status, exc.reason, exc.detail)
    out = predict(head, X, settings.serve_sigma2)
    out["batched"] = batched
    return _json(out)


async def _head(request: web.Request) -> web.Response:
    head_id = request.match_info["head"]
    head = request.app[_STORE].get(head_id)
    if head is None:
        return _error(404, "unknown_head", f"no head {head_id!r} has been published (yet)")
    out = head.summary()
    if request.query.get("weights") in ("1", "true", "yes"):
        out["weights"] = head_to_json(head.update)["weights"]
    return _json(out)


async def _heads(request: web.Request) -> web.Response:
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
        "consumer": {"running": running, "topic": f.topic, "caught_up": f.caught_up.is_set(),
                     "lag": sum(request.app[_METRICS].lag.values()), "error": f.error},
        "uptime_seconds": time.monotonic() - request.app[_STARTED],
    }
    return _json(body, 200 if running else 503)


async def _metrics(request: web.Request) -> web.Response:
    text = request.app[_METRICS].render(request.app[_STORE], request.app[_FOLLOWER])
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})


async def _openapi(request: web.Request) -> web.Response:
    return _json(openapi_spec())


def build_app(settings: Settings, *, store: HeadStore | None = None, follow: bool = True) -> web.Application:
    """The aiohttp application. ``follow=False`` serves ``store`` without reading the broker."""
    app = web.Application(middlewares=[_observe], client_max_size=64 * 1024 * 1024)
    st = store or HeadStore()
    metrics = Metrics()
    app[_SETTINGS] = settings
    app[_STORE] = st
    app[_METRICS] = metrics
    app[_FOLLOWER] = HeadsFollower(settings, st, metrics) if follow else None
    app[_POOL] = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="unlearn-backbone")
    app[_STARTED] = time.monotonic()

    async def on_startup(app: web.Application) -> None:
        if app[_FOLLOWER] is not None:
            app[_FOLLOWER].start()

    async def on_cleanup(app: web.Application) -> None:
        if app[_FOLLOWER] is not None:
            await asyncio.get_running_loop().run_in_executor(None, app[_FOLLOWER].stop)
        app[_POOL].shutdown(wait=False, cancel_futures=True)

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/heads/{head}/predict", _predict)
    app.router.add_get("/v1/heads/{head}", _head)
    app.router.add_get("/v1/heads", _heads)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/openapi.json", _openapi)
    return app


def store_of(app: web.Application) -> HeadStore:
    return app[_STORE]


def follower_of(app: web.Application) -> HeadsFollower | None:
    return app[_FOLLOWER]  # type: ignore[return-value]


class ServingServer:
    """The serving app on a background thread with its own event loop (tests, the demo).

    ``port=0`` picks a free port; ``url`` is ``http://host:port`` once ``start()`` returned.
    """

    def __init__(self, settings: Settings, host: str = "127.0.0.1", port: int = 0, *, follow: bool = True,
                 store: HeadStore | None = None) -> None:
        self.settings = settings
        self.host = host
        self.port = port
        self.app = build_app(settings, store=store, follow=follow)
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
        return self.app[_FOLLOWER]  # type: ignore[return-value]

    def start(self, timeout: float = 10.0) -> "ServingServer":
        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._astart())
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())  # type: ignore[union-attr]
            loop.close()

        self._thread = threading.Thread(target=run, name="unlearn-serving", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"serving did not start within {timeout}s")
        if self._error is not None:
            raise RuntimeError(f"serving failed to start: {self._error}") from self._error
        return self

    async def _astart(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> "ServingServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- OpenAPI
def openapi_spec() -> dict[str, Any]:
    """The OpenAPI 3.1 document of this service (hand-written, served at /openapi.json)."""
    err = {"$ref": "#/components/schemas/Error"}
    head_param = {"name": "head", "in": "path", "required": True, "schema": {"type": "string"},
                  "description": "Head id (the key of its messages on the heads topic)."}
    num_list = {"type": "array", "minItems": 1, "items": {"type": "number"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "unlearn serving", "version": "1",
                 "description": "Predictions from the latest published ridge heads (exact unlearning on event "
                                "streams). Heads are hot-swapped atomically per head id."},
        "paths": {
            "/v1/heads/{head}/predict": {"post": {
                "summary": "Scores, predicted class and predictive variance for one or more inputs",
                "parameters": [head_param],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "$ref": "#/components/schemas/PredictRequest"}}}},
                "responses": {
                    "200": {"description": "Predictions from ONE head version",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PredictResponse"}}}},
                    "400": {"description": "Bad input", "content": {"application/json": {"schema": err}}},
                    "404": {"description": "Unknown head", "content": {"application/json": {"schema": err}}},
                }}},
            "/v1/heads/{head}": {"get": {
                "summary": "The served version of a head",
                "parameters": [head_param, {"name": "weights", "in": "query", "required": False,
                                            "schema": {"type": "string", "enum": ["1", "true", "yes"]},
                                            "description": "Include W (d rows x c columns)."}],
                "responses": {
                    "200": {"description": "Head summary", "content": {"application/json": {"schema": {
                        "$ref": "#/components/schemas/HeadSummary"}}}},
                    "404": {"description": "Unknown head", "content": {"application/json": {"schema": err}}},
                }}},
            "/v1/heads": {"get": {"summary": "All served heads", "responses": {"200": {
                "description": "Summaries", "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"heads": {"type": "array", "items": {
                        "$ref": "#/components/schemas/HeadSummary"}}}}}}}}}},
            "/healthz": {"get": {"summary": "Liveness of the service and its heads consumer", "responses": {
                "200": {"description": "Consumer thread running (ready: caught up with the heads topic)"},
                "503": {"description": "Consumer thread stopped"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics (text format 0.0.4)", "responses": {
                "200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI"}}}},
        },
        "components": {"schemas": {
            "Error": {"type": "object", "required": ["error", "detail"], "properties": {
                "error": {"type": "string", "description": "machine-readable reason"},
                "detail": {"type": "string"}}},
            "PredictRequest": {
                "type": "object", "additionalProperties": False,
                "description": "Exactly one of features, text, image_png; a single input or a list (<= 1024).",
                "properties": {
                    "features": {"oneOf": [num_list, {"type": "array", "minItems": 1, "items": num_list}]},
                    "text": {"oneOf": [{"type": "string", "minLength": 1},
                                       {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}]},
                    "image_png": {"oneOf": [{"type": "string", "contentEncoding": "base64"},
                                            {"type": "array", "minItems": 1,
                                             "items": {"type": "string", "contentEncoding": "base64"}}]},
                },
                "minProperties": 1, "maxProperties": 1},
            "Prediction": {"type": "object", "properties": {
                "scores": {"type": "array", "items": {"type": "number"}, "description": "f^T W (one per output)"},
                "predicted_class": {"type": ["integer", "null"], "description": "argmax of scores"},
                "variance": {"type": ["number", "null"], "description": "sigma^2 f^T T f"}}},
            "PredictResponse": {"type": "object", "properties": {
                "head_id": {"type": "string"}, "version": {"type": "integer"},
                "mode": {"enum": ["exact", "fast"]}, "digest": {"type": "string"},
                "n_retained": {"type": "integer"}, "batched": {"type": "boolean"},
                "predictions": {"type": "array", "items": {"$ref": "#/components/schemas/Prediction"}},
                "variance": {"type": "object", "properties": {
                    "available": {"type": "boolean"},
                    "source": {"enum": ["current_head", "last_exact_head", None]},
                    "posterior_version": {"type": ["integer", "null"]},
                    "posterior_digest": {"type": ["string", "null"]},
                    "sigma2": {"type": "number"}, "note": {"type": "string"}}}}},
            "HeadSummary": {"type": "object", "properties": {
                "head_id": {"type": "string"}, "version": {"type": "integer"},
                "mode": {"enum": ["exact", "fast"]}, "digest": {"type": "string"},
                "n_retained": {"type": "integer"}, "events_covered": {"type": "integer"},
                "d": {"type": "integer"}, "c": {"type": "integer"}, "gamma": {"type": "number"},
                "drift": {"type": "number"}, "created_ts": {"type": "number"},
                "age_seconds": {"type": "number"}, "received_age_seconds": {"type": "number"},
                "has_posterior": {"type": "boolean"}, "posterior_version": {"type": ["integer", "null"]},
                "offsets": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                "weights": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}}},
        }},
    }


# --------------------------------------------------------------------------- CLI
def serve_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn serve --bootstrap B [--port P] [--host H] [--prefix P]``: run until SIGINT/SIGTERM."""
    ap = argparse.ArgumentParser(prog="unlearn serve", description="HTTP predictions from the latest heads.")
    add_broker_args(ap, "bootstrap")
    ap.add_argument("--port", type=int, help="listen port (default: UNLEARN_SERVE_PORT)")
    ap.add_argument("--host", help="listen address (default: UNLEARN_SERVE_HOST)")
    add_broker_args(ap, "prefix", "profile")
    ap.add_argument("--loglevel", default="info")
    try:
        args = ap.parse_args(argv)
        settings = settings_from_args(args, serve_port=args.port, serve_host=args.host)
    except (SystemExit, ValueError) as exc:
        return cli_exit_code(exc)
    logging.basicConfig(level=getattr(logging, str(args.loglevel).upper(), logging.INFO),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = build_app(settings)

    def printed(msg: str) -> None:
        print(f"serving on http://{settings.serve_host}:{settings.serve_port} "
              f"(heads from {settings.topic('heads')} at {settings.bootstrap})", flush=True)

    try:
        web.run_app(app, host=settings.serve_host, port=settings.serve_port, print=printed,
                    access_log=None, handle_signals=True)
    except OSError as exc:
        print(f"error: cannot listen on {settings.serve_host}:{settings.serve_port}: {exc}", file=sys.stderr)
        return 1
    return 0
