"""Images through the whole pipeline against the backbone alone, with 1, 2, 4 ... featurizers.

    python -m bench.gpu_pipeline [--device cuda] [--n 4000] [--featurizers 1,2,4] [--heads 8]
                                 [--partitions 8] [--engine tansu|kafka] [--direct] [--json PATH]

Issue 29, part 5: on a GPU the backbone featurizes thousands of images a second, and the pipeline
should carry at least 80% of that. First the backbone alone (EfficientNet-Lite0 on ``--device``,
the featurizer's batch size, median of 3 passes over the images); then, for each count in
``--featurizers``, a fresh topic prefix on one local broker, that many ``unlearn featurizer``
processes in one consumer group and ``--ledgers`` ledger workers in theirs, on ``--device``; one warm-up add per
head (every featurizer loads its backbone), then ``--n`` Fashion-MNIST PNG adds spread over
``--heads`` heads (so over the by-head partitions: a partition is featurized by one process), from
the first produce to the heads counting them all. ``--direct`` produces to the by-head topic
(``UNLEARN_ROUTE_BY_HEAD``). Prints adds/s and the fraction of the backbone's images/s; asserts
nothing. Each run also says how many cores each process kept busy while the adds flowed (the
featurizers together, the ledgers together, this benchmark, the rest of the box: the broker, mostly), which
shows what bounds it. bench/gpu_device.sh runs it on a lent GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import topic_bytes
from bench.app_requests import target
from unlearn.common.families import heads_family
from unlearn.infra.local.engine import ENGINES, describe_engine, local_broker
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.topic_reader import LogRecord, TopicFollower
from unlearn.runtime.topics import create_topics
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.head import decode_head
from unlearn.schemas.request_inputs import ImageInput
from unlearn.streams.featurizer.settings import FeaturizerSettings


def images(n: int) -> tuple[list[bytes], list[int]]:
    """``n`` Fashion-MNIST test images as PNG; random 28 x 28 images where the dataset is not
    installed (the backbone resizes either to 112 px: the same work per image)."""
    import numpy as np

    from bench.featurizer_bench import _png_bytes
    from unlearn.services.demo.datasets import load_fashion_mnist

    try:
        X, y = load_fashion_mnist("test", limit=n)
    except (FileNotFoundError, OSError):
        rng = np.random.default_rng(0)
        X, y = rng.integers(0, 256, (min(n, 1000), 28, 28), dtype=np.uint8), rng.integers(0, 10, min(n, 1000))
    pngs = _png_bytes(X)
    reps = -(-n // len(pngs))
    return (pngs * reps)[:n], [int(v) for v in (list(y) * reps)[:n]]


def backbone_alone(device: str, pngs: list[bytes], batch: int) -> float:
    """Images/s of EfficientNet-Lite0 alone on ``device`` in batches of ``batch`` (median of 3)."""
    from unlearn.features.backbones import get_backbone

    bb = get_backbone("efficientnet-lite0", device=device)
    bb.batch_size = batch
    bb.encode(pngs[:batch])  # warm-up: kernels, allocator
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        bb.encode(pngs)
        times.append(time.perf_counter() - t0)
    return len(pngs) / statistics.median(times)


def backbone_ragged(device: str, pngs: list[bytes], batch: int, pad: bool) -> float:
    """Images/s of the backbone fed as a featurizer feeds it: chunks of 20 sizes between 1 and
    ``batch``, each size new, with or without padding to a few shapes (``Backbone.pads_batches``)."""
    import random

    from unlearn.features.backbones import get_backbone

    bb = get_backbone("efficientnet-lite0", device=device)
    bb.batch_size = batch
    sizes = random.Random(0).sample(range(1, batch + 1), 20)
    chunks = [[pngs[(i * batch + j) % len(pngs)] for j in range(n)] for i, n in enumerate(sizes)]
    setattr(bb, "pads_batches", lambda: pad)  # noqa: B010 (this instance only: the registry's, so undone below)
    try:
        t0 = time.perf_counter()
        for chunk in chunks:
            bb.encode(chunk)
        return sum(sizes) / (time.perf_counter() - t0)
    finally:
        del bb.pads_batches


class Counts:
    """The latest retained count per head, from the heads family."""

    def __init__(self, s: Settings) -> None:
        self.n: dict[str, int] = {}
        self.lock = threading.Lock()
        self.follower = TopicFollower(s, heads_family(s.topic_prefix), self._on, role="bench-heads",
                                      poll_interval=0.01)

    def _on(self, r: LogRecord) -> None:
        h = decode_head(r.value or b"")
        with self.lock:
            self.n[h.head_id] = max(h.n_retained, self.n.get(h.head_id, 0))

    def wait(self, pred: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not pred(dict(self.n)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"heads did not get there in {timeout:g} s: {self.n}")
            time.sleep(0.02)


def pipeline(broker: Any, tmp: str, args: argparse.Namespace, k: int, pngs: list[bytes], labels: list[int]
             ) -> dict[str, Any]:
    """Adds/s end to end with ``k`` featurizer processes (module docstring)."""
    s = Settings.from_env(bootstrap=broker.bootstrap, topic_prefix=f"gpu{k}.", data_dir=f"{tmp}/{k}",
                          partitions=args.partitions, device=args.device, profile=args.engine)
    create_topics(s)
    logs = Path(tmp) / f"logs{k}"
    procs = [ServiceProcess(f"featurizer{i}", ["featurizer"], s, logs) for i in range(k)]
    procs += [ServiceProcess(f"ledger{i}", ["ledger"], s, logs) for i in range(args.ledgers)]
    counts = Counts(s)
    p = clients.producer(s, **{"linger.ms": 5})
    heads = [f"img{h}" for h in range(args.heads)]

    def add(i: int, head: str, png: bytes, label: int) -> None:
        req = Request(f"{head}.a{i}", "add", head, "bench", f"u{i % 97}", f"s{i}", label, ImageInput(png), time.time())
        while True:
            try:
                p.produce(key=req.subject_id.encode(), value=encode_request(req), **target(s, head, args.direct))
                return
            except BufferError:
                p.poll(0.05)

    try:
        for proc in procs:
            proc.start()
        counts.follower.start(wait_assigned=60)
        for j, head in enumerate(heads):  # warm-up: every featurizer loads its backbone
            add(-1 - j, head, pngs[0], labels[0])
        p.flush(60)
        counts.wait(lambda n: all(n.get(h, 0) >= 1 for h in heads), args.timeout)
        pids = {proc.name: proc.proc.pid for proc in procs if proc.proc is not None}
        cpu0 = topic_bytes.cpu_now(pids)
        t0 = time.time()
        for i, (png, label) in enumerate(zip(pngs, labels, strict=True)):
            add(i, heads[i % len(heads)], png, label)
            p.poll(0)
        p.flush(60)
        counts.wait(lambda n: sum(n.get(h, 0) for h in heads) >= len(pngs) + len(heads), args.timeout)
        dt = time.time() - t0
        cpu1 = topic_bytes.cpu_now(pids)
    finally:
        counts.follower.stop()
        for proc in procs:
            proc.stop()
    cores = {key: v / dt for key, v in topic_bytes.cpu_spent(cpu0, cpu1).items()}
    split = {"featurizers": sum(v for key, v in cores.items() if key.startswith("featurizer")),
             "ledgers": sum(v for key, v in cores.items() if key.startswith("ledger")),
             "bench": cores["bench"], "rest": cores["rest"]}
    return {"featurizers": k, "ledgers": args.ledgers, "adds": len(pngs), "seconds": dt,
            "adds_per_s": len(pngs) / dt, "cores": split, "cores_per_process": cores}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=4000, help="image adds per featurizer count")
    ap.add_argument("--featurizers", default="1,2,4", help="comma list of featurizer process counts")
    ap.add_argument("--ledgers", type=int, default=1,
                    help="ledger workers (a head at d = 1280 costs one ~0.5 ms of CPU per add)")
    ap.add_argument("--heads", type=int, default=8, help="heads the adds are spread over")
    ap.add_argument("--partitions", type=int, default=8, help="partitions of the topics (>= the most featurizers)")
    ap.add_argument("--engine", choices=ENGINES, default="tansu")
    ap.add_argument("--direct", action="store_true", help="produce to requests.by-head (UNLEARN_ROUTE_BY_HEAD)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--ragged", action="store_true", help="also the backbone alone on batches of ever new sizes")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    batch = FeaturizerSettings.from_env().batch_max_events
    pngs, labels = images(args.n)
    print(f"machine: {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}; "
          f"broker: {describe_engine(args.engine)}; device {args.device}; {args.n} images, {args.heads} heads, "
          f"{args.partitions} partitions, batch {batch}", flush=True)
    alone = backbone_alone(args.device, pngs, batch)
    print(f"backbone alone (efficientnet-lite0 on {args.device}, batch {batch}): {alone:,.0f} images/s", flush=True)
    ragged = {}
    if args.ragged:
        for pad in (True, False):
            ragged["padded" if pad else "as_is"] = backbone_ragged(args.device, pngs, batch, pad)
        print(f"backbone alone in 20 batches of new sizes 1-{batch}: {ragged['as_is']:,.0f} images/s as they come, "
              f"{ragged['padded']:,.0f} padded to powers of two", flush=True)
    out: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "json"}, "batch": batch,
                           "backbone_images_per_s": alone, "ragged": ragged, "runs": []}
    with tempfile.TemporaryDirectory() as tmp, local_broker(args.engine) as broker:
        for k in [int(x) for x in args.featurizers.split(",") if x]:
            r = pipeline(broker, tmp, args, k, pngs, labels)
            r["of_backbone"] = r["adds_per_s"] / alone
            out["runs"].append(r)
            print(f"{k} featurizer(s): {r['adds_per_s']:,.0f} adds/s end to end ({r['seconds']:.1f} s) = "
                  f"{r['of_backbone']:.0%} of the backbone alone; cores busy: "
                  + ", ".join(f"{name} {v:.2f}" for name, v in r["cores"].items()), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
