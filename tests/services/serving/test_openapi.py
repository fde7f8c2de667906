"""The OpenAPI document is a static file shipped with the package: valid, served as is, and
describing exactly the routes the app has."""

from __future__ import annotations

import json
from pathlib import Path

from openapi_spec_validator import validate

from tests.services.serving.support import http
from unlearn.infra.settings import Settings
from unlearn.services.serving.http import ServingServer, build_app, openapi_spec

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
