"""The OpenAPI document of serving's HTTP API (``openapi.json`` next to this module), served at
``GET /openapi.json`` and read once.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

__all__ = [
    "OPENAPI_RESOURCE",
    "openapi_document",
    "openapi_spec",
]


#: The OpenAPI document, shipped as package data of ``unlearn.services`` (pyproject.toml).
OPENAPI_RESOURCE = "openapi.json"


@functools.cache
def openapi_document() -> bytes:
    """The OpenAPI document's bytes, exactly as shipped (read once)."""
    return resources.files(__package__).joinpath(OPENAPI_RESOURCE).read_bytes()


def openapi_spec() -> dict[str, Any]:
    """The OpenAPI document, parsed (a fresh dict: callers may modify it)."""
    spec: dict[str, Any] = json.loads(openapi_document())
    return spec
