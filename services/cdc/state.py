"""What `unlearn cdc` keeps on disk beside Connect's offsets, and when it may (re)start Debezium.

**The snapshot floor.** Debezium dates a snapshot read when it reads the row, after the WAL point
the snapshot stands for; a change committed while the snapshot ran is streamed after it but may be
dated earlier, and remove wins in event time would let the stale read beat that change's delete.
So every streamed change is dated no earlier than the last snapshot read + 1 us. The floor is saved
before the change offsets are committed, so a re-read change gets the same date (same content).

**No second snapshot.** Debezium snapshots again when its offsets do not record a completed
snapshot (a crash while it ran, or lost offsets) and then streams from the new snapshot's point:
deletes between the two are never sent, and a row deleted there stays in the head. So Debezium is
(re)started only on a fresh slot with no offsets, or on a slot with offsets past the snapshot;
anything else is refused with what to do (docs/cdc.md, "Faults").
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from .postgres import CdcSourceError

__all__ = ["check_resumable", "offsets_state", "read_floor", "write_floor"]

_VALUE = re.compile(rb"\{[^{}]*\"(?:lsn|lsn_proc|ts_usec)\"[^{}]*\}")


def read_floor(path: Path) -> int:
    """The saved floor (0 when none)."""
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return 0


def write_floor(path: Path, floor: int) -> None:
    """Save the floor durably (write, fsync, rename)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(str(floor))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def offsets_state(path: Path) -> str:
    """``none`` (no offsets), ``snapshotting`` (the newest offset is inside a snapshot) or
    ``streaming``, read from Connect's offsets file (a Java-serialized map whose values are the
    JSON of Debezium's source offsets)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return "none"
    values = _VALUE.findall(raw)
    if not values:
        return "none"
    last = values[-1]
    in_snapshot = b'"snapshot"' in last and b'"last_snapshot_record":true' not in last
    completed = b'"snapshot_completed":true' in last
    return "snapshotting" if in_snapshot and not completed else "streaming"


def check_resumable(state_dir: Path, slot_there: bool, slot: str) -> None:
    """Raise ``CdcSourceError`` unless starting Debezium now cannot snapshot over a stream."""
    state = offsets_state(state_dir / "connect.offsets")
    if not slot_there and state == "none":
        return  # the first start: slot, snapshot, stream
    if slot_there and state == "streaming":
        return  # a restart: resume from the offsets and the slot
    why = {("none", True): "the replication slot exists but there are no source offsets (lost, or the first "
                           "start stopped before Connect saved any)",
           ("snapshotting", True): "the previous start stopped before its snapshot completed",
           ("streaming", False): "there are source offsets but no replication slot (the WAL since then is gone)",
           ("snapshotting", False): "there are snapshot offsets but no replication slot"}[(state, slot_there)]
    raise CdcSourceError(
        f"cannot resume: {why} in {state_dir}; a new snapshot would not see the rows deleted meanwhile. Start "
        f"over: `unlearn cdc ... --drop-slot`, remove {state_dir}, and feed a fresh head (docs/cdc.md, Faults)")
