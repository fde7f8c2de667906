package dev.unlearn.client;

import java.util.Map;

/**
 * The part of a head's contract ({@code unlearn.head-contract/v1} on {@code <prefix>head-registry},
 * docs/registry.md) that predictions need: the input kind, dimension and the quantization of a
 * feature row (L2 normalization, bound, grid 2^-frac_bits). Serving quantizes predict inputs
 * with the contract version the head update names ({@link HeadUpdate#contractVersion()}).
 */
public final class HeadContract {
    /** Serving's fallback for a head with no contract: the Settings defaults (30 bits, bound 1, l2). */
    public static final HeadContract SETTINGS_DEFAULT = new HeadContract("", 0, 0, "features", true, 1.0, 30);

    private final String headId;
    private final long version;
    private final int dimension;
    private final String inputKind;
    private final boolean normalize;
    private final double featureBound;
    private final int fracBits;

    public HeadContract(String headId, long version, int dimension, String inputKind, boolean normalize,
                        double featureBound, int fracBits) {
        if (fracBits < 0 || fracBits > 30) {
            throw new IllegalArgumentException("frac_bits must be in 0..30, got " + fracBits);
        }
        if (!(Double.isFinite(featureBound) && featureBound > 0) || featureBound * Math.pow(2, fracBits) > 0x1p30) {
            throw new IllegalArgumentException("feature_bound must be finite, > 0 and * 2^frac_bits <= 2^30, got "
                    + featureBound);
        }
        this.headId = headId;
        this.version = version;
        this.dimension = dimension;
        this.inputKind = inputKind;
        this.normalize = normalize;
        this.featureBound = featureBound;
        this.fracBits = fracBits;
    }

    /** A contract from its registry record value (JSON); IllegalArgumentException if malformed. */
    public static HeadContract decode(byte[] value) {
        Object doc = Json.parse(value);
        if (!(doc instanceof Map)) {
            throw new IllegalArgumentException("a head contract is a JSON object");
        }
        return fromMap((Map<?, ?>) doc);
    }

    static HeadContract fromMap(Map<?, ?> m) {
        if (!"unlearn.head-contract/v1".equals(m.get("schema"))) {
            throw new IllegalArgumentException("not an unlearn.head-contract/v1: schema " + m.get("schema"));
        }
        Object headId = m.get("head_id");
        Object norm = m.get("normalization");
        if (!(headId instanceof String) || !Ids.isValid((String) headId)) {
            throw new IllegalArgumentException("head contract: bad head_id");
        }
        if (!"l2".equals(norm) && !"none".equals(norm)) {
            throw new IllegalArgumentException("head contract: normalization must be l2 or none, got " + norm);
        }
        Object kind = m.get("input_kind");
        if (!(kind instanceof String)) {
            throw new IllegalArgumentException("head contract: bad input_kind");
        }
        return new HeadContract((String) headId, integer(m, "version", 1, Long.MAX_VALUE),
                (int) integer(m, "dimension", 1, 65536), (String) kind, "l2".equals(norm),
                number(m, "feature_bound"), (int) integer(m, "frac_bits", 1, 30));
    }

    private static long integer(Map<?, ?> m, String k, long lo, long hi) {
        Object v = m.get(k);
        if (!(v instanceof Long) || (Long) v < lo || (Long) v > hi) {
            throw new IllegalArgumentException("head contract: " + k + " must be an integer in " + lo + ".." + hi);
        }
        return (Long) v;
    }

    private static double number(Map<?, ?> m, String k) {
        Object v = m.get(k);
        if (!(v instanceof Long) && !(v instanceof Double)) {
            throw new IllegalArgumentException("head contract: " + k + " must be a number");
        }
        return ((Number) v).doubleValue();
    }

    public String headId() { return headId; }
    public long version() { return version; }
    public int dimension() { return dimension; }
    public String inputKind() { return inputKind; }
    public boolean normalize() { return normalize; }
    public double featureBound() { return featureBound; }
    public int fracBits() { return fracBits; }

    /**
     * q = rint(f' * 2^frac_bits) of one feature vector, f' = f / max(||f||_2, 1e-12) when the
     * contract normalizes (else f): exactly {@code features.contract.quantize_feature_row}.
     * Refuses (never clips) a NaN/infinite value ({@code non_finite_feature}) and a component
     * beyond the bound ({@code feature_out_of_bound}).
     */
    public long[] quantize(double[] f) {
        double[] x = f.clone();
        for (double v : x) {
            if (!Double.isFinite(v)) {
                throw new PredictException("non_finite_feature", "a feature is NaN or infinite");
            }
        }
        if (normalize) {
            double ss = 0;
            for (double v : x) {
                ss += v * v;
            }
            if (!Double.isFinite(ss)) {
                throw new PredictException("non_finite_feature", "the squared L2 norm overflows float64");
            }
            double norm = Math.max(Math.sqrt(ss), 1e-12);
            for (int i = 0; i < x.length; i++) {
                x[i] = x[i] / norm;
            }
        }
        double scale = (double) (1L << fracBits);
        long[] q = new long[x.length];
        for (int i = 0; i < x.length; i++) {
            if (Math.abs(x[i]) > featureBound) {
                throw new PredictException("feature_out_of_bound", "|feature[" + i + "]| = " + Math.abs(x[i])
                        + " exceeds the bound " + featureBound + " (features are rejected, never clipped)");
            }
            q[i] = (long) Math.rint(x[i] * scale);
        }
        return q;
    }

    /** The float64 row the ledger represents for {@code f}: q * 2^-frac_bits (exact). */
    public double[] featureRow(double[] f) {
        long[] q = quantize(f);
        double scale = (double) (1L << fracBits);
        double[] out = new double[q.length];
        for (int i = 0; i < q.length; i++) {
            out[i] = (double) q[i] / scale;
        }
        return out;
    }
}
