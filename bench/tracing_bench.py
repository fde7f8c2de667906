"""What carrying the trace context costs an add when no exporter is configured.

    python -m bench.tracing_bench [--batch 190] [--dim 64] [--repeat 30]

One batch of ``--batch`` JSON adds of one head through ``featurize_batch`` and
``BatchOutcome.messages`` (the featurizer's judging and encoding, no broker, no cache file), three
ways: records without headers, records with a valid ``traceparent`` each (headers copied: the
delta's ``traceparent`` and ``unlearn-trace-events``), and the same with spans made (an SDK tracer
provider without exporter, for scale). Prints the median per-add time of each over ``--repeat``
runs and the difference to the first. Asserts nothing (numbers: docs/operations.md, "Traces").
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from unlearn.infra import tracing
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.cache_view import CacheMutations, HeadInfo
from unlearn.streams.featurizer.core_config import CoreConfig
from unlearn.streams.featurizer.featurize import featurize_batch, parse_batch, trace_contexts


class _Empty:
    """A cache with nothing in it (every add is new)."""

    def get_sample(self, head_id: str, sample_id: str) -> None:
        return None

    def subject_samples(self, head_id: str, subject_id: str) -> list[object]:
        return []

    def get_head(self, head_id: str) -> HeadInfo | None:
        return None

    def tombstones(self, head_id: str, kind: str, id_: str, subject_id: str) -> list[object]:
        return []

    def apply(self, m: CacheMutations) -> None:
        return None


def _batch(n: int, dim: int, traced: bool) -> list[InMessage]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        value = encode_request(Request(f"e{i}", "add", "h", "c1", f"s{i % 7}", f"x{i}", i % 3,
                                       FeaturesInput(tuple(float(v) for v in rng.normal(size=dim)))))
        headers = (("traceparent", tracing.new_traceparent()),) if traced else ()
        out.append(InMessage(0, i, value, b"k", headers=headers))
    return out


def _once_us(msgs: list[InMessage], config: CoreConfig) -> float:
    t0 = time.perf_counter()
    featurize_batch(msgs, _Empty(), config, lambda name, items: None, now=time.time()).messages(config)
    return (time.perf_counter() - t0) / len(msgs) * 1e6


def _lookup_us(msgs: list[InMessage], repeat: int) -> float:
    """The tracing-only part of judging: finding each record's traceparent (``trace_contexts``)."""
    reqs = parse_batch(msgs)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        trace_contexts(msgs, reqs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / len(msgs) * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=190)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=30)
    a = ap.parse_args(argv)
    from opentelemetry.sdk.trace import TracerProvider

    config = CoreConfig(requests_topic="t.requests", deltas_topic="t.deltas", deadletter_topic="t.deadletter",
                        receipts_topic="t.receipts")
    plain, traced = _batch(a.batch, a.dim, False), _batch(a.batch, a.dim, True)
    provider = TracerProvider()
    runs: dict[str, list[float]] = {"plain": [], "copied": [], "spans": []}
    for i in range(a.repeat + 3):  # interleaved, so drift of a shared machine hits each alike; 3 warm-ups
        got = {"plain": _once_us(plain, config), "copied": _once_us(traced, config)}
        tracing.configure(provider)
        try:
            got["spans"] = _once_us(traced, config)
        finally:
            tracing.configure(None)
        if i >= 3:
            for k, v in got.items():
                runs[k].append(v)
    base, copied, spans = (statistics.median(runs[k]) for k in ("plain", "copied", "spans"))
    print(f"batch {a.batch} adds, dim {a.dim}, median of {a.repeat} interleaved runs, per add:")
    print(f"  featurize_batch + messages, no headers          {base:8.2f} us")
    print(f"  ... traceparent on every add, copied (no spans) {copied:8.2f} us  ({copied - base:+.2f} us)")
    print(f"  ... spans made (SDK provider, no exporter)      {spans:8.2f} us  ({spans - base:+.2f} us)")
    print(f"  traceparent lookup alone (trace_contexts): no headers {_lookup_us(plain, a.repeat):.3f} us, "
          f"with one {_lookup_us(traced, a.repeat):.3f} us")


if __name__ == "__main__":
    main()
