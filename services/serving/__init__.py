"""``unlearn serve``: HTTP predictions from the latest published heads (docs/serving.md).

Modules, one concept each: ``store`` (the served heads, swapped atomically), ``follower`` (the
heads topic -> the store), ``predict`` (request body -> featurized inputs -> scores and
variance), ``metrics`` (Prometheus, one registry per app), ``http`` (the aiohttp app and an
in-process server), ``cli`` (``serve_main``); ``openapi.json`` documents the HTTP API.
"""

from __future__ import annotations

from unlearn.services.serving.cli import serve_main
from unlearn.services.serving.http import (
    HeadsFollower,
    Metrics,
    ServingServer,
    build_app,
    follower_of,
    metrics_of,
    openapi_document,
    openapi_spec,
    store_of,
)
from unlearn.services.serving.predict import (
    HeadStore,
    PredictError,
    ServedHead,
    parse_predict_body,
    predict,
    prepare_inputs,
)

__all__ = [
    "HeadStore",
    "HeadsFollower",
    "Metrics",
    "PredictError",
    "ServedHead",
    "ServingServer",
    "build_app",
    "follower_of",
    "metrics_of",
    "openapi_document",
    "openapi_spec",
    "parse_predict_body",
    "predict",
    "prepare_inputs",
    "serve_main",
    "store_of",
]
