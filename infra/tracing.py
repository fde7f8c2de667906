"""W3C trace context across the stages (docs/operations.md, "Traces").

A request may carry a W3C ``traceparent`` Kafka header (the SDK and the Java client set one; any
producer may). The stages carry it, as Kafka headers, to what the request produced:

- the featurizer's deltas, rejected receipts and dead letters: a delta covers many requests and a
  record has one ``traceparent``, so the delta's is the *first* traced delete's in entry order (else
  the first traced add's), and :data:`EVENTS_HEADER` lists every covered event's context (at most
  :data:`MAX_EVENTS`, in entry order; the rest are not named);
- the ledger's receipts (parent: the delete's own context, from :data:`EVENTS_HEADER`) and head
  updates (parent: the first traced delta of the poll touching the head; the others are links).

Without an exporter nothing but header bytes is copied: no span, no OpenTelemetry import
(:func:`enabled` is one global read). With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set (:func:`configure_from_env`,
the OTLP/HTTP exporter imported lazily) or a tracer provider given to :func:`configure` (tests),
each stage starts and ends one span per output: its parent is the context the header would have
carried, every other covered context is a span *link*, and the output's ``traceparent`` is the
span's own context (same trace id). An invalid ``traceparent`` is ignored: never a dead letter,
never an error. This module is neutral: both stages use it, it imports neither.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

log = logging.getLogger("unlearn.tracing")

TRACEPARENT = "traceparent"
"""The W3C header name (lower case, as the spec writes it)."""
EVENTS_HEADER = "unlearn-trace-events"
"""On a delta: ``event_id SP traceparent`` lines, one per traced event it covers (first :data:`MAX_EVENTS`)."""
MAX_EVENTS = 64
"""Bound on the contexts a delta names, and so on a span's links."""

Headers = Sequence[tuple[str, "bytes | None"]]

_TP = re.compile(rb"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_tracer: Any = None  # an opentelemetry Tracer while enabled; None: copy header bytes only
_provider: Any = None  # the TracerProvider behind it (flush)


def parse(value: bytes | str | None) -> tuple[str, str, int] | None:
    """(trace id, span id, flags) of a valid W3C ``traceparent`` value, None otherwise (version
    ff, all-zero ids, wrong lengths or case, a version 00 value with more fields)."""
    if value is None:
        return None
    raw = value.encode("latin-1", "replace") if isinstance(value, str) else bytes(value)
    m = _TP.match(raw.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = (g.decode() if g is not None else None for g in m.groups())
    if version == "ff" or (version == "00" and rest) or set(trace_id or "0") == {"0"} or set(span_id or "0") == {"0"}:
        return None
    return str(trace_id), str(span_id), int(str(flags), 16)


_TP00 = re.compile(rb"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def valid(value: bytes) -> bool:
    """``parse(value) is not None``, fast for the usual version 00 value (what every record with a
    header pays, tracing on or off)."""
    if len(value) == 55 and _TP00.fullmatch(value) is not None:
        return value[3:35] != b"0" * 32 and value[36:52] != b"0" * 16
    return parse(value) is not None


def format_traceparent(trace_id: str, span_id: str, flags: int = 1) -> bytes:
    return f"00-{trace_id}-{span_id}-{flags:02x}".encode()


def new_traceparent() -> bytes:
    """A fresh sampled root context (random ids), as a client sets on a request."""
    return format_traceparent(os.urandom(16).hex(), os.urandom(8).hex())


def traceparent_of(headers: Headers | None) -> bytes | None:
    """The record's valid ``traceparent`` (the last one wins), None when absent or invalid."""
    if not headers:
        return None
    found: bytes | None = None
    for name, value in headers:
        if name == TRACEPARENT:
            found = value
    return found if found is not None and valid(found) else None


def events_of(headers: Headers | None) -> dict[str, bytes]:
    """event id -> traceparent named by a delta's :data:`EVENTS_HEADER` (invalid lines skipped)."""
    out: dict[str, bytes] = {}
    for name, value in headers or ():
        if name != EVENTS_HEADER or not value:
            continue
        for line in bytes(value).split(b"\n")[:MAX_EVENTS]:
            event, _, tp = line.rpartition(b" ")
            if event and valid(tp):
                try:
                    out.setdefault(event.decode(), tp)
                except UnicodeDecodeError:
                    continue
    return out


def encode_events(events: Iterable[tuple[str, bytes]]) -> bytes:
    """The :data:`EVENTS_HEADER` value of (event id, traceparent) pairs (first :data:`MAX_EVENTS`;
    event ids with a newline are left out)."""
    lines: list[bytes] = []
    for event, tp in events:
        if "\n" not in event:
            lines.append(event.encode() + b" " + tp)
            if len(lines) == MAX_EVENTS:
                break
    return b"\n".join(lines)


# --------------------------------------------------------------------------- spans
def enabled() -> bool:
    """Whether spans are made (an exporter or a test provider is configured)."""
    return _tracer is not None


def configure(provider: Any | None) -> None:
    """Make spans with ``provider`` (an ``opentelemetry.sdk.trace.TracerProvider``); None: stop."""
    global _tracer, _provider
    _tracer = None if provider is None else provider.get_tracer("unlearn")
    _provider = provider


def flush(timeout_s: float = 10.0) -> bool:
    """Export the spans made so far now (the SDK batches them, and exports the rest at exit)."""
    return _provider is None or bool(_provider.force_flush(int(timeout_s * 1000)))


def configure_from_env(service: str) -> bool:
    """With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, export this process's spans over OTLP/HTTP
    (``opentelemetry-exporter-otlp-proto-http``, imported only then: install it where spans are
    exported; pinned). Unset (or the exporter missing: logged), nothing is made. Returns enabled()."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return enabled()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:  # pinned (requirements.lock); a trimmed install may lack it
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-exporter-otlp-proto-http is not installed: "
                    "no spans exported (trace headers are still carried)")
        return enabled()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # sent at exit too
    configure(provider)
    return True


def _context(tp: bytes) -> Any:
    from opentelemetry.trace import SpanContext, TraceFlags

    parsed = parse(tp)
    assert parsed is not None
    trace_id, span_id, flags = parsed
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(flags & 1))


def span_header(name: str, contexts: Sequence[bytes], attributes: dict[str, Any] | None = None) -> bytes | None:
    """The ``traceparent`` of one output covering ``contexts`` (valid traceparents, the parent
    first): disabled, ``contexts[0]`` (None when empty); enabled, the context of a span ``name``
    started and ended now, child of ``contexts[0]`` and linked to the others (first
    :data:`MAX_EVENTS`, duplicates once; a new trace when there are none)."""
    tracer = _tracer
    if tracer is None:
        return contexts[0] if contexts else None
    from opentelemetry import trace
    from opentelemetry.trace import Link, NonRecordingSpan

    parent = trace.set_span_in_context(NonRecordingSpan(_context(contexts[0]))) if contexts else None
    seen = set(contexts[:1])
    links = []
    for tp in contexts[1:MAX_EVENTS]:
        if tp not in seen:
            seen.add(tp)
            links.append(Link(_context(tp)))
    span = tracer.start_span(name, context=parent, links=links, attributes=attributes or {})
    span.end()
    ctx = span.get_span_context()
    return format_traceparent(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", int(ctx.trace_flags))


def headers_with(tp: bytes | None, extra: Headers = ()) -> tuple[tuple[str, bytes | None], ...]:
    """Kafka headers carrying ``tp`` (none when None) then ``extra``."""
    return ((TRACEPARENT, tp), *extra) if tp is not None else tuple(extra)
