"""The featurizer's backbones on CUDA and on CPU over the same inputs (the GPU device check).

For EfficientNet-Lite0 (Fashion-MNIST test images as PNG, or sklearn digits where Fashion-MNIST is
absent) and MiniLM (tweets), on each device: items/s (median of the timed repeats, batch 128, the
way the featurizer calls ``Backbone.encode``), peak GPU memory, and how the quantized rows
``q = rint(normalize(f) * 2^k)`` differ: between CUDA and CPU, between two CUDA runs, and between
batch 1 and batch 128 on each device. The exact ledger is only as reproducible as q, so these three
comparisons say which replays recompute the same q (docs/featurizer.md, "Devices").

    python -m bench.gpu_check [--images 1024] [--texts 2048] [--repeats 3] [--json out.json]

Without CUDA it says so and exits 2: it never reports a CPU run as a GPU one.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

BATCH = 128
SMALL_BATCH_ITEMS = 64


def _images(n: int) -> tuple[str, list[bytes]]:
    """PNG bytes of real images: what the featurizer receives."""
    from PIL import Image

    from unlearn.services.demo.datasets import DatasetUnavailableError, load_digits, load_fashion_mnist

    try:
        X, _ = load_fashion_mnist("test", limit=n)
        source = "fashion-mnist test"
    except DatasetUnavailableError:
        D, _ = load_digits("test")
        X = np.clip(D[:n] * 16, 0, 255).astype(np.uint8).reshape(-1, 8, 8)
        source = "sklearn digits"
    out = []
    for x in X:
        buf = io.BytesIO()
        Image.fromarray(x).save(buf, format="PNG")
        out.append(buf.getvalue())
    return source, out


def _texts(n: int) -> tuple[str, list[str]]:
    from unlearn.services.demo.datasets import load_tweets

    T, _ = load_tweets("test", limit=n)
    return "tweets test", [str(t) for t in T]


def _encode_timed(bb: Any, items: list[Any], repeats: int) -> tuple[np.ndarray, list[float]]:
    import torch

    bb.encode(items[:BATCH])  # warm-up: lazy init, cuDNN autotuning, allocator
    times, F = [], np.zeros(0)
    for _ in range(repeats):
        t0 = time.perf_counter()
        F = bb.encode(items)  # returns host numpy: the device work is finished when it returns
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return F, times


def _q(F: np.ndarray, frac_bits: int) -> np.ndarray:
    """The featurizer's rows, through the contract's own batch function (rows refused: error)."""
    from unlearn.features.contract import quantize_feature_rows

    rows = quantize_feature_rows(np.asarray(F, dtype=np.float64), frac_bits)
    bad = [r for r in rows if not isinstance(r, np.ndarray)]
    if bad:
        raise RuntimeError(f"{len(bad)} rows refused by the contract: {bad[0]}")
    return np.stack(rows)


def compare_q(Fa: np.ndarray, Fb: np.ndarray, frac_bits: int) -> dict[str, Any]:
    """How two encodings of the same inputs differ, in floats and in grid steps of q."""
    Qa, Qb = _q(Fa, frac_bits), _q(Fb, frac_bits)
    steps = np.abs(Qa - Qb)
    per_row = steps.max(axis=1)
    return {
        "rows": int(Qa.shape[0]),
        "rows_identical": int((per_row == 0).sum()),
        "rows_differing": int((per_row > 0).sum()),
        "components_differing": int((steps > 0).sum()),
        "components": int(steps.size),
        "max_steps": int(steps.max()) if steps.size else 0,
        "median_row_max_steps": float(np.median(per_row)) if per_row.size else 0.0,
        "max_abs_float_diff": float(np.abs(Fa.astype(np.float64) - Fb.astype(np.float64)).max()),
        "max_rel_float_diff": float(
            (np.abs(Fa.astype(np.float64) - Fb.astype(np.float64)).max(axis=1)
             / np.maximum(np.abs(Fb.astype(np.float64)).max(axis=1), 1e-30)).max()),
    }


def check_backbone(name: str, items: list[Any], source: str, repeats: int, frac_bits: int) -> dict[str, Any]:
    """One backbone: throughput on each device, peak GPU memory, the q comparisons."""
    import torch

    from unlearn.features.backbones import get_backbone

    row: dict[str, Any] = {"backbone": name, "inputs": source, "items": len(items), "batch_size": BATCH}
    enc: dict[str, np.ndarray] = {}
    for device in ("cuda", "cpu"):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        bb = get_backbone(name, device=device)
        bb.batch_size = BATCH
        load_s = time.perf_counter() - t0
        F, times = _encode_timed(bb, items, repeats)
        enc[device] = F
        med = statistics.median(times)
        row[device] = {"load_s": load_s, "median_s": med, "items_per_s": len(items) / med, "repeats": repeats}
        bb.batch_size = 1
        F1 = bb.encode(items[:SMALL_BATCH_ITEMS])
        bb.batch_size = BATCH
        row[f"{device}_batch1_vs_batch128"] = compare_q(F1, F[:SMALL_BATCH_ITEMS], frac_bits)
        if device == "cuda":
            row["cuda"]["peak_memory_mib"] = torch.cuda.max_memory_allocated() / 2**20
            row["cuda"]["peak_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
            F2 = bb.encode(items)
            row["cuda_vs_cuda_rerun"] = compare_q(F, F2, frac_bits)
        print(f"{name:20s} {device:4s} {len(items) / med:9.1f} items/s  (median of {repeats}, batch {BATCH}, "
              f"load {load_s:.1f} s)", flush=True)
    row["cuda_vs_cpu"] = compare_q(enc["cuda"], enc["cpu"], frac_bits)
    if name == "efficientnet-lite0":
        # The backbones run CUDA in full float32 (features.backbones.registry.full_fp32_on_cuda);
        # measure what cuDNN's default TF32 convolutions would do instead.
        bb = get_backbone(name, device="cuda")
        torch.backends.cudnn.allow_tf32 = True
        try:
            Ftf, times = _encode_timed(bb, items, repeats)
            bb.batch_size = 1
            F1 = bb.encode(items[:SMALL_BATCH_ITEMS])
            bb.batch_size = BATCH
            row["cuda_tf32"] = {"items_per_s": len(items) / statistics.median(times),
                                "vs_cpu": compare_q(Ftf, enc["cpu"], frac_bits),
                                "batch1_vs_batch128": compare_q(F1, Ftf[:SMALL_BATCH_ITEMS], frac_bits)}
        finally:
            torch.backends.cudnn.allow_tf32 = False
        print(f"  with TF32 convolutions: {row['cuda_tf32']['items_per_s']:.1f} items/s, max |df| vs cpu "
              f"{row['cuda_tf32']['vs_cpu']['max_abs_float_diff']:.3g}", flush=True)
    for key in ("cuda_vs_cpu", "cuda_vs_cuda_rerun", "cuda_batch1_vs_batch128", "cpu_batch1_vs_batch128"):
        c = row[key]
        print(f"  {key:24s} rows identical {c['rows_identical']}/{c['rows']}, max {c['max_steps']} grid steps, "
              f"max |df| {c['max_abs_float_diff']:.3g}", flush=True)
    return row


def machine() -> dict[str, Any]:
    import platform

    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "cpu_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=p.total_memory / 2**30, sm_count=p.multi_processor_count,
                    cudnn=torch.backends.cudnn.version(), torch_default_cudnn_tf32=torch.backends.cudnn.allow_tf32,
                    torch_default_matmul_tf32=torch.backends.cuda.matmul.allow_tf32)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--texts", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--frac-bits", type=int, default=30, help="the grid of q (UNLEARN_FRAC_BITS default)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import torch

    info = machine()
    print(json.dumps(info), flush=True)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check (this script never reports a CPU run as a GPU one)", file=sys.stderr)
        return 2
    rows = []
    src, imgs = _images(args.images)
    rows.append(check_backbone("efficientnet-lite0", imgs, src, args.repeats, args.frac_bits))
    src, texts = _texts(args.texts)
    rows.append(check_backbone("minilm", texts, src, args.repeats, args.frac_bits))
    result = {"machine": info, "frac_bits": args.frac_bits, "backbones": rows}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
