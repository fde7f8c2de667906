"""``unlearn verify``: replay a head's deltas through the pure exact ledger and certify the live head.

What it checks (docs/verifier.md has the full story):

1. **Replay in log order** with the live ledger's rules (``streams/head_runtime.py``): a delta
   whose source id was already applied is skipped (``parse_source_id``), an entry the live
   ledger would refuse (non-member delete, wrong grid, invalid rows, a delete before the head
   exists) is skipped and reported, undecodable messages are skipped and reported. The replay
   stops at the version of the live head (the latest update on ``heads``), so every digest below
   describes the same set of events; later deltas are counted as *pending*.
2. **Shuffled orders**: the accepted entries, split into single rows (packed entries stay
   whole), are re-applied in N random orders in random-size batches. Every order is a random
   linear extension of "a delete comes after the add it removes" (the only order constraint an
   exact ledger has); the digests must all equal the log-order digest.
3. **Re-partitionings**: K times, the rows are dealt to 2..8 random partitions (everything that
   touches one sample id stays together, as keying does), each partition gets its own ledger in
   a random order, and the partition ledgers are merged; the digests must be equal too.
4. **From scratch**: when every accepted entry carries rows, the retained multiset (adds not
   removed by a delete) is rebuilt and put into a fresh ledger; same digest required.
5. **Live head**: the latest head update's version, digest and n_retained equal the replay's.
6. **Canonical head**: ``solve_head`` (the head's gamma) on the replayed ledger equals the
   latest *exact* head's W bit for bit (and its posterior T when carried). When the latest update
   is fast, the latest exact update is checked at its own version; with none, not checkable.
7. **Retrain deviation**: ||W - W_sklearn|| / ||W_sklearn|| against an independent scikit-learn
   ridge on the dequantized retained rows must stay below the tolerance.

Exit code 0 only when no check fails. ``--json`` prints a certificate (``unlearn.verify/v1``).

``unlearn export-deltas`` writes a head's deltas (and its head updates) to a file in the export
format below, and ``unlearn verify --deltas-file F`` verifies it offline. Export format v1
(all integers little-endian)::

    file   := "ULDX" | u16 version (=1) | u16 reserved (=0) | record*
    record := u8 kind | u8 reserved (=0) | u16 key_len | i32 partition | i64 offset
              | i64 timestamp_ms | u64 value_len | key bytes | value bytes

``kind`` 1 = a raw ``deltas`` message (``ULDT``), 2 = a raw ``heads`` message (``ULHD``), in
log order per kind; partition/offset/timestamp are where the message was on its topic.
"""

from __future__ import annotations

import argparse
import hashlib
import struct
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from unlearn.infra.cli_args import NO_BROKER, add_broker_args, cli_exit_code, settings_from_args
from unlearn.infra.settings import Settings
from unlearn.ledger import ExactLedger, LedgerError, NonMemberDelete, one_hot, posterior_inverse, retrain_deviation, solve_head
from unlearn.ledger.smw import relative_deviation
from unlearn.schemas.delta_codec import CodecError, PackedEntry, RowsEntry, decode_delta
from unlearn.schemas.head_codec import HeadUpdate, decode_head
from unlearn.streams.ledger.head_runtime import parse_source_id

__all__ = [
    "CERTIFICATE_SCHEMA",
    "EXPORT_MAGIC",
    "Certificate",
    "Check",
    "LogRecord",
    "VerifyError",
    "export_deltas",
    "export_deltas_main",
    "read_export",
    "read_topic",
    "replay_log",
    "verify",
    "verify_broker",
    "verify_head",
    "verify_file",
    "verify_main",
    "write_export",
]

CERTIFICATE_SCHEMA = "unlearn.verify/v1"
EXPORT_MAGIC = b"ULDX"
EXPORT_VERSION = 1
KIND_DELTA = 1
KIND_HEAD = 2
_FILE_HEADER = struct.Struct("<4sHH")
_RECORD = struct.Struct("<BBHiqqQ")  # kind, reserved, key_len, partition, offset, timestamp_ms, value_len

_KIND_CLASS_ROW = 0
_KIND_VECTOR_ROW = 1
_KIND_PACKED = 2


class VerifyError(RuntimeError):
    """The verification could not run (no such topic, unreadable file, ...): not a failed check."""


