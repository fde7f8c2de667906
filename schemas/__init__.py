"""Message formats of the event stream (docs/design.md section 3; byte layouts in docs/formats.md).

- ``requests``: JSON envelope ``unlearn.request/v1`` (request.v1.schema.json) -> :func:`parse_request`
- ``deltas``: binary exact rows / packed ledgers -> :func:`encode_delta`, :func:`decode_delta`
- ``heads``: binary head versions -> :func:`encode_head`, :func:`decode_head`, :func:`head_to_json`
- ``receipts``: JSON ``unlearn.receipt/v3`` (receipt.v3.schema.json) -> :func:`encode_receipt`
- ``deadletter``: JSON ``unlearn.deadletter/v1`` -> :func:`encode_deadletter`

Every decoder raises a ValueError subclass (InvalidRequest or CodecError) on bad input, never
anything else, so a consumer can route any failure to ``deadletter`` instead of crashing.
"""

from pathlib import Path

from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.deadletter import (
    DEADLETTER_SCHEMA_V1,
    STAGES,
    DeadLetter,
    deadletter_for,
    decode_deadletter,
    encode_deadletter,
)
from unlearn.schemas.delta_codec import (
    DELTA_MAGIC,
    DELTA_VERSION,
    Delta,
    PackedEntry,
    RowsEntry,
    decode_delta,
    encode_delta,
)
from unlearn.schemas.envelope import (
    REQUEST_SCHEMA_V1,
    Op,
    Request,
    encode_request,
    parse_request,
    request_from_dict,
    request_to_dict,
)
from unlearn.schemas.head import HEAD_MAGIC, HEAD_VERSION, MODES, HeadUpdate, decode_head, encode_head, head_to_json
from unlearn.schemas.receipts import (
    RECEIPT_SCHEMA_V3,
    Receipt,
    decode_receipt,
    encode_receipt,
    receipt_from_dict,
    receipt_to_dict,
)
from unlearn.schemas.request_errors import REQUEST_REASONS, InvalidRequest
from unlearn.schemas.request_inputs import FeaturesInput, ImageInput, Input, TextInput

SCHEMA_DIR = Path(__file__).resolve().parent
"""Folder holding the JSON Schema files (request.v1.schema.json, receipt.v3.schema.json, ...)."""

__all__ = [
    "DEADLETTER_SCHEMA_V1",
    "DELTA_MAGIC",
    "DELTA_VERSION",
    "HEAD_MAGIC",
    "HEAD_VERSION",
    "MODES",
    "RECEIPT_SCHEMA_V3",
    "REQUEST_REASONS",
    "REQUEST_SCHEMA_V1",
    "SCHEMA_DIR",
    "STAGES",
    "CodecError",
    "DeadLetter",
    "Delta",
    "FeaturesInput",
    "HeadUpdate",
    "ImageInput",
    "Input",
    "InvalidRequest",
    "Op",
    "PackedEntry",
    "Receipt",
    "Request",
    "RowsEntry",
    "TextInput",
    "deadletter_for",
    "decode_deadletter",
    "decode_delta",
    "decode_head",
    "decode_receipt",
    "encode_deadletter",
    "encode_delta",
    "encode_head",
    "encode_receipt",
    "encode_request",
    "head_to_json",
    "parse_request",
    "receipt_from_dict",
    "receipt_to_dict",
    "request_from_dict",
    "request_to_dict",
]
