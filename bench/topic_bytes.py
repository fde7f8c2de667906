"""What each add writes to the broker, per topic; and a process's CPU time from /proc.

``snapshot`` reads every topic's end offsets (the topics whose name starts with the prefix);
``written`` counts the records between two snapshots per topic (offsets: no producer here is
transactional, so there are no control records) and reads back what is still there (a fresh
consumer, assigned, no group) for their bytes (key + value + header names and values). The
featurizer trims the raw-input topics (DeleteRecords) as it goes, so some records are gone when
they are read: their bytes are estimated at the mean size of those read (``estimated``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from confluent_kafka import TopicPartition

from unlearn.infra.settings import Settings
from unlearn.runtime import clients

Snapshot = dict[tuple[str, int], int]


def snapshot(s: Settings, timeout: float = 10.0) -> Snapshot:
    """End offset (high watermark) of every partition of every topic named ``<prefix>...``."""
    c = clients.consumer(s, f"bench-offsets-{os.getpid()}")
    try:
        md = c.list_topics(timeout=timeout)
        out: Snapshot = {}
        for name, t in md.topics.items():
            if not name.startswith(s.topic_prefix):
                continue
            for p in t.partitions:
                out[(name, p)] = c.get_watermark_offsets(TopicPartition(name, p), timeout=timeout)[1]
        return out
    finally:
        c.close()


def written(s: Settings, before: Snapshot, after: Snapshot, timeout: float = 30.0) -> dict[str, dict[str, Any]]:
    """{topic (without the prefix): {"records", "bytes", "estimated"}} written between two snapshots."""
    todo = {tp: (before.get(tp, 0), end) for tp, end in after.items() if end > before.get(tp, 0)}
    out: dict[str, dict[str, Any]] = {}
    for (t, _p), (lo, hi) in todo.items():
        row = out.setdefault(t[len(s.topic_prefix):], {"records": 0, "read": 0, "read_bytes": 0})
        row["records"] += hi - lo
    if todo:
        c = clients.consumer(s, f"bench-bytes-{os.getpid()}", **{"auto.offset.reset": "earliest"})
        try:
            c.assign([TopicPartition(t, p, lo) for (t, p), (lo, _) in todo.items()])
            idle_until = time.monotonic() + 3.0
            deadline = time.monotonic() + timeout
            while time.monotonic() < min(deadline, idle_until):
                for m in c.consume(num_messages=1000, timeout=0.5):
                    tp = (m.topic(), m.partition())
                    if m.error() is not None or tp not in todo or not todo[tp][0] <= m.offset() < todo[tp][1]:
                        continue
                    idle_until = time.monotonic() + 3.0
                    row = out[m.topic()[len(s.topic_prefix):]]
                    row["read"] += 1
                    row["read_bytes"] += len(m.key() or b"") + len(m.value() or b"") + sum(
                        len(k) + len(v or b"") for k, v in (m.headers() or []))
        finally:
            c.close()
    return {t: {"records": r["records"], "bytes": r["read_bytes"] * r["records"] / r["read"] if r["read"] else None,
                "estimated": r["read"] < r["records"]} for t, r in out.items()}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (its threads included), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def box_busy_seconds() -> float:
    """CPU time the whole machine spent busy (all CPUs, everything but idle and iowait), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def cpu_now(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process, of this benchmark (``bench``) and of the whole
    box (``box``)."""
    out = {name: cpu_seconds(pid) for name, pid in pids.items()}
    out["bench"] = cpu_seconds(os.getpid())
    out["box"] = box_busy_seconds()
    return out


def cpu_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each counter of :func:`cpu_now` grew by between two readings, and ``rest``: the box's
    time that no named process nor this benchmark spent (the broker, mostly)."""
    spent = {k: after[k] - before[k] for k in after}
    spent["rest"] = spent["box"] - sum(v for k, v in spent.items() if k != "box")
    return spent


def per_add(counts: dict[str, dict[str, Any]], n: int) -> dict[str, Any]:
    """Records and bytes per add, per topic and in all (bytes None: none could be read back)."""
    rows: dict[str, Any] = {t: {"records": v["records"] / n, "bytes": None if v["bytes"] is None else v["bytes"] / n,
                                "estimated": v["estimated"]} for t, v in sorted(counts.items())}
    rows["(all)"] = {"records": sum(v["records"] for v in rows.values()),
                     "bytes": sum(v["bytes"] or 0.0 for v in rows.values()),
                     "estimated": any(v["estimated"] for v in rows.values())}
    return rows
