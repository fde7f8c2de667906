"""Transit sealing micro-benchmark: what sealing an add costs the producer and opening it costs the
featurizer (docs/erasure.md section 5; schemas/sealed.py; results in bench/results/pipeline_bench.md section 10).

Prints (never asserts) the machine and, for a d-dimensional add (default 768) sent as JSON numbers
and as ``features_bin`` '<f4', the median microseconds per request over several runs of:

- ``plain``: ``encode_request`` (producer) and ``parse_request`` (featurizer) of the plaintext add;
- ``per-request``: a fresh ephemeral X25519 key per request (``seal_request`` + encode, parse +
  ``open_request``): one X25519 exchange and one HKDF on each side per request;
- ``session``: one ephemeral key per producer session and transit key (``TransitSealer``) and the
  featurizer's derived-key cache (``DerivedKeys``): AES-GCM only, after the first request.

    python -m bench.transit_bench [--dim 768] [--requests 300] [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import cryptography
import numpy as np

from unlearn.schemas.envelope import Request, encode_request, parse_request
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.schemas.transit import TransitPublicKey, new_transit_key, open_request, seal_request

try:  # absent before the session sealer existed: only the per-request rows are printed then
    from unlearn.schemas.transit import TransitSealer
    from unlearn.streams.featurizer.transit_open import DerivedKeys
except ImportError:  # pragma: no cover - the "before" run
    TransitSealer = None  # type: ignore[assignment,misc]
    DerivedKeys = None  # type: ignore[assignment,misc]


def _median_us(fn: Callable[[int], object], n: int, runs: int) -> float:
    """Median over ``runs`` of the mean microseconds of ``fn(i)`` for i in range(n)."""
    per_run = []
    for _ in range(runs):
        t = time.perf_counter()
        for i in range(n):
            fn(i)
        per_run.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(per_run)


def measure(dim: int, dtype: str | None, n: int, runs: int) -> dict[str, float]:
    """Microseconds per request (module docstring) for adds of ``dim`` floats (``dtype`` None: JSON)."""
    rng = np.random.default_rng(0)
    reqs = [Request(f"ev-{i}", "add", "faces", "app", f"s{i % 50}", f"x{i}", i % 10,
                    FeaturesInput(rng.normal(size=dim).astype(np.float32), dtype), 1.0) for i in range(n)]
    pair = new_transit_key()
    pub = TransitPublicKey(0, pair.key_id, pair.public_key, 0.0, 1e12)
    plain = [encode_request(r) for r in reqs]
    per_req = [encode_request(seal_request(r, pub)) for r in reqs]
    out = {"plain encode": _median_us(lambda i: encode_request(reqs[i]), n, runs),
           "plain parse": _median_us(lambda i: parse_request(plain[i]), n, runs),
           "per-request seal+encode": _median_us(lambda i: encode_request(seal_request(reqs[i], pub)), n, runs),
           "per-request parse+open": _median_us(lambda i: open_request(parse_request(per_req[i]), pair), n, runs)}
    if TransitSealer is not None and DerivedKeys is not None:
        sealer = TransitSealer(pub)
        session = [encode_request(sealer.seal_request(r)) for r in reqs]
        cache = DerivedKeys(64)

        def open_cached(i: int) -> object:
            req = parse_request(session[i])
            return open_request(req, pair, cache.get(pair, req.input.epk))  # type: ignore[union-attr]

        out["session seal+encode"] = _median_us(lambda i: encode_request(sealer.seal_request(reqs[i])), n, runs)
        out["session parse+open"] = _median_us(open_cached, n, runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    print(f"machine: {platform.machine()} {platform.processor() or '?'}, {os.cpu_count()} cpus, "
          f"python {platform.python_version()}, cryptography {cryptography.__version__}")
    print(f"d={a.dim}, {a.requests} requests x {a.runs} runs, median of per-run means, microseconds per request")
    for name, dtype in (("JSON", None), ("<f4", "<f4")):
        m = measure(a.dim, dtype, a.requests, a.runs)
        print(f"{name:5s} " + "  ".join(f"{k} {v:.1f}" for k, v in m.items()))


if __name__ == "__main__":
    main()
