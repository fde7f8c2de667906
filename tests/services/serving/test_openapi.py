"""The OpenAPI document is a static file shipped with the package: valid, served as is, and
describing exactly the routes the app has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openapi_spec_validator import validate

from tests.services.serving.support import http, make_head
from unlearn.infra.settings import Settings
from unlearn.services.serving.http import ServingServer, build_app
from unlearn.services.serving.openapi import openapi_spec
from unlearn.services.serving.predict import HeadStore

DOC = Path(__file__).resolve().parents[3] / "services" / "serving" / "openapi.json"
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def test_the_document_is_valid_openapi() -> None:
    spec = openapi_spec()
    validate(spec)
    assert spec["openapi"].startswith("3.") and "/v1/heads/{head}/predict" in spec["paths"]
    assert spec == json.loads(DOC.read_text())  # the package data is the file in the tree


def test_the_document_lists_exactly_the_app_routes() -> None:
    app = build_app(Settings(), follow=False)
    routes: set[tuple[str, str]] = set()
    for route in app.router.routes():
        info = route.resource.canonical if route.resource is not None else None
        assert info is not None
        routes.add((info, route.method.lower()))
    # aiohttp adds a HEAD companion to every GET route (allow_head): not documented separately
    routes -= {(p, "head") for p, m in set(routes) if m == "get"}
    documented = {(path, method) for path, item in openapi_spec()["paths"].items() for method in item
                  if method in METHODS}
    assert routes == documented


def test_the_document_is_served_as_shipped() -> None:
    with ServingServer(Settings(), follow=False) as srv:
        status, spec = http("GET", f"{srv.url}/openapi.json")
    assert status == 200 and spec == openapi_spec() and "/healthz" in spec["paths"]


def test_aiohttp_refusals_are_json_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body over the limit (413, documented), an unknown path (404) and another method (405) are
    answered in the document's Error shape, not aiohttp's plain text."""
    import jsonschema

    from unlearn.services.serving import http as serving_http

    monkeypatch.setattr(serving_http, "MAX_BODY_BYTES", 1000)
    error_schema = openapi_spec()["components"]["schemas"]["Error"]
    store = HeadStore()
    store.offer(make_head(1))
    with ServingServer(Settings(), follow=False, store=store) as srv:
        for method, path, body, want in (("POST", "/v1/heads/h/predict", {"features": [0.5] * 400}, 413),
                                         ("GET", "/nowhere", None, 404), ("PUT", "/v1/heads", {}, 405)):
            status, err = http(method, f"{srv.url}{path}", body)
            assert status == want and isinstance(err, dict), (path, status, err)
            jsonschema.validate(err, error_schema)
    assert "413" in openapi_spec()["paths"]["/v1/heads/{head}/predict"]["post"]["responses"]
