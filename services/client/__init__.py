"""The client side of unlearn-stream: the SDK (``sdk``; its ``errors``, ``receipt_listener`` and
``transit_key_cache``), its CLI (``cli``) and the head reader (``head_reader``).

The SDK's public names are exported here, so apps can write
``from unlearn.services.client import UnlearnClient``. They are loaded on first use (PEP 562), so
importing ``unlearn.services.client.head_reader`` (`unlearn head`) does not load the SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unlearn.schemas.request_errors import InvalidRequest
    from unlearn.services.client.errors import ClientError, DeliveryFailed, ReceiptTimeout
    from unlearn.services.client.receipt_listener import ReceiptListener
    from unlearn.services.client.sdk import (
        FEATURES_ENCODINGS,
        FeaturesEncoding,
        RequestHandle,
        UnlearnClient,
        make_input,
        new_event_id,
    )
    from unlearn.services.client.transit_key_cache import TransitUnavailable

__all__ = [
    "FEATURES_ENCODINGS",
    "ClientError",
    "DeliveryFailed",
    "FeaturesEncoding",
    "InvalidRequest",
    "ReceiptListener",
    "ReceiptTimeout",
    "RequestHandle",
    "TransitUnavailable",
    "UnlearnClient",
    "make_input",
    "new_event_id",
]


_MODULES = {
    "InvalidRequest": "unlearn.schemas.request_errors",
    "ClientError": "unlearn.services.client.errors",
    "DeliveryFailed": "unlearn.services.client.errors",
    "ReceiptTimeout": "unlearn.services.client.errors",
    "ReceiptListener": "unlearn.services.client.receipt_listener",
    "TransitUnavailable": "unlearn.services.client.transit_key_cache",
}


def __getattr__(name: str) -> Any:
    """Load the SDK when one of its names is first asked for."""
    if name in __all__:
        return getattr(importlib.import_module(_MODULES.get(name, "unlearn.services.client.sdk")), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
