package dev.unlearn.client;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.zip.CRC32C;

/**
 * Decoder of the binary {@code ULHD} head updates (docs/formats.md, "Binary framing" and
 * "Heads"); the Python reference is {@code schemas/head.decode_head}. Checks in the
 * specified order: magic, total length, CRC32C, version, flags, then the body, where every
 * length is checked against what is left before anything is allocated. Anything else is a
 * {@link CodecException}; a decoder never reads out of bounds and never trusts a length.
 */
public final class HeadCodec {
    public static final int VERSION = 1;
    static final int FLAG_POSTERIOR = 0x0001;
    static final int FLAG_RETAINED_HASH = 0x0002;
    static final int FLAG_NO_DIGEST = 0x0004;
    static final int FLAG_CONTRACT = 0x0008;
    static final int FLAG_CLASSES = 0x0010;
    static final int FLAG_COLUMNS = 0x0020;
    static final int FLAGS = FLAG_POSTERIOR | FLAG_RETAINED_HASH | FLAG_NO_DIGEST | FLAG_CONTRACT | FLAG_CLASSES
            | FLAG_COLUMNS;
    /** Most values (d x c) of a W whose all-zero columns were left out (flag bit 5): a short message
     * must not make a decoder allocate more than 128 MiB. */
    static final long SPARSE_MAX_VALUES = 1L << 24;
    private static final int PREFIX = 16;
    private static final int CRC = 4;
    private static final int MIN_FRAME = PREFIX + CRC;

    private HeadCodec() {}

    /** CRC32C (Castagnoli) of {@code data[off, off+len)}, the checksum of every binary message. */
    public static int crc32c(byte[] data, int off, int len) {
        CRC32C crc = new CRC32C();
        crc.update(data, off, len);
        return (int) crc.getValue();
    }

