"""The deltas export file (``ULDX``): a head's raw ``deltas``, ``heads`` and ``receipts`` messages,
so anyone can re-verify a head offline with their own decoder (``unlearn verify --deltas-file``).

All integers little-endian::

    file   := "ULDX" | u16 version (1) | u16 reserved (=0) | record*
    record := u8 kind | u8 reserved (=0) | u16 key_len | i32 partition | i64 offset
              | i64 timestamp_ms | u64 value_len | key bytes | value bytes

``kind`` 1 = a raw ``deltas`` message (``ULDT``), 2 = a raw ``heads`` message (``ULHD``), 3 = a raw
``receipts`` message (JSON), in log order per kind; partition/offset/timestamp are where the
message was on its topic. A tombstone is written as an empty value (undecodable).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from unlearn.common.families import heads_family
from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import LogRecord

from .errors import VerifyError
from .reading import delta_head, read_head_records, read_receipt_records, record_value

EXPORT_MAGIC = b"ULDX"
EXPORT_VERSION = 1  # the one version written and read
KIND_DELTA = 1
KIND_HEAD = 2
KIND_RECEIPT = 3
_FILE_HEADER = struct.Struct("<4sHH")
_RECORD = struct.Struct("<BBHiqqQ")  # kind, reserved, key_len, partition, offset, timestamp_ms, value_len


class Export(NamedTuple):
    """The records of an export file, per kind, in log order."""

    deltas: list[LogRecord]
    heads: list[LogRecord]
    receipts: list[LogRecord]


def write_export(path: str | Path, deltas: Sequence[LogRecord], heads: Sequence[LogRecord] = (),
                 receipts: Sequence[LogRecord] = ()) -> int:
    """Write the export file; returns its size in bytes."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(p, "wb") as f:
        n += f.write(_FILE_HEADER.pack(EXPORT_MAGIC, EXPORT_VERSION, 0))
        for kind, recs in ((KIND_DELTA, deltas), (KIND_HEAD, heads), (KIND_RECEIPT, receipts)):
            for r in recs:
                key = r.key or b""
                value = record_value(r)
                n += f.write(_RECORD.pack(kind, 0, len(key), r.partition, r.offset, r.timestamp_ms, len(value)))
                n += f.write(key)
                n += f.write(value)
    return n


def read_export(path: str | Path) -> Export:
    """The records of an export file; VerifyError if it is not one, so a damaged file is an error
    rather than a certificate about fewer events."""
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
    out = Export([], [], [])
    by_kind = {KIND_DELTA: out.deltas, KIND_HEAD: out.heads, KIND_RECEIPT: out.receipts}
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
        if kind not in by_kind:
            raise VerifyError(f"{path}: record {i} has unknown kind {kind}")
        by_kind[kind].append(LogRecord(part, off, ts, key, value))
        i += 1
    return out


def export_deltas(settings: Settings, head_id: str, path: str | Path, *, include_heads: bool = True,
                  include_receipts: bool = True, timeout: float = 60.0) -> dict[str, Any]:
    """Write every ``deltas`` message of ``head_id`` (key = head id, or unkeyed) and, unless
    ``include_heads`` / ``include_receipts`` is False, its head updates and receipts to ``path``.
    Heads and receipts are read first, so the deltas cover them. Returns a summary."""
    heads = read_head_records(settings, heads_family(settings.topic_prefix), head_id, timeout) if include_heads else []
    receipts = read_receipt_records(settings, head_id, timeout) if include_receipts else []
    deltas = [r for r in read_head_records(settings, settings.topic("deltas"), head_id, timeout)
              if delta_head(r) == head_id]
    size = write_export(path, deltas, heads, receipts)
    return {"path": str(path), "head_id": head_id, "deltas": len(deltas), "heads": len(heads),
            "receipts": len(receipts), "bytes": size}
