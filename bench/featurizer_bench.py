"""Featurizer throughput: request parsing per feature encoding, and MiniLM (text) and
EfficientNet-Lite0 (image) on real offline data.

Wire section: what a precomputed feature vector costs the featurizer before judging, per event
(``parse_request`` + ``quantize_feature_row``), sent as JSON numbers or as ``features_bin``
float64 / float32, at ``--dim`` (768 by default).

Backbones: end-to-end ``Backbone.encode`` as the featurizer calls it: for images that includes PNG
decode, grayscale->RGB and resize to 112 px (the featurizer receives encoded bytes); for text,
tokenization. Reports items/s, median of several timed repeats after one warm-up.

    python -m bench.featurizer_bench [--quick] [--devices cpu,cuda] [--dim 768] [--wire-only] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import time
from typing import Any

import numpy as np

BATCH_SIZES = (32, 128)


def machine_info() -> dict[str, Any]:
    """What the numbers depend on (printed with every run so results are comparable)."""
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
        info["cuda_version"] = torch.version.cuda
    return info


def _png_bytes(images: np.ndarray) -> list[bytes]:
    from PIL import Image

    out = []
    for im in images:
        buf = io.BytesIO()
        Image.fromarray(im).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def _time_encode(backbone: Any, inputs: list[Any], repeats: int) -> list[float]:
    backbone.encode(inputs[: min(len(inputs), backbone.batch_size)])  # warm-up (lazy init, caches)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        backbone.encode(inputs)
        times.append(time.perf_counter() - t0)
    return times


def wire_costs(dim: int = 768, n: int = 2000, repeats: int = 5) -> list[dict[str, Any]]:
    """Per event, for each SDK feature encoding: request bytes, and the median over ``repeats``
    of parsing ``n`` requests and of quantizing their vectors (frac_bits 30, L2-normalized) as
    the featurizer does (float64; a float32 vector widened first)."""
    from unlearn.features.contract import quantize_feature_row
    from unlearn.schemas.envelope import Request, encode_request, parse_request
    from unlearn.schemas.request_inputs import FeaturesInput
    from unlearn.services.client.sdk import FEATURES_ENCODINGS

    X = np.random.default_rng(0).normal(size=(n, dim))
    rows = []
    for name, dtype in FEATURES_ENCODINGS.items():
        msgs = [encode_request(Request(f"e{i}", "add", "h", "c", f"u{i % 97}", f"s{i}", i % 10,
                                       FeaturesInput(X[i], dtype))) for i in range(n)]
        parse_s, quantize_s = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            reqs = [parse_request(m) for m in msgs]
            t1 = time.perf_counter()
            for r in reqs:
                assert isinstance(r.input, FeaturesInput)
                quantize_feature_row(np.asarray(r.input.values, dtype=np.float64), 30)
            parse_s.append(t1 - t0)
            quantize_s.append(time.perf_counter() - t1)
        parse_us = statistics.median(parse_s) / n * 1e6
        quantize_us = statistics.median(quantize_s) / n * 1e6
        size = float(np.mean([len(m) for m in msgs]))
        rows.append({"encoding": name, "dtype": dtype, "dim": dim, "events": n, "repeats": repeats,
                     "bytes_per_request": size, "parse_us": parse_us, "quantize_us": quantize_us,
                     "events_per_s": 1e6 / (parse_us + quantize_us)})
        print(f"wire {name:4s} d={dim:<5d} {size:8,.0f} B/request  parse {parse_us:6.1f} us  quantize "
              f"{quantize_us:5.1f} us  -> {1e6 / (parse_us + quantize_us):8,.0f} events/s on one core", flush=True)
    return rows


def run(devices: list[str], quick: bool) -> list[dict[str, Any]]:
    """Benchmark each (backbone, device, batch size); returns one row per combination."""
    from unlearn.features.backbones import get_backbone
    from unlearn.services.demo.datasets import load_fashion_mnist, load_tweets

    n_items = 128 if quick else 1024
    repeats = 3 if quick else 5
    texts = list(load_tweets("test", limit=n_items)[0])
    images = _png_bytes(load_fashion_mnist("test", limit=n_items)[0])
    rows = []
    for device in devices:
        for name, inputs, note in (
            ("minilm", texts, "tweets, tokenize+encode"),
            ("efficientnet-lite0", images, "Fashion-MNIST PNG, decode+112px+encode"),
        ):
            t0 = time.perf_counter()
            bb = get_backbone(name, device=device)
            load_s = time.perf_counter() - t0
            original = bb.batch_size
            try:
                for bs in BATCH_SIZES:
                    bb.batch_size = bs
                    times = _time_encode(bb, inputs, repeats)
                    med = statistics.median(times)
                    rows.append({
                        "backbone": bb.cache_key, "device": bb.device, "batch_size": bs,
                        "items": len(inputs), "repeats": repeats, "median_s": med,
                        "items_per_s": len(inputs) / med, "min_s": min(times), "load_s": load_s,
                        "input": note,
                    })
                    print(f"{bb.cache_key:26s} {bb.device:7s} bs={bs:<4d} n={len(inputs):<5d} "
                          f"{len(inputs) / med:9.1f} items/s  (median {med:.3f}s of {repeats}, "
                          f"load {load_s:.1f}s)", flush=True)
            finally:
                bb.batch_size = original
    return rows


def main(argv: list[str] | None = None) -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="128 items x 3 repeats (CI smoke run)")
    ap.add_argument("--devices", default="", help="comma list; default cpu plus cuda when present")
    ap.add_argument("--dim", type=int, default=768, help="feature dimension of the wire section")
    ap.add_argument("--wire-only", action="store_true", help="only the wire section (no backbones)")
    ap.add_argument("--json", default="", help="also write machine info and rows to this file")
    args = ap.parse_args(argv)
    devices = [d for d in args.devices.split(",") if d] or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])

    info = machine_info()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    wire = wire_costs(args.dim, 500 if args.quick else 2000, 3 if args.quick else 5)
    rows = [] if args.wire_only else run(devices, args.quick)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": info, "quick": args.quick, "wire": wire, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