# --------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class LogRecord:
    """One message as it was on its topic."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes


def _key_matches(head_id: str) -> Callable[[bytes | None], bool]:
    want = head_id.encode("utf-8")
    # The live ledger refuses a keyed delta whose key is not its head id, but accepts an unkeyed one.
    return lambda key: not key or key == want


def read_topic(settings: Settings, topic: str, keep: Callable[[bytes | None], bool] | None = None,
               timeout: float = 60.0) -> list[LogRecord]:
    """Every message of ``topic`` (all partitions, from the beginning) up to the high watermark
    each partition had when the reader got there (partition EOF; fetch responses carry the right
    high watermark on tansu too). ``keep(key)`` filters before the value is copied."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

    from unlearn.infra.profiles import consumer_config

    c = Consumer(consumer_config(settings, f"{settings.topic_prefix}verifier-{uuid.uuid4().hex}",
                                 **{"enable.partition.eof": True}))
    out: list[LogRecord] = []
    try:
        try:
            md = c.list_topics(timeout=min(timeout, settings.admin_timeout))  # whole metadata (no auto-create)
        except KafkaException as exc:
            raise VerifyError(f"cannot reach the broker at {settings.bootstrap}: {exc}") from None
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            raise VerifyError(f"topic {topic} does not exist on {settings.bootstrap}")
        parts = sorted(t.partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(done) < len(parts):
            if time.monotonic() > deadline:
                raise VerifyError(f"reading {topic} did not reach the end of partitions "
                                  f"{sorted(set(parts) - done)} within {timeout:g}s")
            for m in c.consume(num_messages=1000, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition())
                        continue
                    raise VerifyError(f"reading {topic}: {err}")
                if m.partition() in done:
                    continue  # produced after we reached that partition's end: not ours
                key = m.key()
                if keep is not None and not keep(key):
                    continue
                ts_type, ts = m.timestamp()
                out.append(LogRecord(m.partition(), m.offset(), int(ts), key, bytes(m.value() or b"")))
    finally:
        c.close()
    out.sort(key=lambda r: (r.partition, r.offset))
    return out


def read_head_updates(records: Iterable[LogRecord], head_id: str) -> tuple[list[HeadUpdate], int]:
    """Decoded updates of ``head_id`` in log order, and how many messages were undecodable."""
    ups: list[HeadUpdate] = []
    bad = 0
    for r in records:
        try:
            u = decode_head(r.value)
        except CodecError:
            bad += 1
            continue
        if u.head_id == head_id:
            ups.append(u)
    return ups, bad


def _newer(a: HeadUpdate, b: HeadUpdate | None) -> bool:
    return b is None or (a.version, a.mode == "exact") > (b.version, b.mode == "exact")


# --------------------------------------------------------------------------- export format
def write_export(path: str | Path, deltas: Sequence[LogRecord], heads: Sequence[LogRecord] = ()) -> int:
    """Write the export file; returns its size in bytes."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(p, "wb") as f:
        n += f.write(_FILE_HEADER.pack(EXPORT_MAGIC, EXPORT_VERSION, 0))
        for kind, recs in ((KIND_DELTA, deltas), (KIND_HEAD, heads)):
            for r in recs:
                key = r.key or b""
                n += f.write(_RECORD.pack(kind, 0, len(key), r.partition, r.offset, r.timestamp_ms, len(r.value)))
                n += f.write(key)
                n += f.write(r.value)
    return n


def read_export(path: str | Path) -> tuple[list[LogRecord], list[LogRecord]]:
    """(deltas records, heads records) of an export file; VerifyError if it is not one."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise VerifyError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) < _FILE_HEADER.size:
        raise VerifyError(f"{path}: not a deltas export (too short)")
    magic, version, _ = _FILE_HEADER.unpack_from(data, 0)
    if magic != EXPORT_MAGIC:
        raise VerifyError(f"{path}: not a deltas export (magic {magic!r}, expected {EXPORT_MAGIC!r})")
    if version != EXPORT_VERSION:
        raise VerifyError(f"{path}: export version {version} is unknown (this verifier reads {EXPORT_VERSION})")
    pos = _FILE_HEADER.size
    deltas: list[LogRecord] = []
    heads: list[LogRecord] = []
    i = 0
    while pos < len(data):
        if pos + _RECORD.size > len(data):
            raise VerifyError(f"{path}: record {i} truncated (header)")
        kind, _res, klen, part, off, ts, vlen = _RECORD.unpack_from(data, pos)
        pos += _RECORD.size
        if pos + klen + vlen > len(data):
            raise VerifyError(f"{path}: record {i} truncated ({klen + vlen} bytes announced, "
                              f"{len(data) - pos} left)")
        key = data[pos:pos + klen] or None
        value = data[pos + klen:pos + klen + vlen]
        pos += klen + vlen
        rec = LogRecord(part, off, ts, key, value)
        if kind == KIND_DELTA:
            deltas.append(rec)
        elif kind == KIND_HEAD:
            heads.append(rec)
        else:
            raise VerifyError(f"{path}: record {i} has unknown kind {kind}")
        i += 1
    return deltas, heads


def export_deltas(settings: Settings, head_id: str, path: str | Path, *, include_heads: bool = True,
                  timeout: float = 60.0) -> dict[str, Any]:
    """Write every ``deltas`` message of ``head_id`` (key = head id, or unkeyed) and, unless
    ``include_heads`` is False, its ``heads`` updates to ``path``. Returns a summary."""
    keep = _key_matches(head_id)
    deltas = [r for r in read_topic(settings, settings.topic("deltas"), keep, timeout) if _delta_head(r) == head_id]
    heads = read_topic(settings, settings.topic("heads"), keep, timeout) if include_heads else []
    size = write_export(path, deltas, heads)
    return {"path": str(path), "head_id": head_id, "deltas": len(deltas), "heads": len(heads), "bytes": size}


def _delta_head(r: LogRecord) -> str | None:
    """The head id a deltas message is for (key first; decoded for unkeyed or bad messages)."""
    if r.key:
        return r.key.decode("utf-8", "replace")
    try:
        return decode_delta(r.value).head_id
    except CodecError:
        return None


# --------------------------------------------------------------------------- log-order replay
@dataclass
class Units:
    """Accepted entries split into units: one per row (rows entries), one per packed entry."""

    d: int = 0
    k: int = 0
    k_y: int = 0
    sign: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    ref: list[int] = field(default_factory=list)  # row index, or packed index
    samples: list[tuple[str, ...]] = field(default_factory=list)
    q_chunks: list[np.ndarray] = field(default_factory=list)
    class_labels: list[int] = field(default_factory=list)  # per row; -1 for vector rows
    vector_labels: dict[int, np.ndarray] = field(default_factory=dict)  # row -> int64 (c,)
    packed: list[ExactLedger] = field(default_factory=list)
    n_rows: int = 0
    _Q: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.sign)

    def add_rows(self, e: RowsEntry) -> None:
        q = np.asarray(e.q, dtype=np.int64)
        self.q_chunks.append(q)
        self._Q = None
        labels = np.asarray(e.labels)
        for i in range(e.n):
            row = self.n_rows + i
            self.sign.append(e.sign)
            self.ref.append(row)
            self.samples.append((e.sample_ids[i],))
            if labels.ndim == 1:
                self.kind.append(_KIND_CLASS_ROW)
                self.class_labels.append(int(labels[i]))
            else:
                self.kind.append(_KIND_VECTOR_ROW)
                self.class_labels.append(-1)
                self.vector_labels[row] = np.array(labels[i], dtype=np.int64)
        self.n_rows += e.n

    def add_packed(self, e: PackedEntry, led: ExactLedger) -> None:
        self.sign.append(e.sign)
        self.kind.append(_KIND_PACKED)
        self.ref.append(len(self.packed))
        self.samples.append(tuple(e.sample_ids))
        self.packed.append(led)

    @property
    def Q(self) -> np.ndarray:
        if self._Q is None:
            self._Q = (np.concatenate(self.q_chunks, axis=0) if self.q_chunks
                       else np.zeros((0, max(1, self.d)), np.int64))
        return self._Q

    @property
    def has_packed(self) -> bool:
        return bool(self.packed)


