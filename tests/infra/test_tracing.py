"""W3C trace context carried across the stages (infra/tracing.py, docs/operations.md "Traces"):
header parsing, propagation through the featurizer's outputs and outbox, and the spans made when
a tracer provider is configured (the OTel SDK's in-memory exporter)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.streams.featurizer.test_featurize import MemCache, add, cfg, delete, no_encoder
from unlearn.infra import tracing
from unlearn.streams.featurizer.batch_io import InMessage, OutMessage
from unlearn.streams.featurizer.cache_view import CacheMutations
from unlearn.streams.featurizer.changelog_batches import batch_records, outputs_of_txn
from unlearn.streams.featurizer.changelog_records import PHASE_CHANGELOG, Position, decode_txn, encode_txn
from unlearn.streams.featurizer.feature_cache import FeatureCache
from unlearn.streams.featurizer.featurize import featurize_batch
from unlearn.streams.ledger.outputs import PollOutputs, receipt_headers

TID = "4bf92f3577b34da6a3ce929d0e0e4736"
TP_DEL = f"00-{TID}-00f067aa0ba902b7-01".encode()
TP_ADD1 = b"00-11111111111111111111111111111111-1111111111111111-01"
TP_ADD2 = b"00-22222222222222222222222222222222-2222222222222222-00"


@pytest.mark.parametrize("value", [
    TP_DEL, TP_DEL.decode(), b"01-" + TP_DEL[3:] + b"-future-field", TP_DEL + b" ",
])
def test_valid_traceparents_parse(value: bytes | str) -> None:
    assert tracing.parse(value) == (TID, "00f067aa0ba902b7", 1)
    assert tracing.valid(value.encode() if isinstance(value, str) else value)


@pytest.mark.parametrize("value", [
    None, b"", b"garbage", b"00-not-a-trace", TP_DEL.upper(), b"ff" + TP_DEL[2:], TP_DEL + b"-extra",
    b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01", b"00-" + TID.encode() + b"-" + b"0" * 16 + b"-01",
    TP_DEL[:-1], b"\xff\xfe", TP_DEL.replace(b"-", b"_"),
])
def test_invalid_traceparents_are_none(value: bytes | None) -> None:
    assert tracing.parse(value) is None
    assert tracing.traceparent_of([("traceparent", value)]) is None
    assert value is None or not tracing.valid(value)


def test_header_lookup_and_event_list() -> None:
    assert tracing.traceparent_of(None) is None and tracing.traceparent_of([]) is None
    assert tracing.traceparent_of([("traceparent", TP_ADD1), ("x", None), ("traceparent", TP_DEL)]) == TP_DEL
    pairs = [(f"e{i}", TP_ADD1) for i in range(tracing.MAX_EVENTS + 5)] + [("bad\nid", TP_DEL)]
    got = tracing.events_of([(tracing.EVENTS_HEADER, tracing.encode_events(pairs))])
    assert len(got) == tracing.MAX_EVENTS and got["e0"] == TP_ADD1 and "bad\nid" not in got
    # a corrupt line (bad context, no separator, bad utf-8) is skipped, the rest read
    raw = b"e1 " + TP_DEL + b"\ne2 junk\nnospace\n\xff\xfe " + TP_ADD1
    assert tracing.events_of([(tracing.EVENTS_HEADER, raw)]) == {"e1": TP_DEL}
    assert tracing.headers_with(None) == () and tracing.headers_with(TP_DEL) == (("traceparent", TP_DEL),)


def _judged(headers: list[tuple[tuple[str, bytes | None], ...]], values: list[bytes]) -> list[OutMessage]:
    msgs = [InMessage(0, i, v, b"k", headers=h) for i, (v, h) in enumerate(zip(values, headers, strict=True))]
    config = cfg()
    return featurize_batch(msgs, MemCache(), config, no_encoder).messages(config)


X = np.eye(4)


def test_without_a_tracer_the_headers_are_copied_and_an_invalid_one_ignored() -> None:
    assert not tracing.enabled()
    out = _judged([(("traceparent", b"00-not-a-trace"),), (("traceparent", TP_ADD1),), ()],
                  [add("a0", "h", "s", "x0", X[0]), add("a1", "h", "s", "x1", X[1]), add("a2", "h", "s", "x2", X[2])])
    assert [m.topic for m in out] == ["t.deltas"]  # nothing dead-lettered by a bad header
    h = dict(out[0].headers)
    assert h["traceparent"] == TP_ADD1 and tracing.events_of(out[0].headers) == {"a1": TP_ADD1}
    untraced = _judged([()], [add("b0", "h", "s", "y0", X[0])])
    assert untraced[0].headers == ()


def test_a_delta_takes_the_first_traced_delete_as_its_context() -> None:
    cache = MemCache()
    config = cfg()
    first = featurize_batch([InMessage(0, 0, add("a0", "h", "s", "x0", X[0]), b"k")], cache, config, no_encoder)
    cache.apply(first.mutations)
    msgs = [InMessage(0, 1, add("a1", "h", "s", "x1", X[1]), b"k", headers=(("traceparent", TP_ADD1),)),
            InMessage(0, 2, delete("d0", "h", "s", "x0"), b"k", headers=(("traceparent", TP_DEL),))]
    out = featurize_batch(msgs, cache, config, no_encoder, origins={}).messages(config)
    (delta,) = [m for m in out if m.topic == "t.deltas"]
    assert dict(delta.headers)["traceparent"] == TP_DEL
    assert tracing.events_of(delta.headers) == {"a1": TP_ADD1, "d0": TP_DEL}


def test_the_outbox_and_the_changelog_txn_keep_the_headers(tmp_path: Path) -> None:
    hdrs = (("traceparent", TP_DEL), (tracing.EVENTS_HEADER, b"d0 " + TP_DEL), ("empty", None))
    msgs = [OutMessage("t.deltas", b"h", b"v1", headers=hdrs), OutMessage("t.receipts", b"s", b"v2")]
    # the txn: v2 only when a message has headers; without any, v1 byte for byte as before
    assert decode_txn(encode_txn([], msgs))[1] == [OutMessage(m.topic, m.key, m.value, headers=m.headers)
                                                    for m in msgs]
    plain = encode_txn([], msgs[1:])
    assert plain.startswith(b"ULFT\x01") and decode_txn(plain)[1] == msgs[1:]
    path = tmp_path / "p0.sqlite"
    with FeatureCache(path) as cache:
        cache.commit_batch(CacheMutations(), msgs, 0)
        assert [(r.topic, r.headers) for r in cache.pending_outbox()] == [("t.deltas", hdrs), ("t.receipts", ())]
    # a file made before the outbox kept headers gains the column; its rows have none
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE outbox DROP COLUMN headers")
    db.execute("INSERT INTO outbox (topic, key, value) VALUES ('t.deltas', x'01', x'02')")
    db.commit()
    db.close()
    with FeatureCache(path) as cache:
        assert [r.headers for r in cache.pending_outbox()] == [(), (), ()]


def test_a_batch_rebuilt_from_its_changelog_txn_keeps_the_headers() -> None:
    """With the changelog, the outbox keeps phase 0 only and phase 1 is rebuilt from the txn after
    a crash (``outputs_of_txn``): the rebuilt delta still carries its trace context."""
    hdrs = (("traceparent", TP_DEL), (tracing.EVENTS_HEADER, b"d0 " + TP_DEL))
    msgs = [OutMessage("t.deltas", b"h", b"v1", headers=hdrs), OutMessage("t.receipts", b"s", b"v2")]
    pos = Position(0, 5, "t.requests.by-head", "tid", "L", 1, 0, "", {0: 5}, "rid", 1)
    recs = batch_records(0, "t.featurizer-cache", CacheMutations(), msgs, pos, 7)  # several txn pieces
    rebuilt = outputs_of_txn("t.featurizer-cache", 0, [m for m in recs if m.phase == PHASE_CHANGELOG])
    assert [(m.topic, m.headers) for m in rebuilt if m.topic != "t.featurizer-cache"] == [
        ("t.deltas", hdrs), ("t.receipts", ())]


def test_a_head_update_is_parented_by_a_deleting_delta() -> None:
    poll = PollOutputs()
    poll.traces["h"] = [(True, TP_ADD1), (False, TP_DEL), (True, TP_ADD2)]
    assert poll.head_traces("h") == [TP_DEL, TP_ADD1, TP_ADD2] and poll.head_traces("other") == []
    poll.read_trace([("traceparent", b"bogus"), (tracing.EVENTS_HEADER, b"d0 " + TP_DEL)])
    assert poll.record_trace is None and poll.record_events == {}


# --------------------------------------------------------------------------- spans (OTel SDK, in memory)
@pytest.fixture
def spans() -> Iterator[object]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    try:
        yield exporter
    finally:
        tracing.configure(None)


def _ctx(tp: bytes) -> tuple[int, int]:
    parsed = tracing.parse(tp)
    assert parsed is not None
    return int(parsed[0], 16), int(parsed[1], 16)


def test_spans_have_the_delete_as_parent_and_the_others_as_links(spans) -> None:  # type: ignore[no-untyped-def]
    cache = MemCache()
    config = cfg()
    cache.apply(featurize_batch([InMessage(0, 0, add("a0", "h", "s", "x0", X[0]), b"k")], cache, config,
                                no_encoder).mutations)
    msgs = [InMessage(0, 1, add("a1", "h", "s", "x1", X[1]), b"k", headers=(("traceparent", TP_ADD1),)),
            InMessage(0, 2, add("a2", "h", "s", "x2", X[2]), b"k", headers=(("traceparent", TP_ADD2),)),
            InMessage(0, 3, delete("d0", "h", "s", "x0"), b"k", headers=(("traceparent", TP_DEL),)),
            InMessage(0, 4, add("a3", "h", "s", "x3", X[3]), b"k", headers=(("traceparent", b"junk"),))]
    out = featurize_batch(msgs, cache, config, no_encoder, origins={}).messages(config)
    (delta,) = [m for m in out if m.topic == "t.deltas"]
    (span,) = spans.get_finished_spans()
    assert span.name == "featurizer.delta" and span.attributes["unlearn.head_id"] == "h"
    assert (span.parent.trace_id, span.parent.span_id) == _ctx(TP_DEL)  # the delete's context
    assert sorted((lk.context.trace_id, lk.context.span_id) for lk in span.links) == sorted(
        [_ctx(TP_ADD1), _ctx(TP_ADD2)])  # every other request linked; the invalid one ignored
    tp = dict(delta.headers)["traceparent"]
    assert tp is not None and _ctx(tp) == (span.context.trace_id, span.context.span_id)
    assert span.context.trace_id == int(TID, 16)  # the delete's trace goes on

    # the ledger: a receipt's span is the child of its delete's own context, the head update's of
    # the first deleting delta, linked to the poll's other deltas
    spans.clear()
    receipt_tp = dict(receipt_headers("d0", tracing.events_of(delta.headers)))["traceparent"]
    assert receipt_headers("untraced", tracing.events_of(delta.headers)) == receipt_headers("d0", None) == ()
    head_tp = tracing.span_header("ledger.head_update", [tp, TP_ADD1, TP_ADD1])
    receipt, head = spans.get_finished_spans()
    assert (receipt.parent.span_id, head.parent.span_id) == (_ctx(TP_DEL)[1], _ctx(tp)[1])
    assert [lk.context.span_id for lk in head.links] == [_ctx(TP_ADD1)[1]]  # duplicates linked once
    assert receipt_tp is not None and _ctx(receipt_tp)[0] == int(TID, 16) == _ctx(head_tp or b"")[0]


def test_a_span_without_any_context_starts_a_trace(spans) -> None:  # type: ignore[no-untyped-def]
    tp = tracing.span_header("x", [])
    (span,) = spans.get_finished_spans()
    assert span.parent is None and tp is not None and _ctx(tp) == (span.context.trace_id, span.context.span_id)


def test_unset_endpoint_makes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert tracing.configure_from_env("unlearn-test") is False and not tracing.enabled()


def test_with_an_endpoint_spans_reach_an_otlp_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned OTLP/HTTP exporter sends the spans to ``OTEL_EXPORTER_OTLP_ENDPOINT``: a collector
    on loopback gets a protobuf ``/v1/traces`` request naming the request's trace."""
    import http.server
    import threading

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    got: list[tuple[str, bytes]] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    try:
        assert tracing.configure_from_env("unlearn-test") and tracing.enabled()
        tp = tracing.span_header("featurizer.delta", [TP_DEL])
        assert tracing.flush(10)
    finally:
        tracing.configure(None)
        server.shutdown()
    assert tp is not None and [path for path, _ in got] == ["/v1/traces"]
    req = ExportTraceServiceRequest.FromString(got[0][1])
    (span,) = [sp for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
    assert span.name == "featurizer.delta" and span.trace_id.hex() == TID
    assert span.parent_span_id.hex() == "00f067aa0ba902b7"
