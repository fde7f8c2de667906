"""The feature cache's per-batch cost: one batch's commit and its outbox acknowledgement.

    python -m bench.cache_bench [--batch 190] [--batches 12] [--dim 768]
                                [--variants NORMAL,FULL,FULL:page_size=4096:wal_autocheckpoint=1000]

Each batch is what the service writes for ``--batch`` JSON adds of one head: ``featurize_batch``
on the real cache, the changelog records (``batch_records``) ahead of the outputs, then
``commit_batch`` and ``ack_outbox``, timed apart; medians over ``--batches`` batches. A variant
is ``FULL`` or ``NORMAL`` (the cache's ``synchronous``) with optional ``:pragma=value`` parts
(``page_size`` is applied to the new file before the cache creates its tables). Variants run
one after the other in one process. Asserts nothing.

    python -m bench.cache_bench --lookups-at 1000,10000,50000 [--batch 100] [--dim 768]

instead times what judging a batch asks of a cache already holding N samples of the head (one
file per N): the batch's lookups (``BatchView``: its samples, tombstones and event marks, all
absent, as for new adds) and one subject's samples (a ``delete_subject``); medians of 20. A
lookup that walks the head instead of seeking grows with N (pipeline_bench.md section 22).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.cache_view import BatchView, CachedSample, CacheMutations, HeadInfo
from unlearn.streams.featurizer.changelog_batches import batch_records
from unlearn.streams.featurizer.changelog_records import Position
from unlearn.streams.featurizer.core_config import CoreConfig
from unlearn.streams.featurizer.feature_cache import FeatureCache
from unlearn.streams.featurizer.featurize import featurize_batch
from unlearn.streams.featurizer.tombstones import Tombstone


def adds(n: int, first: int, dim: int, rng: np.random.Generator) -> list[InMessage]:
    """``n`` add requests of head "h" (JSON features), at offsets first..first+n-1."""
    out = []
    for j in range(first, first + n):
        body = {"schema": "unlearn.request/v1", "event_id": f"e{j}", "op": "add", "head_id": "h", "client_id": "c",
                "subject_id": f"u{j % 97}", "sample_id": f"s{j}", "label": 1,
                "input": {"kind": "features", "values": rng.normal(size=dim).tolist()}}
        out.append(InMessage(0, j, orjson.dumps(body), None))
    return out


def run_variant(variant: str, batches: list[list[InMessage]], path: Path) -> tuple[float, float, int, int]:
    """(median commit s, median ack s, outbox rows, outbox bytes) of one variant, in a new file."""
    sync, *pragmas = variant.split(":")
    if any(p.startswith("page_size") for p in pragmas):
        pre = sqlite3.connect(str(path))
        pre.execute(f"PRAGMA {next(p for p in pragmas if p.startswith('page_size'))}")
        pre.execute("CREATE TABLE bench_page_size (a)")  # fixes the page size of the new file
        pre.commit()
        pre.close()
    cfg = CoreConfig(requests_topic="r", deltas_topic="d", deadletter_topic="dl", receipts_topic="rc")
    commits, acks = [], []
    rows = size = 0
    with FeatureCache(path, synchronous=sync) as cache:
        for p in pragmas:
            if not p.startswith("page_size"):
                cache._db.execute(f"PRAGMA {p}")
        for msgs in batches:
            outcome = featurize_batch(msgs, cache, cfg, now=0.0)
            out = outcome.messages(cfg)
            pos = Position(0, outcome.last_offset, "t", "tid", cache.lineage, cache.generation + 1, 0, "", {}, "", 1)
            out = batch_records(0, "cl", outcome.mutations, out, pos, 1_000_000) + out
            t0 = time.perf_counter()
            seqs = cache.commit_batch(outcome.mutations, out, outcome.last_offset, cache.generation + 1)
            t1 = time.perf_counter()
            cache.ack_outbox(seqs)
            acks.append(time.perf_counter() - t1)
            commits.append(t1 - t0)
            rows, size = len(out), sum(len(m.value or b"") for m in out)
    return statistics.median(commits), statistics.median(acks), rows, size


def lookups(n: int, batch: int, dim: int, path: Path) -> tuple[float, float]:
    """(median ms of a batch's lookups, median ms of one subject's samples) with ``n`` cached."""
    rng = np.random.default_rng(0)
    head = HeadInfo("h", "features", "features", dim, "class", 0, 30, 0)
    with FeatureCache(path) as cache:
        for first in range(0, n, 5000):
            put = tuple(CachedSample("h", f"s{j}", f"u{j % 997}", "c", f"e{j}", 1,
                                     rng.integers(-2**30, 2**30, dim)) for j in range(first, min(n, first + 5000)))
            tombs = tuple(Tombstone("h", "sample", f"gone{j}", f"u{j % 997}", "", j, f"d{j}")
                          for j in range(first, first + len(put), 10))
            cache.commit_batch(CacheMutations(put_samples=put, put_heads=(head,), put_tombstones=tombs), [], first)
        view_ms, subject_ms = [], []
        for r in range(20):
            new = [f"new{r}.{j}" for j in range(batch)]
            t0 = time.perf_counter()
            BatchView(cache, [("h", s) for s in new], [("h", "sample", s, "u1") for s in new]
                      + [("h", "subject", "u1", "u1")], [("h", f"a{s}") for s in new])
            t1 = time.perf_counter()
            cache.subject_samples("h", f"u{r}")
            view_ms.append((t1 - t0) * 1e3)
            subject_ms.append((time.perf_counter() - t1) * 1e3)
    return statistics.median(view_ms), statistics.median(subject_ms)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=190, help="adds per batch")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--variants", default="NORMAL,FULL,FULL:page_size=4096:wal_autocheckpoint=1000")
    ap.add_argument("--lookups-at", default="", help="comma list of cached samples per head: time the lookups")
    args = ap.parse_args(argv)
    if args.lookups_at:
        with tempfile.TemporaryDirectory() as tmp:
            for n in (int(x) for x in args.lookups_at.split(",")):
                view, subject = lookups(n, args.batch, args.dim, Path(tmp) / f"n{n}.sqlite")
                print(f"{n:>8,} samples cached: a batch of {args.batch} adds' lookups {view:7.2f} ms, "
                      f"one subject's samples {subject:7.2f} ms", flush=True)
        return
    rng = np.random.default_rng(0)
    batches = [adds(args.batch, b * args.batch, args.dim, rng) for b in range(args.batches)]
    with tempfile.TemporaryDirectory() as tmp:
        for i, variant in enumerate(args.variants.split(",")):
            commit, ack, rows, size = run_variant(variant, batches, Path(tmp) / f"v{i}.sqlite")
            print(f"{variant:44s} {args.batch} adds/batch: commit median {commit * 1e3:6.1f} ms, ack median "
                  f"{ack * 1e3:6.1f} ms ({rows} outbox rows, {size / 1e6:.1f} MB per batch)", flush=True)


if __name__ == "__main__":
    main()
