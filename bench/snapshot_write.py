"""What writing a head's snapshot costs the ledger's poll thread: a checkpoint's writer thread
encodes, hashes and cuts each head's state (``ChangelogStore.write_snapshot``) while the poll
thread goes on, so every millisecond the writer holds the GIL in one piece is a stall of the
poll thread, and of the deletes it folds.

Prints, per d, medians of repeats: the writer's CPU time, and the longest gap a thread that
sleeps 0.2 ms at a time saw while it ran (a stand-in for the poll thread), for the write as the
store does it (the state's buffers cut into pieces) and, side by side, with the blob joined
whole first (``encode_state``). bench/results/pipeline_bench.md section 30 quotes it.

    python -m bench.snapshot_write [--dims 768,2048] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from unlearn.ledger import ExactLedger, Quantizer, l2_normalize
from unlearn.streams.ledger.snapshots import HeadMeta, HeadState, encode_state, split_pieces, state_buffers, state_sha

PIECE_BYTES = 1_000_000  # the changelog's default piece limit (UNLEARN_CHANGELOG_MAX_BYTES)


def head_state(d: int, c: int = 10, rows: int = 200, seed: int = 0) -> HeadState:
    """A head of ``rows`` quantized rows (every limb of S nonzero, as in a served head)."""
    rng = np.random.default_rng(seed)
    led = ExactLedger(d, c)
    led.add(Quantizer().quantize(l2_normalize(rng.normal(size=(rows, d)))), rng.integers(0, c, rows))
    return HeadState(HeadMeta("h", 1.0, 1, rows, rows - 1, 0, 0.0, {}, 1), led, None)


def as_the_store_writes(state: HeadState) -> list[bytes]:
    buffers = state_buffers(state)
    return split_pieces(buffers, 1, 0, PIECE_BYTES, state_sha(buffers))


def joined_first(state: HeadState) -> list[bytes]:
    blob = encode_state(state)
    return split_pieces(blob, 1, 0, PIECE_BYTES, state_sha(blob))


def measure(write: Callable[[HeadState], list[bytes]], state: HeadState, repeats: int) -> dict[str, Any]:
    """The writer's CPU ms and the ticking thread's longest gap (ms), medians and maxima."""
    gaps: list[float] = []
    done = threading.Event()

    def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.0002)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    write(state)  # warm: allocator and caches
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    cpu, longest = [], []
    for _ in range(repeats):
        time.sleep(0.01)
        gaps.clear()
        t = time.thread_time()
        pieces = write(state)
        cpu.append(time.thread_time() - t)
        time.sleep(0.005)
        longest.append(max(gaps))
    done.set()
    ticker.join()
    return {"mb": sum(map(len, pieces)) / 1e6, "cpu_ms": 1e3 * statistics.median(cpu),
            "gap_ms": 1e3 * statistics.median(longest), "gap_max_ms": 1e3 * max(longest)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="768,2048")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    for d in (int(x) for x in args.dims.split(",")):
        state = head_state(d)
        for name, write in (("pieces from buffers", as_the_store_writes), ("blob joined first", joined_first)):
            r = measure(write, state, args.repeats)
            print(f"d={d:>5} {name:20s}: {r['mb']:.1f} MB, writer CPU {r['cpu_ms']:.1f} ms, longest stall of "
                  f"another thread {r['gap_ms']:.1f} ms (max {r['gap_max_ms']:.1f})")


if __name__ == "__main__":
    main()
