"""Why a request is refused: :class:`InvalidRequest` and every reason code it can carry.

The reason is machine-readable and goes to ``deadletter`` (docs/formats.md, "Request reason
codes"); the envelope and its inputs raise nothing else on bad input.
"""

from __future__ import annotations

__all__ = [
    "REQUEST_REASONS",
    "InvalidRequest",
    "fail",
    "short_repr",
]


REQUEST_REASONS: dict[str, str] = {
    "not_json": "the bytes are not UTF-8 JSON (orjson: also non-finite numbers like 1e999)",
    "not_object": "the JSON value is not an object",
    "duplicate_key": "an object holds one key twice (also written with escapes, e.g. head\\u005fid after "
                     "head_id): parsers disagree on which value counts",
    "missing_field:<name>": "a required field is absent (schema first)",
    "unknown_schema_version": "`schema` is not 'unlearn.request/v1'",
    "unknown_field:<name>": "a field the schema does not define",
    "bad_field:<name>": "an id field is not 1..128 characters of [A-Za-z0-9._:@+-]",
    "bad_op": "op is not add | delete | delete_subject",
    "unexpected_field:<name>": "a field the op does not take (label/input on delete, ...)",
    "bad_label": "label is not an int in 0..2^31-1 nor a non-empty list of numbers",
    "bad_input": "input is not an object with a string `kind` and exactly that kind's fields",
    "bad_input_kind": "input.kind is not features | features_bin | text | image | sealed",
    "bad_features": "input.values is not a non-empty list of numbers, or features_bin data is empty or "
                    "not a whole number of values",
    "bad_features_dtype": "features_bin input.dtype is not '<f4' | '<f8'",
    "non_finite_feature": "a feature value is NaN or infinite (a features_bin bit pattern, or encode side)",
    "non_finite_label": "a label vector value is NaN or infinite (encode side)",
    "bad_text": "input.text is not a non-empty string",
    "bad_image_format": "input.format is not 'png'",
    "bad_base64": "input.data (image, features_bin) is not padded standard base64 (image: >= 4 characters)",
    "bad_ts": "ts is not a number >= 0",
    "bad_sealed_input": "a sealed input's key_id is not 32 lowercase hex characters, or its epk (32 bytes), "
                        "nonce (12 bytes) or ciphertext (>= 16 bytes) is not padded standard base64 of that size",
}
"""Every reason code ``parse_request`` can give (``<name>`` is the field name)."""


class InvalidRequest(ValueError):
    """A request that must go to deadletter: ``reason`` is machine-readable, ``detail`` human."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def fail(reason: str, detail: str) -> InvalidRequest:
    """The error to raise for ``reason`` (a code of :data:`REQUEST_REASONS`)."""
    return InvalidRequest(reason, detail)


def short_repr(v: object, limit: int = 60) -> str:
    """``repr(v)`` cut to ``limit`` characters: an error detail never echoes a whole document."""
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."
