package dev.unlearn.client;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.math.BigInteger;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.List;
import java.util.Map;

/** Reads the shared vectors that the Python reference generates (clients/vectors/generate.py). */
final class Vectors {
    static final Path DIR = Path.of(System.getProperty("basedir", "."), "..", "vectors").normalize();

    private Vectors() {}

    @SuppressWarnings("unchecked")
    static Map<String, Object> load(String name) {
        try {
            return (Map<String, Object>) Json.parse(Files.readAllBytes(DIR.resolve(name)));
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read the shared vectors " + DIR.resolve(name)
                    + " (run .venv/bin/python clients/vectors/generate.py)", e);
        }
    }

    @SuppressWarnings("unchecked")
    static List<Map<String, Object>> list(Map<String, Object> m, String key) {
        return (List<Map<String, Object>>) m.get(key);
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> map(Object o) {
        return (Map<String, Object>) o;
    }

    static byte[] b64(Object s) {
        return Base64.getDecoder().decode((String) s);
    }

    /** A JSON integer (Long or BigInteger) as an unsigned 64-bit long. */
    static long u64(Object o) {
        return o instanceof BigInteger ? ((BigInteger) o).longValue() : (Long) o;
    }

    static double num(Object o) {
        return ((Number) o).doubleValue();
    }

    static double[] doubles(Object o) {
        List<?> l = (List<?>) o;
        double[] out = new double[l.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = num(l.get(i));
        }
        return out;
    }

    static double[] f64le(String hex) {
        byte[] b = Hex.decode(hex);
        double[] out = new double[b.length / 8];
        java.nio.ByteBuffer bb = java.nio.ByteBuffer.wrap(b).order(java.nio.ByteOrder.LITTLE_ENDIAN);
        for (int i = 0; i < out.length; i++) {
            out[i] = bb.getDouble();
        }
        return out;
    }

    static long[] bits(double[] a) {
        long[] out = new long[a.length];
        for (int i = 0; i < a.length; i++) {
            out[i] = Double.doubleToRawLongBits(a[i]);
        }
        return out;
    }

    static double leBits(String hex) {
        return f64le(hex)[0];
    }
}