    /** Parse and validate one head update; {@link CodecException} on anything wrong. */
    public static HeadUpdate decode(byte[] buf) {
        if (buf == null) {
            throw new CodecException("head: expected bytes, got null");
        }
        int n = buf.length;
        if (n < MIN_FRAME) {
            throw new CodecException("head: truncated: " + n + " bytes, a message has at least " + MIN_FRAME);
        }
        ByteBuffer bb = ByteBuffer.wrap(buf).order(ByteOrder.LITTLE_ENDIAN);
        if (buf[0] != 'U' || buf[1] != 'L' || buf[2] != 'H' || buf[3] != 'D') {
            throw new CodecException("head: bad magic " + Hex.encode(buf, 0, 4) + ", expected ULHD (not a head)");
        }
        int version = Short.toUnsignedInt(bb.getShort(4));
        int flags = Short.toUnsignedInt(bb.getShort(6));
        long total = bb.getLong(8);
        if (total != n) {
            String kind = Long.compareUnsigned(n, total) < 0 ? "truncated" : "trailing bytes or corrupt length";
            throw new CodecException("head: " + kind + ": header says " + Long.toUnsignedString(total)
                    + " bytes, got " + n);
        }
        int want = bb.getInt(n - CRC);
        int got = crc32c(buf, 0, n - CRC);
        if (got != want) {
            throw new CodecException(String.format("head: checksum mismatch (crc32c %#010x, stored %#010x): corrupt",
                    got, want));
        }
        if (version != VERSION) {
            throw new CodecException("head: unknown version " + version + " (this decoder knows " + VERSION + ")");
        }
        if ((flags & ~FLAGS) != 0) {
            throw new CodecException(String.format("head: unknown flags %#06x for version %d", flags, version));
        }
        Reader r = new Reader(bb, PREFIX, n - CRC);
        String headId = r.str16("head_id");
        if (!Ids.isValid(headId)) {
            throw r.fail("head_id '" + headId.substring(0, Math.min(80, headId.length()))
                    + "' is not an id (1..128 characters of [A-Za-z0-9._:@+-])");
        }
        r.need(8 + 1 + 7 + 32 + 8 + 8 + 8 + 8 + 8 + 4 + 4 + 4, "fixed fields");
        long hVersion = r.u64();
        int modeI = r.u8();
        boolean reservedZero = true;
        for (int i = 0; i < 7; i++) {
            reservedZero &= r.u8() == 0;
        }
        byte[] digest = r.bytes(32, "digest");
        long nRetained = r.u64();
        long events = r.u64();
        double ts = r.f64();
        double drift = r.f64();
        double gamma = r.f64();
        long d = r.u32();
        long c = r.u32();
        long nOff = r.u32();
        if (!reservedZero) {
            throw r.fail("reserved bytes after mode are not 0");
        }
        if (modeI >= 2) {
            throw r.fail("unknown mode " + modeI);
        }
        HeadUpdate.Mode mode = modeI == 0 ? HeadUpdate.Mode.EXACT : HeadUpdate.Mode.FAST;
        if ((flags & FLAG_NO_DIGEST) != 0 && (mode == HeadUpdate.Mode.EXACT || !allZero(digest))) {
            throw r.fail("no digest (flag bit 2) is for fast updates only, and its 32 bytes must be 0");
        }
        if (!(Double.isFinite(gamma) && gamma > 0)) {
            throw r.fail("gamma must be finite and > 0, got " + gamma);
        }
        if (!(Double.isFinite(drift) && drift >= 0)) {
            throw r.fail("drift must be finite and >= 0, got " + drift);
        }
        if (!(Double.isFinite(ts) && ts >= 0)) {
            throw r.fail("created_ts must be finite and >= 0, got " + ts);
        }
        if (d < 1) {
            throw r.fail("d must be >= 1");
        }
        String retained = (flags & FLAG_RETAINED_HASH) != 0 ? Hex.encode(r.bytes(32, "retained_hash")) : null;
        Long contractVersion = null;
        if ((flags & FLAG_CONTRACT) != 0) {
            r.need(8, "contract_version");
            long cv = r.u64();
            if (cv < 1) { // as unsigned: 0, or >= 2^63
                throw r.fail("contract_version " + Long.toUnsignedString(cv) + " out of range 1..2^63-1");
            }
            contractVersion = cv;
        }
        boolean[] classes = null;
        if ((flags & FLAG_CLASSES) != 0) {
            classes = readClasses(r, c, nRetained);
        }
        boolean[] columns = null;
        if ((flags & FLAG_COLUMNS) != 0) {
            if (d * c > SPARSE_MAX_VALUES) { // d, c < 2^32: no overflow
                throw r.fail("weights of " + d + " x " + c + " values exceed " + SPARSE_MAX_VALUES
                        + " with weight_columns (flag bit 5)");
            }
            columns = readBitmap(r, c, "weight_columns", "column");
            if (countSet(columns) == c) {
                throw r.fail("weight_columns marks every column (such an update is written without flag bit 5)");
            }
        }
        r.need(count(nOff, 4), "offset partitions");
        int[] parts = new int[(int) nOff];
        for (int i = 0; i < parts.length; i++) {
            parts[i] = r.i32();
        }
        r.pad8("offsets");
        r.need(count(nOff, 8), "offsets");
        long[] offs = new long[(int) nOff];
        for (int i = 0; i < offs.length; i++) {
            offs[i] = r.i64();
        }
        long last = -1;
        for (int i = 0; i < parts.length; i++) {
            if (parts[i] < 0 || offs[i] < 0) {
                throw r.fail("offset (" + parts[i] + ", " + offs[i]
                        + ") out of range (partition int32 >= 0, offset int64 >= 0)");
            }
            if (parts[i] <= last) {
                throw r.fail("offsets must have one entry per partition, sorted; partition " + parts[i] + " repeats");
            }
            last = parts[i];
        }
        double[] weights = columns == null ? r.f64s(d, c, "weights") : expand(r, d, columns);
        double[] posterior = (flags & FLAG_POSTERIOR) != 0 ? r.f64s(d, d, "posterior") : null;
        r.done();
        return new HeadUpdate(headId, hVersion, mode, (flags & FLAG_NO_DIGEST) != 0 ? null : Hex.encode(digest),
                nRetained, events, parts, offs, drift, gamma, ts, (int) d, (int) c, weights, posterior, retained,
                contractVersion, classes);
    }

    private static boolean[] readClasses(Reader r, long c, long nRetained) {
        boolean[] mask = readBitmap(r, c, "retained_classes", "class");
        long marked = countSet(mask);
        if (Long.compareUnsigned(marked, nRetained) > 0) {
            throw r.fail("retained_classes marks " + marked + " classes, more than n_retained="
                    + Long.toUnsignedString(nRetained) + " samples");
        }
        return mask;
    }

    /** A bitmap of {@code c} bits, bit j % 8 of byte j / 8; refused when it sets a bit past the last. */
    private static boolean[] readBitmap(Reader r, long c, String what, String unit) {
        long nBytes = (c + 7) / 8;
        byte[] raw = r.bytes(nBytes, what);
        boolean[] mask = new boolean[(int) c];
        for (long j = 0; j < nBytes * 8; j++) {
            boolean bit = ((raw[(int) (j >>> 3)] >>> (j & 7)) & 1) != 0;
            if (bit && j >= c) {
                throw r.fail(what + " sets bits past " + unit + " " + (c - 1)
                        + " (the last byte's unused bits must be 0)");
            }
            if (bit) {
                mask[(int) j] = true;
            }
        }
        return mask;
    }

