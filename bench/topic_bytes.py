"""What each add writes to the broker, per topic; and a process's CPU time from /proc.

``snapshot`` reads every topic's end offsets (the topics whose name starts with the prefix);
``written`` reads the records between two snapshots back (a fresh consumer, assigned, no group)
and counts records and bytes (key + value + header names and values) per topic. Offsets alone
would count transaction markers too; reading the records counts only what a client wrote.
"""

from __future__ import annotations

import os
import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from unlearn.infra.settings import Settings, consumer_config

Snapshot = dict[tuple[str, int], int]


def snapshot(s: Settings, timeout: float = 10.0) -> Snapshot:
    """End offset (high watermark) of every partition of every topic named ``<prefix>...``."""
    c = Consumer(consumer_config(s, f"bench-offsets-{os.getpid()}"))
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


def written(s: Settings, before: Snapshot, after: Snapshot, timeout: float = 60.0) -> dict[str, dict[str, int]]:
    """{topic (without the prefix): {"records": n, "bytes": b}} written between two snapshots."""
    todo = {tp: (before.get(tp, 0), end) for tp, end in after.items() if end > before.get(tp, 0)}
    out: dict[str, dict[str, int]] = {}
    if not todo:
        return out
    c = Consumer(consumer_config(s, f"bench-bytes-{os.getpid()}"))
    try:
        c.assign([TopicPartition(t, p, lo) for (t, p), (lo, _) in todo.items()])
        left = set(todo)
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error() is not None:
                    continue
                tp = (m.topic(), m.partition())
                if tp not in todo or m.offset() >= todo[tp][1]:
                    continue
                row = out.setdefault(m.topic()[len(s.topic_prefix):], {"records": 0, "bytes": 0})
                row["records"] += 1
                row["bytes"] += len(m.key() or b"") + len(m.value() or b"") + sum(
                    len(k) + len(v or b"") for k, v in (m.headers() or []))
                if m.offset() + 1 >= todo[tp][1]:
                    left.discard(tp)
        return out
    finally:
        c.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (its threads included), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_add(counts: dict[str, dict[str, int]], n: int) -> dict[str, Any]:
    """Records and bytes per add, per topic and in all."""
    rows = {t: {"records": v["records"] / n, "bytes": v["bytes"] / n} for t, v in sorted(counts.items())}
    rows["(all)"] = {"records": sum(v["records"] for v in rows.values()),
                     "bytes": sum(v["bytes"] for v in rows.values())}
    return rows