@dataclass
class Skipped:
    """A message or entry the replay left out, as the live ledger would have."""

    partition: int
    offset: int
    reason: str
    detail: str
    entry_index: int | None = None
    sign: int | None = None
    event_ids: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "offset": self.offset, "reason": self.reason, "detail": self.detail,
                "entry_index": self.entry_index,
                "op": None if self.sign is None else ("add" if self.sign > 0 else "delete"),
                "events": len(self.event_ids), "event_ids": list(self.event_ids[:5])}


@dataclass
class LogReplay:
    """Result of the log-order pass."""

    head_id: str
    messages: int = 0  # deltas messages of this head read
    version: int = 0  # applied messages within the replayed range
    final_version: int = 0  # applied messages in the whole log
    pending: int = 0  # messages beyond the stop version that would apply
    ledger: ExactLedger | None = None  # at the stop version
    at_version: dict[int, ExactLedger] = field(default_factory=dict)
    offset_of_version: dict[int, tuple[int, int]] = field(default_factory=dict)
    units: Units = field(default_factory=Units)
    skipped: list[Skipped] = field(default_factory=list)  # whole messages
    rejected: list[Skipped] = field(default_factory=list)  # entries
    partitions: set[int] = field(default_factory=set)
    error: str | None = None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.skipped:
            out[s.reason] = out.get(s.reason, 0) + 1
        return out


def replay_log(records: Sequence[LogRecord], head_id: str, stop_version: int | None = None,
               capture: Iterable[int] = ()) -> LogReplay:
    """The log-order pass with the live ledger's skip rules (streams/head_runtime.py).

    Records are the deltas messages in log order (other heads' messages are ignored). Units are
    collected up to ``stop_version`` applied messages (None: all); ledgers are copied at every
    version in ``capture``."""
    rep = LogReplay(head_id)
    want = set(capture)
    ledger: ExactLedger | None = None
    applied_offset = -1
    source_offsets: dict[str, int] = {}
    collecting = True
    for r in records:
        if r.key and r.key != head_id.encode("utf-8"):
            continue
        try:
            delta = decode_delta(r.value)
        except CodecError as exc:
            if r.key:  # keyed to this head but unreadable: the live ledger dead-letters it
                rep.messages += 1
                rep.skipped.append(Skipped(r.partition, r.offset, "bad_delta", str(exc)))
            continue
        if delta.head_id != head_id:
            if r.key:
                rep.messages += 1
                rep.skipped.append(Skipped(r.partition, r.offset, "bad_delta",
                                           f"message key is {head_id!r} but the delta is for {delta.head_id!r}"))
            continue
        rep.messages += 1
        rep.partitions.add(r.partition)
        if ledger is None:
            if not any(e.sign > 0 for e in delta.entries):
                for i, e in enumerate(delta.entries):
                    rep.rejected.append(Skipped(r.partition, r.offset, "unknown_head",
                                                "a delete before the head's first add", i, e.sign, e.event_ids))
                continue
            ledger = ExactLedger(delta.d, 0, delta.frac_bits, delta.label_frac_bits)
            rep.units.d, rep.units.k, rep.units.k_y = delta.d, delta.frac_bits, delta.label_frac_bits
        if r.offset <= applied_offset:
            rep.skipped.append(Skipped(r.partition, r.offset, "redelivered",
                                       f"offset {r.offset} <= last applied offset {applied_offset}"))
            continue
        src = parse_source_id(delta.source_id)
        if src is not None and src[1] <= source_offsets.get(src[0], -1):
            applied_offset = r.offset
            rep.skipped.append(Skipped(r.partition, r.offset, "duplicate_source",
                                       f"source {delta.source_id!r} already applied "
                                       f"(up to {src[0]}@{source_offsets[src[0]]})"))
            continue
        grid = (delta.d, delta.frac_bits, delta.label_frac_bits)
        mine = (ledger.dim, ledger.frac_bits, ledger.label_frac_bits)
        accepted: list[RowsEntry | tuple[PackedEntry, ExactLedger]] = []
        for i, e in enumerate(delta.entries):
            if grid != mine:
                reason = "dimension_mismatch" if delta.d != ledger.dim else "grid_mismatch"
                rep.rejected.append(Skipped(r.partition, r.offset, reason,
                                            f"delta has (d, frac_bits, label_frac_bits) = {grid}, head has {mine}",
                                            i, e.sign, e.event_ids))
                continue
            try:
                if isinstance(e, RowsEntry):
                    (ledger.add if e.sign > 0 else ledger.delete)(e.q, e.labels)
                    accepted.append(e)
                else:
                    blob = ExactLedger.from_bytes(e.ledger_blob)
                    ledger.absorb(blob, e.sign)
                    accepted.append((e, blob))
            except NonMemberDelete as exc:
                rep.rejected.append(Skipped(r.partition, r.offset, "non_member_delete", str(exc), i, e.sign,
                                            e.event_ids))
            except LedgerError as exc:
                rep.rejected.append(Skipped(r.partition, r.offset, "invalid_entry", str(exc), i, e.sign,
                                            e.event_ids))
        applied_offset = r.offset
        if src is not None:
            source_offsets[src[0]] = src[1]
        rep.final_version += 1
        if collecting:
            rep.version = rep.final_version
            rep.offset_of_version[rep.version] = (r.partition, r.offset)
            for a in accepted:
                if isinstance(a, RowsEntry):
                    rep.units.add_rows(a)
                else:
                    rep.units.add_packed(*a)
            if rep.final_version in want:
                rep.at_version[rep.final_version] = ledger.copy()
            if stop_version is not None and rep.final_version >= stop_version:
                collecting = False
                rep.ledger = ledger.copy()
        else:
            rep.pending += 1
    if rep.ledger is None and ledger is not None:
        rep.ledger = ledger.copy()
    return rep


