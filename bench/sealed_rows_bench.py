"""Per-row CPU of sealed rows on the ledger side, and of ``parse_request`` (issue 12).

    python -m bench.sealed_rows_bench [--rows 222] [--records 2000] [--repeats 30]

Pure, no broker: ``open_delta`` of one sealed deltas message (``--rows`` rows, d=768, class
labels; what the ledger worker and the verifier run per message), ``fold_keys`` of ``--records``
key-family records (a key ring's refresh), and ``parse_request`` of ``bench.pipeline_bench``'s
add requests (JSON numbers and ``features_bin`` ``<f4``) next to ``orjson.loads`` of the same
bytes. Best of ``--repeats``; prints microseconds per row, record and request. Asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import orjson

from bench.app_requests import request
from unlearn.common.key_ring import KeyGeneration, fold_keys, key_record_key
from unlearn.schemas.delta_codec import Delta, RowsEntry, decode_delta, encode_delta
from unlearn.schemas.envelope import parse_request
from unlearn.schemas.sealed import SampleKey, encode_key_record, new_key, open_delta, seal_delta


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` calls (the least disturbed on a shared box)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: list[str] | None = None) -> None:
    """Print the three per-item costs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=222)
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    n, d = a.rows, 768
    names = [f"s{i}" for i in range(n)]
    entry = RowsEntry(1, tuple(f"e{x}" for x in names), tuple(names), tuple(f"u{x}" for x in names),
                      rng.integers(0, 10, size=n), rng.integers(-(2**30), 2**30, size=(n, d), dtype=np.int64))
    keys: dict[tuple[str, str], SampleKey] = {}
    sealed = decode_delta(encode_delta(seal_delta(Delta("h1", "src", d, 20, 0, (entry,)),
                                                  lambda h, s: keys.setdefault((h, s), new_key()))))
    by_ref = {(h, s, k.key_id): k for (h, s), k in keys.items()}
    opened = open_delta(sealed, lambda h, s, kid: by_ref.get((h, s, kid)))
    assert np.array_equal(opened.delta.entries[0].q, entry.q)  # type: ignore[union-attr]
    t = best_of(lambda: open_delta(sealed, lambda h, s, kid: by_ref.get((h, s, kid))), a.repeats)
    print(f"open_delta: {t / n * 1e6:.1f} us/row ({n} rows, d={d}, best of {a.repeats})")
    recs = [(i, key_record_key("h1", f"s{i}", k.key_id), encode_key_record(k))
            for i, k in enumerate(new_key() for _ in range(a.records))]
    t = best_of(lambda: fold_keys(KeyGeneration(0, 0, "t"), recs), a.repeats)
    print(f"fold_keys: {t / a.records * 1e6:.2f} us/record ({a.records} records, best of {a.repeats})")
    feats = rng.standard_normal((200, d)).astype(np.float32)
    for enc, dtype in (("JSON numbers", None), ("features_bin <f4", "<f4")):
        msgs = [request(i, "add", "bench", feats[i], i % 10, dtype)[1] for i in range(len(feats))]
        tp = best_of(lambda: [parse_request(m) for m in msgs], max(3, a.repeats // 3))  # noqa: B023
        tl = best_of(lambda: [orjson.loads(m) for m in msgs], max(3, a.repeats // 3))  # noqa: B023
        per = 1e6 / len(msgs)
        print(f"parse_request, {enc}: {tp * per:.1f} us/add (orjson.loads alone {tl * per:.1f})")


if __name__ == "__main__":
    main()
