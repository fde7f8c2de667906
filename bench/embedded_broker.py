"""Which local broker should ``make demo`` start? tansu against a one-node Apache Kafka, measured.

    python -m bench.embedded_broker [--rounds 2] [--starts 3] [--demo-args "--n-train 600 ..."] [--json PATH]

For each engine of ``infra.local.engine`` (alternating, so a busy moment of a shared box hits
both): the broker's start time (``start()`` until it answers a metadata request) and its resident
memory right after (``VmRSS`` of the broker process), ``--starts`` times; then ``--rounds`` runs of
``unlearn demo --engine E`` as a child process (what ``make demo`` runs, with ``--demo-args``):
its wall time, the demo's own ``ok``, the broker's start time as the demo saw it, and the broker
process's peak resident memory during the demo (sampled every 0.5 s from /proc). Prints a table,
asserts nothing. docs/design.md, "The embedded broker", has the decision these numbers made.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from unlearn.infra.local.engine import ENGINES, describe_engine, local_broker

#: What marks a broker process in /proc/<pid>/cmdline (tansu's binary; a Kafka node's main class).
_BROKER_MARKS = (b"tansu", b"kafka.Kafka\x00")


def rss_mb(pid: int) -> float:
    """Resident memory of one process in MiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def broker_pids(root: int) -> list[int]:
    """Descendants of ``root`` that are broker processes."""
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        for k in kids.get(pid, []):
            todo.append(k)
            try:
                cmd = Path(f"/proc/{k}/cmdline").read_bytes()
            except OSError:
                continue
            if any(m in cmd for m in _BROKER_MARKS) and b"unlearn.services.cli" not in cmd:
                out.append(k)
    return out


def measure_start(engine: str) -> dict[str, float]:
    """Seconds from ``start()`` to a broker that answers, and its RSS right after."""
    broker = local_broker(engine)
    t0 = time.monotonic()
    broker.start()
    took = time.monotonic() - t0
    try:
        pids = broker_pids(os.getpid())
        return {"start_s": took, "rss_mb": sum(rss_mb(p) for p in pids)}
    finally:
        broker.stop()


def measure_demo(engine: str, demo_args: list[str], out: Path) -> dict[str, Any]:
    """One ``unlearn demo --engine E`` run: wall time, ok, broker start as the demo saw it, peak RSS."""
    cmd = [sys.executable, "-m", "unlearn.services.cli", "demo", "--engine", engine, "--out", str(out), *demo_args]
    log = open(out.with_suffix(".log"), "wb")  # noqa: SIM115 - closed below, after the child
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    peak = 0.0
    try:
        while proc.poll() is None:
            peak = max(peak, sum(rss_mb(p) for p in broker_pids(proc.pid)))
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()
    wall = time.monotonic() - t0
    try:
        rep = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        rep = {}
    tail = ""
    if not rep.get("ok"):  # why, for the record (the run's directory may be temporary)
        lines = out.with_suffix(".log").read_text(errors="replace").splitlines()
        tail = "\n".join(x for x in lines if not x.startswith("%"))[-3000:]
    return {"wall_s": wall, "exit": proc.returncode, "ok": bool(rep.get("ok")), "peak_rss_mb": peak, "log_tail": tail,
            "broker_start_s": rep.get("broker_start_s"), "throughput_events_per_s": rep.get("throughput_events_per_s"),
            "delete_to_receipt_ms": rep.get("delete_to_receipt_ms")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                       "python": platform.python_version(), "loadavg_start": os.getloadavg()},
                           "config": {"starts": args.starts, "rounds": args.rounds, "demo_args": args.demo_args},
                           "engines": {e: {"broker": describe_engine(e), "starts": [], "demos": []} for e in ENGINES}}
    for _ in range(args.starts):
        for e in ENGINES:
            out["engines"][e]["starts"].append(measure_start(e))
    with tempfile.TemporaryDirectory(prefix="unlearn-embedded-") as tmp_dir:
        tmp = args.workdir or Path(tmp_dir)
        tmp.mkdir(parents=True, exist_ok=True)
        for r in range(args.rounds):
            for e in ENGINES:
                res = measure_demo(e, shlex.split(args.demo_args), Path(tmp) / f"{e}{r}")
                res["loadavg"] = os.getloadavg()
                out["engines"][e]["demos"].append(res)
                print(f"demo on {e}, round {r + 1}: {res['wall_s']:.1f} s, ok={res['ok']}, "
                      f"peak broker RSS {res['peak_rss_mb']:.0f} MiB", flush=True)
    out["machine"]["loadavg_end"] = os.getloadavg()
    return out


def render(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [f"# embedded broker: {m['cpus']} CPUs, {m['platform']}, Python {m['python']}; load average "
             f"{m['loadavg_start'][0]:.2f} -> {m['loadavg_end'][0]:.2f}",
             f"# {res['config']['starts']} starts and {res['config']['rounds']} demo runs per engine, alternating; "
             f"demo args: {res['config']['demo_args']!r}",
             "| engine | start s (median; runs) | RSS after start MiB | demo wall s (runs) | demo ok | "
             "peak broker RSS in the demo MiB |",
             "|---|---|---|---|---|---|"]
    for r in res["engines"].values():
        st = [x["start_s"] for x in r["starts"]]
        rss = [x["rss_mb"] for x in r["starts"]]
        walls = [x["wall_s"] for x in r["demos"]]
        peaks = [x["peak_rss_mb"] for x in r["demos"]]
        lines.append(f"| {r['broker']} | {statistics.median(st):.1f} ({', '.join(f'{x:.1f}' for x in st)}) | "
                     f"{statistics.median(rss):.0f} | "
                     f"{statistics.median(walls) if walls else float('nan'):.1f} "
                     f"({', '.join(f'{x:.1f}' for x in walls)}) | "
                     f"{sum(x['ok'] for x in r['demos'])}/{len(walls)} | {max(peaks) if peaks else 0:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.embedded_broker", description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=3, help="broker starts per engine")
    ap.add_argument("--rounds", type=int, default=2, help="demo runs per engine")
    ap.add_argument("--demo-args", default="", help="extra `unlearn demo` arguments, one string")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--workdir", type=Path, help="keep the demo runs' output here (default: a temp dir)")
    args = ap.parse_args(argv)
    res = run(args)
    print(render(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