# --------------------------------------------------------------------------- shuffled replays
def _dependencies(units: Units) -> tuple[list[list[int]], list[int], list[int]]:
    """(children, indegree, unmatched deletes): a delete unit depends on the latest earlier add
    unit of each of its sample ids (matched one to one, in log order)."""
    n = len(units)
    children: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    stacks: dict[str, list[int]] = {}
    unmatched: list[int] = []
    for u in range(n):
        if units.sign[u] > 0:
            for s in units.samples[u]:
                stacks.setdefault(s, []).append(u)
        else:
            ok = True
            parents: set[int] = set()
            for s in units.samples[u]:
                st = stacks.get(s)
                if st:
                    parents.add(st.pop())
                else:
                    ok = False
            for p in parents:
                children[p].append(u)
                indeg[u] += 1
            if not ok:
                unmatched.append(u)
    return children, indeg, unmatched


def _random_extension(members: Sequence[int], children: list[list[int]], indeg: list[int],
                      rng: np.random.Generator) -> list[int]:
    """A uniformly random pick among ready units at each step (Kahn): a random order in which
    every unit follows its dependencies (all within ``members``)."""
    member = set(members)
    deg = {u: 0 for u in members}
    for u in members:
        for ch in children[u]:
            if ch in member:
                deg[ch] += 1
    ready = [u for u in members if deg[u] == 0]
    order: list[int] = []
    while ready:
        j = int(rng.integers(len(ready)))
        u = ready[j]
        ready[j] = ready[-1]
        ready.pop()
        order.append(u)
        for ch in children[u]:
            if ch in member:
                deg[ch] -= 1
                if deg[ch] == 0:
                    ready.append(ch)
    if len(order) != len(members):  # pragma: no cover - the graph is a DAG by construction
        raise VerifyError("dependency cycle in the replay units")
    return order


def _apply_units(ledger: ExactLedger, units: Units, chunk: Sequence[int], sign: int) -> None:
    rows_c = [units.ref[u] for u in chunk if units.kind[u] == _KIND_CLASS_ROW]
    rows_v = [units.ref[u] for u in chunk if units.kind[u] == _KIND_VECTOR_ROW]
    op = ledger.add if sign > 0 else ledger.delete
    if rows_c:
        idx = np.asarray(rows_c, dtype=np.int64)
        op(units.Q[idx], np.asarray([units.class_labels[i] for i in rows_c], dtype=np.int64))
    if rows_v:
        by_width: dict[int, list[int]] = {}
        for i in rows_v:
            by_width.setdefault(units.vector_labels[i].shape[0], []).append(i)
        for _, rows in sorted(by_width.items()):
            op(units.Q[np.asarray(rows, dtype=np.int64)], np.stack([units.vector_labels[i] for i in rows]))
    for u in chunk:
        if units.kind[u] == _KIND_PACKED:
            ledger.absorb(units.packed[units.ref[u]], sign)


