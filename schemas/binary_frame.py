"""The frame every binary message shares (``deltas`` and ``heads``): prefix, CRC32C trailer, and
the bounds-checked :class:`Reader` and :class:`Writer` the codecs build on.

The byte layout and the order of a decoder's checks are in docs/formats.md, "Binary framing".
The body is read by a :class:`Reader` that checks every length against what is left before
touching it: a decoder never reads out of bounds and never allocates from an unchecked length.

CRC32C (Castagnoli, the checksum Kafka itself uses for record batches) rather than a truncated
SHA-256: it detects every burst error up to 32 bits and random corruption with probability
1 - 2^-32, is far cheaper with the hardware instruction, and has a library in every language. It
guards against corruption, not forgery. The ``crc32c`` package is used because it reads any
buffer (numpy memory included): encoding then makes exactly one large allocation (the message),
which matters on VMs where fresh pages are expensive.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c as _crc32c
import numpy as np

__all__ = [
    "MIN_FRAME",
    "PREFIX",
    "CodecError",
    "Reader",
    "Writer",
    "check_frame",
    "crc32c",
]

class CodecError(ValueError):
    """Bytes that are not a valid message of the expected format (truncated, corrupt, unknown
    version, inconsistent lengths), or arguments that cannot be encoded."""


PREFIX = struct.Struct("<4sHHQ")  # magic, version, flags, total_len
_CRC = struct.Struct("<I")
MIN_FRAME = PREFIX.size + _CRC.size



def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C (Castagnoli; reflected, init and final xor 0xFFFFFFFF) of ``data``; pass the
    previous result as ``value`` to continue over several chunks."""
    return int(_crc32c.crc32c(data, value=value))


def check_frame(buf: bytes | bytearray | memoryview, magic: bytes, what: str) -> tuple[memoryview, int, int]:
    """Validate the frame; return (body view without prefix/CRC, version, flags)."""
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise CodecError(f"{what}: expected bytes, got {type(buf).__name__}")
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        if not mv.c_contiguous:
            raise CodecError(f"{what}: expected a contiguous buffer")
        mv = mv.cast("B")
    n = len(mv)
    if n < MIN_FRAME:
        raise CodecError(f"{what}: truncated: {n} bytes, a message has at least {MIN_FRAME}")
    got_magic, version, flags, total = PREFIX.unpack_from(mv, 0)
    if got_magic != magic:
        raise CodecError(f"{what}: bad magic {bytes(got_magic)!r}, expected {magic!r} (not a {what})")
    if total != n:
        kind = "truncated" if n < total else "trailing bytes or corrupt length"
        raise CodecError(f"{what}: {kind}: header says {total} bytes, got {n}")
    (want,) = _CRC.unpack_from(mv, n - _CRC.size)
    got = crc32c(mv[: n - _CRC.size])
    if got != want:
        raise CodecError(f"{what}: checksum mismatch (crc32c {got:#010x}, stored {want:#010x}): corrupt")
    return mv[PREFIX.size : n - _CRC.size], version, flags


