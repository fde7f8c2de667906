"""``unlearn serve``: HTTP predictions from the latest published heads (docs/serving.md).

Modules, one concept each: ``predict`` (what serving holds and how it predicts, no I/O: the
served heads, swapped atomically, and request body -> featurized inputs -> scores and variance),
``http`` (the aiohttp app and an in-process server), ``heads_follower`` (fills the store from
the heads family), ``metrics`` (Prometheus, one registry per app), ``oip`` (the Open Inference
Protocol v2 routes on the same store), ``cli`` (``serve_main``), ``settings``; ``openapi``
serves ``openapi.json``, the document of the HTTP API.
"""

from __future__ import annotations

from unlearn.services.serving.cli import serve_main
from unlearn.services.serving.heads_follower import HeadsFollower
from unlearn.services.serving.http import ServingServer, build_app, follower_of, metrics_of, store_of
from unlearn.services.serving.metrics import Metrics
from unlearn.services.serving.openapi import openapi_document, openapi_spec
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
