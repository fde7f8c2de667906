"""Cost of one erasure rotation (docs/ledger-processor.md, "Erasure rotation").

    python -m bench.erasure_rotation_bench [--d 768] [--classes 10] [--heads 1 2 4] [--rows 64]

A local broker and one ledger worker process (one ``deltas`` partition, so every head shares it).
For each head count: adds of ``--rows`` random rows to each head, then one delete on one head;
the worker rotates the partition ``UNLEARN_ERASURE_ROTATE_SECONDS`` (here 1 s) later and logs the
rotation's wall time and the bytes it wrote (a full snapshot of every head into the new
ledger-state generation, every head republished into the new heads generation). Also reported:
seconds from producing the delete to the last pre-delete generation gone from the broker (the
window, the rotation and the heads' retire grace, 3 s here). Prints one line per head count.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from unlearn.common.families import heads_family, state_family
from unlearn.infra.local.tansu import LocalBroker
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.ledger import Quantizer, l2_normalize
from unlearn.runtime import clients
from unlearn.runtime.topics import create_topics, prefixed_topics
from unlearn.schemas.delta_codec import Delta, RowsEntry, encode_delta

_DONE = re.compile(r"erasure rotation done: (\d+) heads in ([0-9.]+)s \((\d+) state bytes, (\d+) head bytes")


def run_one(broker: LocalBroker, root: Path, n_heads: int, d: int, classes: int, rows: int) -> str:
    s = Settings.from_env(bootstrap=broker.bootstrap, profile="tansu", topic_prefix=f"erasure{n_heads}.",
                          partitions=1, data_dir=str(root / "data"), erasure_rotate_seconds=1.0,
                          heads_retire_seconds=3.0, max_message_bytes=64_000_000)
    create_topics(s)
    rng = np.random.default_rng(n_heads)
    worker = ServiceProcess(f"ledger{n_heads}", ["ledger", "--loglevel", "info"], s, root).start()
    p = clients.producer(s)
    try:
        worker.wait_for_log("unlearn ledger ready", timeout=120)
        first: tuple[np.ndarray, np.ndarray] | None = None
        for h in range(n_heads):
            Q = Quantizer().quantize(l2_normalize(rng.normal(size=(rows, d))))
            y = rng.integers(0, classes, rows)
            y[0] = classes - 1  # every head has c outputs
            ids = [f"h{h}-s{i}" for i in range(rows)]
            entry = RowsEntry(+1, [f"add-{i}" for i in ids], ids, ["u"] * rows, y, Q)
            p.produce(s.topic("deltas"), key=f"h{h}".encode(), value=encode_delta(Delta(f"h{h}", "b", d, 30, 0,
                                                                                         (entry,))))
            if first is None:
                first = (Q[:1], y[:1])
        assert p.flush(60) == 0
        time.sleep(8.0)  # applied and checkpointed (every 5 s)
        stem = [f.topic(0, 0).rsplit(".g", 1)[0] for f in (state_family(s.topic_prefix), heads_family(s.topic_prefix))]
        old = {t for t in prefixed_topics(s) if t.rsplit(".g", 1)[0] in stem}
        assert first is not None
        t0 = time.monotonic()
        entry = RowsEntry(-1, ["del-h0-s0"], ["h0-s0"], ["u"], first[1], first[0])
        p.produce(s.topic("deltas"), key=b"h0", value=encode_delta(Delta("h0", "b", d, 30, 0, (entry,))))
        assert p.flush(60) == 0
        worker.wait_for_log("erasure rotation done", timeout=120)
        while old & set(prefixed_topics(s)):
            time.sleep(0.1)
        gone = time.monotonic() - t0
        m = _DONE.search(worker.log_path.read_text())
        assert m is not None
        heads, secs, state_b, head_b = int(m[1]), float(m[2]), int(m[3]), int(m[4])
        return (f"heads={heads} d={d} c={classes}: rotation {secs:.3f} s, {state_b / 1e6:.1f} MB snapshot + "
                f"{head_b / 1e6:.1f} MB head updates ({(state_b + head_b) / heads / 1e6:.1f} MB per head); "
                f"delete -> pre-delete generations gone {gone:.1f} s (window 1 s + retire grace 3 s)")
    finally:
        worker.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.erasure_rotation_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--heads", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        broker = LocalBroker().start()
        try:
            for n in args.heads:
                print(run_one(broker, Path(tmp), n, args.d, args.classes, args.rows), flush=True)
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
