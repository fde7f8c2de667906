"""The client side of unlearn-stream: the SDK (``sdk``), its CLI (``cli``) and the head reader
(``head_reader``).

The SDK's public names are re-exported here, so apps can write
``from unlearn.services.client import UnlearnClient``. They are loaded on first use (PEP 562), so
importing ``unlearn.services.client.head_reader`` (`unlearn head`) does not load the SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unlearn.services.client.sdk import (
        FEATURES_ENCODINGS,
        ClientError,
        DeliveryFailed,
        FeaturesEncoding,
        InvalidRequest,
        ReceiptListener,
        ReceiptTimeout,
        RequestHandle,
        TransitUnavailable,
        UnlearnClient,
        make_input,
        new_event_id,
    )

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


def __getattr__(name: str) -> Any:
    """Load the SDK when one of its names is first asked for."""
    if name in __all__:
        return getattr(importlib.import_module("unlearn.services.client.sdk"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