    private static long countSet(boolean[] mask) {
        long n = 0;
        for (boolean b : mask) {
            if (b) {
                n++;
            }
        }
        return n;
    }

    /** W (d x c, row-major) from the marked columns the message holds; the others +0.0. A marked
     * column whose values are all +0.0 is refused: the encoder leaves those out (one encoding). */
    private static double[] expand(Reader r, long d, boolean[] columns) {
        int c = columns.length;
        int k = (int) countSet(columns);
        double[] packed = r.f64s(d, k, "weights");
        for (int at = 0, j = 0; j < c; j++) {
            if (!columns[j]) {
                continue;
            }
            boolean zero = true;
            for (int i = 0; i < d && zero; i++) {
                zero = Double.doubleToRawLongBits(packed[i * k + at]) == 0L;
            }
            if (zero) {
                throw r.fail("weights: weight_columns marks column " + j + ", whose values are all +0.0 (left out, not sent)");
            }
            at++;
        }
        double[] weights = new double[(int) (d * c)];
        for (int i = 0; i < d; i++) {
            int at = 0;
            for (int j = 0; j < c; j++) {
                if (columns[j]) {
                    weights[i * c + j] = packed[i * k + at++];
                }
            }
        }
        return weights;
    }

    /** {@code n * size} bytes, or -1 when that exceeds every message (the need check fails). */
    private static long count(long n, int size) {
        return n > Long.MAX_VALUE / size ? -1 : n * size;
    }

    private static boolean allZero(byte[] b) {
        for (byte x : b) {
            if (x != 0) {
                return false;
            }
        }
        return true;
    }

    /** Bounds-checked little-endian reads of the body; failures name the byte offset. */
    private static final class Reader {
        private final ByteBuffer bb;
        private final int end;
        private int pos;

        Reader(ByteBuffer bb, int start, int end) {
            this.bb = bb;
            this.pos = start;
            this.end = end;
        }

        CodecException fail(String msg) {
            return new CodecException("head: " + msg + " (at byte " + pos + ")");
        }

        long remaining() {
            return end - pos;
        }

        void need(long size, String what) {
            if (size < 0 || size > remaining()) {
                throw fail(what + " needs " + (size < 0 ? "more than 2^63" : Long.toString(size))
                        + " bytes, only " + remaining() + " left");
            }
        }

        int u8() { return Byte.toUnsignedInt(bb.get(pos++)); }

        int i32() { int v = bb.getInt(pos); pos += 4; return v; }

        long u32() { long v = Integer.toUnsignedLong(bb.getInt(pos)); pos += 4; return v; }

        long u64() { long v = bb.getLong(pos); pos += 8; return v; }

        long i64() { return u64(); }

        double f64() { double v = bb.getDouble(pos); pos += 8; return v; }

        byte[] bytes(long size, String what) {
            need(size, what);
            byte[] out = new byte[(int) size];
            bb.get(pos, out);
            pos += (int) size;
            return out;
        }

        String str16(String what) {
            need(2, what + " length");
            int len = Short.toUnsignedInt(bb.getShort(pos));
            pos += 2;
            if (len == 0) {
                throw fail(what + " is empty");
            }
            byte[] raw = bytes(len, what);
            try {
                return StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                        .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(raw)).toString();
            } catch (CharacterCodingException e) {
                throw fail(what + " is not UTF-8");
            }
        }

        void pad8(String what) {
            int p = (-pos) & 7;
            if (p != 0) {
                need(p, "padding before " + what);
                for (int i = 0; i < p; i++) {
                    if (bb.get(pos + i) != 0) {
                        throw fail("non-zero padding before " + what);
                    }
                }
                pos += p;
            }
        }

        /** {@code rows * cols} float64 after pad8, checked against what is left before allocating. */
        double[] f64s(long rows, long cols, String what) {
            pad8(what);
            long items = rows == 0 || cols <= Long.MAX_VALUE / 8 / rows ? rows * cols : -1;
            need(items < 0 ? -1 : items * 8, what);
            double[] out = new double[(int) items];
            for (int i = 0; i < out.length; i++) {
                out[i] = bb.getDouble(pos);
                pos += 8;
            }
            return out;
        }

        void done() {
            if (remaining() != 0) {
                throw fail(remaining() + " unexpected bytes before the checksum");
            }
        }
    }
}