def _apply_order(ledger: ExactLedger, units: Units, order: Sequence[int], rng: np.random.Generator) -> int:
    """Apply units in ``order``, in random-size batches (each: its adds, then its deletes -- still
    a valid order, since a batch's deletes follow their adds). Returns the number of batches."""
    n = len(order)
    mean = max(1, n // 12)
    i = 0
    batches = 0
    while i < n:
        size = int(rng.integers(1, 2 * mean + 1))
        chunk = order[i:i + size]
        i += size
        batches += 1
        _apply_units(ledger, units, [u for u in chunk if units.sign[u] > 0], +1)
        _apply_units(ledger, units, [u for u in chunk if units.sign[u] < 0], -1)
    return batches


def _segments(n: int, unmatched: Sequence[int]) -> list[tuple[list[int], int | None]]:
    """Log-order segments separated by unmatched deletes (which keep their log position)."""
    out: list[tuple[list[int], int | None]] = []
    start = 0
    for u in sorted(unmatched):
        out.append((list(range(start, u)), u))
        start = u + 1
    out.append((list(range(start, n)), None))
    return out


def shuffled_digest(units: Units, rng: np.random.Generator, deps: tuple[list[list[int]], list[int], list[int]]
                    ) -> tuple[str, ExactLedger, dict[str, Any]]:
    children, indeg, unmatched = deps
    led = ExactLedger(units.d, 0, units.k, units.k_y)
    batches = 0
    for members, barrier in _segments(len(units), unmatched):
        order = _random_extension(members, children, indeg, rng)
        if barrier is not None:
            order.append(barrier)
        batches += _apply_order(led, units, order, rng)
    return led.digest(), led, {"batches": batches}


def _components(units: Units) -> list[list[int]]:
    """Units linked by a shared sample id (union-find): keyed partitioning keeps them together."""
    parent = list(range(len(units)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[str, int] = {}
    for u, samples in enumerate(units.samples):
        for s in samples:
            if s in first:
                a, b = find(first[s]), find(u)
                if a != b:
                    parent[b] = a
            else:
                first[s] = u
    groups: dict[int, list[int]] = {}
    for u in range(len(units)):
        groups.setdefault(find(u), []).append(u)
    return list(groups.values())


def partitioned_digest(units: Units, rng: np.random.Generator, deps: tuple[list[list[int]], list[int], list[int]],
                       comps: list[list[int]]) -> tuple[str, dict[str, Any]]:
    children, indeg, _ = deps
    n_parts = int(rng.integers(2, min(8, len(comps)) + 1)) if len(comps) >= 2 else 1
    assign = rng.integers(0, n_parts, size=len(comps))
    parts: list[list[int]] = [[] for _ in range(n_parts)]
    for comp, p in zip(comps, assign):
        parts[int(p)].extend(comp)
    ledgers = []
    for members in parts:
        led = ExactLedger(units.d, 0, units.k, units.k_y)
        _apply_order(led, units, _random_extension(sorted(members), children, indeg, rng), rng)
        ledgers.append(led)
    merged = ExactLedger(units.d, 0, units.k, units.k_y)
    for j in rng.permutation(n_parts):
        merged = merged.merge(ledgers[int(j)])
    return merged.digest(), {"partitions": n_parts, "sizes": [len(p) for p in parts]}


def retained_rows(units: Units, deps: tuple[list[list[int]], list[int], list[int]]) -> list[int] | None:
    """Row units of the retained multiset (adds no delete removed); None when not derivable."""
    children, _, unmatched = deps
    if units.has_packed or unmatched:
        return None
    return [u for u in range(len(units)) if units.sign[u] > 0 and not children[u]]


# --------------------------------------------------------------------------- certificate
@dataclass
class Check:
    name: str
    status: str  # pass | fail | skipped
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, **self.data}


@dataclass
class Certificate:
    head_id: str
    source: dict[str, Any]
    checks: list[Check]
    replay: dict[str, Any]
    live_head: dict[str, Any] | None
    seed: int
    warnings: list[str] = field(default_factory=list)
    created_ts: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks) and any(c.status == "pass" for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        body = {
            "schema": CERTIFICATE_SCHEMA,
            "head_id": self.head_id,
            "ok": self.ok,
            "created_ts": self.created_ts,
            "seed": self.seed,
            "source": self.source,
            "replay": self.replay,
            "live_head": self.live_head,
            "checks": [c.to_json() for c in self.checks],
            "warnings": self.warnings,
            "summary": self.summary_line(),
            "retrain_deviation": self.retrain_deviation,
        }
        body["certificate_sha256"] = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
        return body

    @property
    def retrain_deviation(self) -> float | None:
        """The measured deviation from the scikit-learn retrain (None when not checked)."""
        for c in self.checks:
            if c.name == "retrain_deviation" and "deviation" in c.data:
                return float(c.data["deviation"])
        return None

    def summary_line(self) -> str:
        """One line: verdict, check counts, version and digest."""
        n = {s: sum(1 for c in self.checks if c.status == s) for s in ("pass", "fail", "skipped")}
        failed = [c.name for c in self.checks if c.status == "fail"]
        return (f"{'PASS' if self.ok else 'FAIL'}: {n['pass']} passed, {n['fail']} failed"
                + (f" ({', '.join(failed)})" if failed else "") + f", {n['skipped']} skipped; version "
                f"{self.replay.get('version')} digest {str(self.replay.get('digest'))[:16]}")

    def summary(self) -> str:
        r = self.replay
        lines = [f"verify head {self.head_id!r} ({_source_text(self.source)}): {'PASS' if self.ok else 'FAIL'}"]
        lines.append(
            f"  deltas: {r['messages']} messages for the head, {r['applied_versions']} applied (version "
            f"{r['version']}), {r['pending']} pending beyond the live head, skipped "
            f"{', '.join(f'{k}={v}' for k, v in sorted(r['skipped_counts'].items())) or 'none'}, "
            f"{len(r['rejected_entries'])} entries rejected")
        if r.get("digest"):
            lines.append(f"  replay: digest {r['digest']}  n_retained {r['n_retained']}  d {r['d']}  c {r['c']}  "
                         f"units {r['units']}")
        if self.live_head:
            h = self.live_head
            lines.append(f"  live head: version {h['version']} {h['mode']}  digest {h['digest']}  "
                         f"n_retained {h['n_retained']}")
        for c in self.checks:
            lines.append(f"  [{c.status:7}] {c.name}: {c.detail}")
        for rej in r["rejected_entries"][:10]:
            lines.append(f"  rejected entry: partition {rej['partition']} offset {rej['offset']} entry "
                         f"{rej['entry_index']} ({rej['op']}, {rej['events']} events): {rej['reason']}: {rej['detail']}")
        for w in self.warnings:
            lines.append(f"  warning: {w}")
        return "\n".join(lines)


def _source_text(src: dict[str, Any]) -> str:
    if src.get("kind") == "file":
        return f"file {src.get('path')}"
    if src.get("kind") == "broker":
        return f"broker {src.get('bootstrap')}, topic {src.get('deltas_topic')}"
    return "records given in memory"


def _head_json(u: HeadUpdate) -> dict[str, Any]:
    return {"version": u.version, "mode": u.mode, "digest": u.digest, "n_retained": u.n_retained,
            "events_covered": u.events_covered, "offsets": [[p, o] for p, o in u.offsets], "gamma": u.gamma,
            "d": u.d, "c": u.c, "has_posterior": u.posterior is not None, "created_ts": u.created_ts}


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.ascontiguousarray(a, "<f8").tobytes() == np.ascontiguousarray(b, "<f8").tobytes()


def verify(delta_records: Sequence[LogRecord], head_updates: Sequence[HeadUpdate] | None, head_id: str, *,
           orders: int = 3, partitionings: int = 3, seed: int | None = None, tolerance: float = 1e-8,
           source: dict[str, Any] | None = None, require_live: bool = True,
           gamma: float | None = None) -> Certificate:
    """Run every check on a head's deltas (log order) and its head updates (log order; None when
    there are none to compare with). ``require_live``: a missing live head fails the live check
    (broker mode) instead of skipping it (a file exported without heads). ``gamma`` is used for
    the retrain reference only when no head update says which gamma the head has.

    Runs with one BLAS thread: the replays are many small exact GEMMs, which a multithreaded BLAS
    only slows down on a shared box (~3x here); results are exact integers either way."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return _verify(delta_records, head_updates, head_id, orders=orders, partitionings=partitionings, seed=seed,
                       tolerance=tolerance, source=source, require_live=require_live, gamma=gamma)


def _verify(delta_records: Sequence[LogRecord], head_updates: Sequence[HeadUpdate] | None, head_id: str, *,
            orders: int, partitionings: int, seed: int | None, tolerance: float, source: dict[str, Any] | None,
            require_live: bool, gamma: float | None) -> Certificate:
    seed = int(seed if seed is not None else np.random.SeedSequence().entropy % (2**63))
    rng = np.random.default_rng(seed)
    checks: list[Check] = []
    warnings: list[str] = []
    updates = list(head_updates or [])
    latest: HeadUpdate | None = None
    for u in updates:
        if _newer(u, latest):
            latest = u
    latest_exact: HeadUpdate | None = None
    for u in updates:
        if u.mode == "exact" and (latest is None or u.version <= latest.version) and _newer(u, latest_exact):
            latest_exact = u
    stop = latest.version if latest is not None else None
    capture = {v for v in (stop, latest_exact.version if latest_exact else None) if v}
    rep = replay_log(delta_records, head_id, stop, capture)
    if len(rep.partitions) > 1:
        warnings.append(f"the head's deltas are on {len(rep.partitions)} partitions {sorted(rep.partitions)}: "
                        "deltas must be keyed by head id; their live order is undefined (replayed by partition)")
    units = rep.units
    led = rep.ledger
    base = led.digest() if led is not None else None
    deps = _dependencies(units)
    comps = _components(units)
    unmatched = deps[2]

    # 1. the log-order replay itself
    if led is None or rep.version == 0:
        checks.append(Check("log_replay", "fail", f"no applicable deltas for head {head_id!r} "
                            f"({rep.messages} messages read)"))
    else:
        checks.append(Check("log_replay", "pass", f"{rep.version} messages applied in log order, digest {base}",
                            {"digest": base}))
    if unmatched:
        checks.append(Check("delete_matching", "fail",
                            f"{len(unmatched)} accepted delete units name samples with no earlier retained add "
                            "(the ledger's counts allowed them, but they remove rows that were never added)",
                            {"units": unmatched[:20]}))

    # 2. shuffled orders
    if base is not None and orders > 0:
        digests, info, err = [], [], None
        for _ in range(orders):
            try:
                dg, _, meta = shuffled_digest(units, rng, deps)
            except LedgerError as exc:
                err = f"a shuffled order was refused by the ledger: {exc}"
                break
            digests.append(dg)
            info.append(meta)
        bad = [i for i, dg in enumerate(digests) if dg != base]
        ok = err is None and not bad
        checks.append(Check("shuffled_orders", "pass" if ok else "fail",
                            (f"{orders} random orders ({len(units)} units) give the log-order digest" if ok
                             else err or f"orders {bad} give different digests"),
                            {"digests": digests, "orders": info}))
    else:
        checks.append(Check("shuffled_orders", "skipped", "no orders requested" if base else "nothing to replay"))

    # 3. re-partitionings
    if base is not None and partitionings > 0 and not unmatched:
        digests, info, err = [], [], None
        for _ in range(partitionings):
            try:
                dg, meta = partitioned_digest(units, rng, deps, comps)
            except LedgerError as exc:
                err = f"a partition replay was refused by the ledger: {exc}"
                break
            digests.append(dg)
            info.append(meta)
        bad = [i for i, dg in enumerate(digests) if dg != base]
        ok = err is None and not bad
        checks.append(Check("repartitionings", "pass" if ok else "fail",
                            (f"{partitionings} random partitionings ({len(comps)} sample groups), merged, give the "
                             "log-order digest" if ok else err or f"partitionings {bad} give different digests"),
                            {"digests": digests, "partitionings": info}))
    else:
        why = ("no partitionings requested" if partitionings <= 0 else
               "unmatched deletes pin the order" if unmatched else "nothing to replay")
        checks.append(Check("repartitionings", "skipped", why))

    # 4. from scratch on the retained rows
    retained = retained_rows(units, deps) if base is not None else None
    F = Y = None
    if retained is not None and led is not None:
        scratch = ExactLedger(units.d, led.n_outputs, units.k, units.k_y)
        cls = [units.ref[u] for u in retained if units.kind[u] == _KIND_CLASS_ROW]
        vec = [units.ref[u] for u in retained if units.kind[u] == _KIND_VECTOR_ROW]
        if cls:
            scratch.add(units.Q[np.asarray(cls)], np.asarray([units.class_labels[i] for i in cls], dtype=np.int64))
        by_w: dict[int, list[int]] = {}
        for i in vec:
            by_w.setdefault(units.vector_labels[i].shape[0], []).append(i)
        for _, rows in sorted(by_w.items()):
            scratch.add(units.Q[np.asarray(rows)], np.stack([units.vector_labels[i] for i in rows]))
        sd = scratch.digest()
        checks.append(Check("from_scratch", "pass" if sd == base else "fail",
                            f"a fresh ledger of the {len(retained)} retained rows has digest {sd}"
                            + ("" if sd == base else f" != replay {base}"), {"digest": sd, "rows": len(retained)}))
        rows_all = cls + vec
        if rows_all:
            c = led.n_outputs
            F = units.Q[np.asarray(rows_all)].astype(np.float64) * (2.0 ** -units.k)
            Y = np.zeros((len(rows_all), c))
            if cls:
                Y[: len(cls)] = one_hot(np.asarray([units.class_labels[i] for i in cls]), c)
            for j, i in enumerate(vec):
                v = units.vector_labels[i].astype(np.float64) * (2.0 ** -units.k_y)
                Y[len(cls) + j, : v.shape[0]] = v
    else:
        why = ("packed entries carry statistics, not rows" if units.has_packed else
               "unmatched deletes" if unmatched else "nothing to replay")
        checks.append(Check("from_scratch", "skipped", f"retained rows not available: {why}"))

    # 5. live head digest
    live_json = _head_json(latest) if latest is not None else None
    if latest is None:
        checks.append(Check("live_digest", "fail" if require_live else "skipped",
                            f"no head update for {head_id!r}" + (" on the heads topic" if require_live else
                                                                  " in the input")))
    elif led is None:
        checks.append(Check("live_digest", "fail", f"the live head is at version {latest.version} but no deltas of "
                                                   f"{head_id!r} could be replayed"))
    else:
        problems = []
        if rep.version != latest.version:
            problems.append(f"live version {latest.version} but the deltas log yields {rep.final_version} applied "
                            "messages")
        if latest.digest != base:
            problems.append(f"live digest {latest.digest} != replay digest {base}")
        if latest.n_retained != led.count:
            problems.append(f"live n_retained {latest.n_retained} != replay {led.count}")
        where = rep.offset_of_version.get(latest.version)
        if where is not None and latest.offsets and tuple(latest.offsets[-1]) != where:
            problems.append(f"live head covers deltas offset {list(latest.offsets[-1])} but version "
                            f"{latest.version} is the delta at {list(where)}")
        checks.append(Check("live_digest", "fail" if problems else "pass",
                            "; ".join(problems) if problems else
                            f"live head version {latest.version} ({latest.mode}) has the replay digest",
                            {"live_digest": latest.digest, "replay_digest": base}))

    # 6. canonical head bit for bit
    W_canon = None
    if latest_exact is None:
        checks.append(Check("canonical_head", "skipped",
                            "not checkable: no exact head update published" + ("" if updates else " (no updates)")))
    else:
        le = rep.at_version.get(latest_exact.version)
        if le is None:
            checks.append(Check("canonical_head", "fail",
                                f"exact head version {latest_exact.version} but the replay has no such version"))
        else:
            W = solve_head(le, latest_exact.gamma)
            W_live = np.asarray(latest_exact.weights)
            same_w = _bits_equal(W, W_live)
            note = "" if latest is None or latest_exact is latest else (
                f" (the live head is {latest.mode} at version {latest.version}; checked the latest exact "
                f"update, version {latest_exact.version})")
            data: dict[str, Any] = {"version": latest_exact.version, "gamma": latest_exact.gamma}
            if not same_w:
                data["max_abs_diff"] = (float(np.max(np.abs(W - W_live))) if W.shape == W_live.shape and W.size
                                        else None)
                data["shapes"] = [list(W.shape), list(W_live.shape)]
            post_ok = True
            if latest_exact.posterior is not None:
                T = posterior_inverse(le, latest_exact.gamma)
                post_ok = _bits_equal(T, np.asarray(latest_exact.posterior))
                data["posterior_checked"] = True
            ok = same_w and post_ok and le.digest() == latest_exact.digest
            detail = (f"solve_head(replay ledger, gamma={latest_exact.gamma}) equals the published W"
                      + (" and posterior T" if latest_exact.posterior is not None else "") + " bit for bit" + note
                      if ok else
                      "published exact head differs from the canonical solve: "
                      + ", ".join(x for x, bad in (("W", not same_w), ("posterior T", not post_ok),
                                                   ("digest", le.digest() != latest_exact.digest)) if bad) + note)
            checks.append(Check("canonical_head", "pass" if ok else "fail", detail, data))
            if latest_exact.version == rep.version:
                W_canon = W
    # 7. retrain deviation
    if F is not None and Y is not None and led is not None:
        ref = latest_exact or latest
        gamma = ref.gamma if ref is not None else gamma
        if gamma is None:
            checks.append(Check("retrain_deviation", "skipped", "no head update: gamma unknown"))
        elif led.n_outputs == 0:
            checks.append(Check("retrain_deviation", "skipped", "the head has no outputs"))
        else:
            W = W_canon if W_canon is not None else solve_head(led, gamma)
            dev = retrain_deviation(W, F, Y, gamma)
            data = {"deviation": dev, "tolerance": tolerance, "rows": int(F.shape[0]), "gamma": gamma}
            if latest is not None and latest.weights.shape == W.shape:
                from unlearn.ledger import centralized_retrain

                data["live_head_deviation"] = relative_deviation(np.asarray(latest.weights),
                                                                 centralized_retrain(F, Y, gamma))
            checks.append(Check("retrain_deviation", "pass" if dev <= tolerance else "fail",
                                f"||W - W_sklearn|| / ||W_sklearn|| = {dev:.3g} (tolerance {tolerance:g}) on "
                                f"{F.shape[0]} retained rows", data))
    else:
        checks.append(Check("retrain_deviation", "skipped", "retained feature set not available"))

    replay_json = {
        "messages": rep.messages,
        "applied_versions": rep.final_version,
        "version": rep.version,
        "pending": rep.pending,
        "digest": base,
        "n_retained": led.count if led is not None else 0,
        "d": units.d,
        "c": led.n_outputs if led is not None else 0,
        "frac_bits": units.k,
        "label_frac_bits": units.k_y,
        "units": len(units),
        "partitions": sorted(rep.partitions),
        "skipped_counts": rep.counts(),
        "skipped_messages": [s.to_json() for s in rep.skipped[:50]],
        "rejected_entries": [s.to_json() for s in rep.rejected[:200]],
        "rejected_total": len(rep.rejected),
    }
    if rep.pending:
        warnings.append(f"{rep.pending} deltas messages beyond the live head's version {rep.version} are not "
                        "yet covered by a published head (the ledger worker may be behind)")
    return Certificate(head_id, source or {}, checks, replay_json, live_json, seed, warnings)


def verify_broker(settings: Settings, head_id: str, *, orders: int | None = None, partitionings: int | None = None,
                  seed: int | None = None, tolerance: float | None = None, timeout: float = 60.0) -> Certificate:
    """Read the head's deltas and head updates from the broker and verify them."""
    keep = _key_matches(head_id)
    heads = read_topic(settings, settings.topic("heads"), keep, timeout)
    deltas = read_topic(settings, settings.topic("deltas"), keep, timeout)
    updates, bad = read_head_updates(heads, head_id)
    cert = verify(deltas, updates, head_id,
                  orders=settings.verify_orders if orders is None else orders,
                  partitionings=settings.verify_partitionings if partitionings is None else partitionings,
                  seed=seed, tolerance=settings.verify_tolerance if tolerance is None else tolerance,
                  source={"kind": "broker", "bootstrap": settings.bootstrap,
                          "deltas_topic": settings.topic("deltas"), "heads_topic": settings.topic("heads")},
                  require_live=True)
    if bad:
        cert.warnings.append(f"{bad} undecodable messages keyed {head_id!r} on {settings.topic('heads')}")
    return cert


def verify_head(settings: Settings, head_id: str, *, orders: int | None = None, partitions: int | None = None,
                seed: int | None = None, tolerance: float | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """``verify_broker`` as a JSON-ready certificate (``ok``, ``summary``, ``retrain_deviation``,
    ``checks``, ...) for callers such as the demo; ``{"ok": False, "error": ...}`` when the
    verification cannot run (broker unreachable, topic missing)."""
    try:
        cert = verify_broker(settings, head_id, orders=orders, partitionings=partitions, seed=seed,
                             tolerance=tolerance, timeout=timeout)
    except VerifyError as exc:
        return {"ok": False, "head_id": head_id, "error": str(exc)}
    return cert.to_json()


def verify_file(path: str | Path, head_id: str | None = None, *, orders: int = 3, partitionings: int = 3,
                seed: int | None = None, tolerance: float = 1e-8, gamma: float | None = None) -> Certificate:
    """Verify an export file (``export_deltas`` / ``unlearn export-deltas``) without a broker."""
    deltas, heads = read_export(path)
    if head_id is None:
        ids = {h for h in (_delta_head(r) for r in deltas) if h is not None}
        if len(ids) != 1:
            raise VerifyError(f"{path} holds deltas of {len(ids)} heads {sorted(ids)[:10]}: pass --head")
        head_id = ids.pop()
    updates, bad = read_head_updates(heads, head_id)
    cert = verify(deltas, updates if heads else None, head_id, orders=orders, partitionings=partitionings,
                  seed=seed, tolerance=tolerance, source={"kind": "file", "path": str(path)}, require_live=False,
                  gamma=gamma)
    if bad:
        cert.warnings.append(f"{bad} undecodable head messages in {path}")
    return cert


# --------------------------------------------------------------------------- CLI
def _common(ap: argparse.ArgumentParser) -> None:
    add_broker_args(ap)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to read each topic to its end")


def verify_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn verify --bootstrap B --head H [--orders N] [--partitions K] [--json]`` or
    ``unlearn verify --deltas-file F [--head H]``. Exit 0 only when no check fails."""
    ap = argparse.ArgumentParser(prog="unlearn verify", description=(
        "Replay a head's deltas through the exact ledger in shuffled orders and random partitionings, and "
        "certify the live head (digest, canonical W bit for bit, deviation from a scikit-learn retrain)."))
    _common(ap)
    ap.add_argument("--head", help="head id (required with --bootstrap; with --deltas-file when it holds several)")
    ap.add_argument("--deltas-file", help="verify an export file (unlearn export-deltas) instead of the broker")
    ap.add_argument("--orders", type=int, help="shuffled replay orders (default: UNLEARN_VERIFY_ORDERS)")
    ap.add_argument("--partitions", type=int,
                    help="random re-partitionings, each into 2..8 partitions (default: UNLEARN_VERIFY_PARTITIONINGS)")
    ap.add_argument("--seed", type=int, help="random seed (default: fresh; recorded in the certificate)")
    ap.add_argument("--tolerance", type=float, help="max retrain deviation (default: UNLEARN_VERIFY_TOLERANCE)")
    ap.add_argument("--json", action="store_true", help="print the certificate as JSON (the summary goes to stderr)")
    try:
        args = ap.parse_args(argv)
        settings = settings_from_args(args, require_broker=False)
    except (SystemExit, ValueError) as exc:
        return cli_exit_code(exc)
    orders = settings.verify_orders if args.orders is None else args.orders
    parts = settings.verify_partitionings if args.partitions is None else args.partitions
    tol = settings.verify_tolerance if args.tolerance is None else args.tolerance
    if orders < 0 or parts < 0 or not tol > 0:
        print("error: --orders and --partitions must be >= 0 and --tolerance > 0", file=sys.stderr)
        return 2
    try:
        if args.deltas_file:
            cert = verify_file(args.deltas_file, args.head, orders=orders, partitionings=parts, seed=args.seed,
                               tolerance=tol, gamma=settings.gamma_for(args.head) if args.head else settings.gamma)
        else:
            if not args.head:
                print("error: --head is required (or give --deltas-file)", file=sys.stderr)
                return 2
            if not settings.bootstrap:
                print(f"error: {NO_BROKER} (or verify an export with --deltas-file)", file=sys.stderr)
                return 2
            cert = verify_broker(settings, args.head, orders=orders, partitionings=parts, seed=args.seed,
                                 tolerance=tol, timeout=args.timeout)
    except VerifyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(cert.summary(), file=sys.stderr)
        sys.stdout.write(orjson.dumps(cert.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(cert.summary())
    return 0 if cert.ok else 1


def export_deltas_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn export-deltas --bootstrap B --head H --out F [--no-heads]``."""
    ap = argparse.ArgumentParser(prog="unlearn export-deltas",
                                 description="Write a head's deltas (and head updates) to a file for offline verify.")
    _common(ap)
    ap.add_argument("--head", required=True, help="head id")
    ap.add_argument("--out", required=True, help="output file")
    ap.add_argument("--no-heads", action="store_true", help="deltas only (verify then skips the live-head checks)")
    try:
        args = ap.parse_args(argv)
        settings = settings_from_args(args)
    except (SystemExit, ValueError) as exc:
        return cli_exit_code(exc)
    try:
        info = export_deltas(settings, args.head, args.out, include_heads=not args.no_heads, timeout=args.timeout)
    except VerifyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(orjson.dumps(info).decode())
    return 0