class Reader:
    """Bounds-checked little-endian reads from a body view; offsets are body-relative and the
    body starts 16 bytes into the message (8-aligned, so alignment is the same for both)."""

    __slots__ = ("base", "mv", "pos", "what")

    def __init__(self, mv: memoryview, what: str, base: int = PREFIX.size) -> None:
        self.mv = mv
        self.pos = 0
        self.what = what
        self.base = base

    def remaining(self) -> int:
        return len(self.mv) - self.pos

    def fail(self, msg: str) -> CodecError:
        return CodecError(f"{self.what}: {msg} (at byte {self.base + self.pos})")

    def need(self, size: int, what: str) -> None:
        if size < 0 or size > self.remaining():
            raise self.fail(f"{what} needs {size} bytes, only {self.remaining()} left")

    def unpack(self, st: struct.Struct, what: str) -> tuple:
        self.need(st.size, what)
        out = st.unpack_from(self.mv, self.pos)
        self.pos += st.size
        return out

    def raw(self, size: int, what: str) -> memoryview:
        self.need(size, what)
        out = self.mv[self.pos : self.pos + size]
        self.pos += size
        return out

    def str16(self, what: str, allow_empty: bool = False) -> str:
        (n,) = self.unpack(_U16, f"{what} length")
        if n == 0 and not allow_empty:
            raise self.fail(f"{what} is empty")
        try:
            return str(self.raw(n, what), "utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not UTF-8: {exc.reason}") from None

    def pad8(self, what: str) -> None:
        p = (-(self.base + self.pos)) % 8
        if p and any(self.raw(p, f"padding before {what}")):
            raise self.fail(f"non-zero padding before {what}")

    def array(self, dtype: str, count: int, what: str, align: bool = True) -> np.ndarray:
        """A read-only numpy view (zero-copy) of ``count`` items."""
        if align:
            self.pad8(what)
        itemsize = np.dtype(dtype).itemsize
        self.need(count * itemsize, what)
        out = np.frombuffer(self.mv, dtype=dtype, count=count, offset=self.pos)
        self.pos += count * itemsize
        return out

    def str_column(self, count: int, what: str, allow_empty: bool = False) -> tuple[str, ...]:
        """``count`` strings: u16 byte lengths[count], then the UTF-8 bytes back to back (empty
        strings only where ``allow_empty``)."""
        lengths = self.array("<u2", count, f"{what} lengths", align=False)
        if count and not allow_empty and not lengths.all():
            raise self.fail(f"{what}: empty string")
        total = int(lengths.sum(dtype=np.int64))
        blob = bytes(self.raw(total, f"{what} bytes"))
        ends = np.cumsum(lengths, dtype=np.int64).tolist()
        starts = [0, *ends[:-1]]
        try:
            if blob.isascii():  # one decode, then slices: byte offsets are char offsets
                text = blob.decode("ascii")
                return tuple(text[a:b] for a, b in zip(starts, ends))
            return tuple(blob[a:b].decode("utf-8") for a, b in zip(starts, ends))
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not UTF-8: {exc.reason}") from None

    def done(self) -> None:
        if self.remaining():
            raise self.fail(f"{self.remaining()} unexpected bytes before the checksum")


_U16 = struct.Struct("<H")


class Writer:
    """Collects parts of a message and frames it (prefix + body + CRC) with one join."""

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = PREFIX.size  # body offsets are tracked relative to the message start

    def put(self, b: bytes | memoryview) -> None:
        self.parts.append(b)
        self.size += len(b)

    def pack(self, st: struct.Struct, *values: object) -> None:
        self.put(st.pack(*values))

    def str16(self, s: str, what: str, allow_empty: bool = False) -> None:
        if not isinstance(s, str):
            raise CodecError(f"{what} must be a str, got {type(s).__name__}")
        try:
            b = s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CodecError(f"{what}: not encodable as UTF-8: {exc.reason}") from None
        if len(b) > 0xFFFF or (not b and not allow_empty):
            raise CodecError(f"{what} must be 1..65535 UTF-8 bytes, got {len(b)}")
        self.put(_U16.pack(len(b)) + b)

    def pad8(self) -> None:
        p = (-self.size) % 8
        if p:
            self.put(bytes(p))

    def array(self, a: np.ndarray, align: bool = True) -> None:
        if align:
            self.pad8()
        a = np.ascontiguousarray(a)
        self.put(a.reshape(-1).data.cast("B") if a.size else b"")

    def str_column(self, items: Sequence[str], what: str, allow_empty: bool = False) -> None:
        try:
            encoded = [s.encode("utf-8") for s in items]
        except AttributeError:
            bad = next(s for s in items if not isinstance(s, str))
            raise CodecError(f"{what} must hold str, got {type(bad).__name__}") from None
        except UnicodeEncodeError as exc:  # lone surrogates
            raise CodecError(f"{what}: not encodable as UTF-8: {exc.reason}") from None
        lengths = list(map(len, encoded))
        least = 0 if allow_empty else 1
        if lengths and not (min(lengths) >= least and max(lengths) <= 0xFFFF):
            raise CodecError(f"{what}: each must be {least}..65535 UTF-8 bytes")
        self.put(struct.pack(f"<{len(lengths)}H", *lengths))
        self.put(b"".join(encoded))

    def finish(self, magic: bytes, version: int, flags: int) -> bytes:
        total = self.size + _CRC.size
        head = PREFIX.pack(magic, version, flags, total)
        crc = crc32c(head)
        for part in self.parts:  # incremental CRC over views: the join is the only copy
            crc = crc32c(part, crc)
        return b"".join([head, *self.parts, _CRC.pack(crc)])
