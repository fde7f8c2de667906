package dev.unlearn.client;

import java.util.Arrays;

/**
 * One head version, as decoded from a {@code ULHD} message (docs/formats.md, "Heads"): the
 * weights W (d x c, row-major), optionally the posterior T = (S + gamma I)^-1 (d x d), the
 * version receipts point at, the ledger digest (absent on a fast update without one), the
 * retained-rows hash, the head contract version and the retained classes (flag bits 1, 3, 4).
 * Unsigned 64-bit fields ({@link #version()}, {@link #nRetained()}, {@link #eventsCovered()}) are
 * held in a {@code long}: compare them with {@link Long#compareUnsigned}. Immutable: the arrays
 * are never handed out, only copies.
 */
public final class HeadUpdate {
    /** {@code "exact"} (Cholesky from the ledger) or {@code "fast"} (tracker-updated). */
    public enum Mode { EXACT, FAST }

    private final String headId;
    private final long version;
    private final Mode mode;
    private final String digest;
    private final long nRetained;
    private final long eventsCovered;
    private final int[] partitions;
    private final long[] offsets;
    private final double drift;
    private final double gamma;
    private final double createdTs;
    private final int d;
    private final int c;
    private final double[] weights;
    private final double[] posterior;
    private final String retainedHash;
    private final Long contractVersion;
    private final boolean[] retainedClasses;

    HeadUpdate(String headId, long version, Mode mode, String digest, long nRetained, long eventsCovered,
               int[] partitions, long[] offsets, double drift, double gamma, double createdTs, int d, int c,
               double[] weights, double[] posterior, String retainedHash, Long contractVersion,
               boolean[] retainedClasses) {
        this.headId = headId;
        this.version = version;
        this.mode = mode;
        this.digest = digest;
        this.nRetained = nRetained;
        this.eventsCovered = eventsCovered;
        this.partitions = partitions;
        this.offsets = offsets;
        this.drift = drift;
        this.gamma = gamma;
        this.createdTs = createdTs;
        this.d = d;
        this.c = c;
        this.weights = weights;
        this.posterior = posterior;
        this.retainedHash = retainedHash;
        this.contractVersion = contractVersion;
        this.retainedClasses = retainedClasses;
    }

    public String headId() { return headId; }
    /** The head version (unsigned 64-bit). */
    public long version() { return version; }
    public Mode mode() { return mode; }
    /** Hex SHA-256 of the canonical ledger; null on a fast update that carries none (flag bit 2). */
    public String digest() { return digest; }
    /** Samples in the ledger (unsigned 64-bit). */
    public long nRetained() { return nRetained; }
    /** Events applied in total (unsigned 64-bit). */
    public long eventsCovered() { return eventsCovered; }
    /** Partitions of the deltas topic this version covers, strictly increasing. */
    public int[] partitions() { return partitions.clone(); }
    /** Last deltas offset applied, per entry of {@link #partitions()}. */
    public long[] offsets() { return offsets.clone(); }
    public double drift() { return drift; }
    public double gamma() { return gamma; }
    public double createdTs() { return createdTs; }
    /** Feature dimension. */
    public int d() { return d; }
    /** Outputs (class columns or target width). */
    public int c() { return c; }
    /** W, row-major d x c (a copy; bits as sent). */
    public double[] weights() { return weights.clone(); }
    public double weight(int row, int col) { return weights[row * c + col]; }
    public boolean hasPosterior() { return posterior != null; }
    /** T, row-major d x d (a copy), or null when this update carries none. */
    public double[] posterior() { return posterior == null ? null : posterior.clone(); }
    /** Hex fingerprint of the retained rows' multiset hash, or null when the head does not know it. */
    public String retainedHash() { return retainedHash; }
    /** The head contract version it was built under, or null when its deltas named none. */
    public Long contractVersion() { return contractVersion; }
    /**
     * Which class columns hold retained samples (flag bit 4), or null for a head of target
     * vectors / an update without the bitmap: then every column is an output.
     */
    public boolean[] retainedClasses() { return retainedClasses == null ? null : retainedClasses.clone(); }

    /** The columns a prediction may name: the retained classes, or every column (no bitmap). */
    public boolean isOutput(int col) {
        return retainedClasses == null || retainedClasses[col];
    }

    double[] weightsView() { return weights; }

    double[] posteriorView() { return posterior; }

    /**
     * Is this update newer than {@code other}? A higher version wins; at equal versions an exact
     * update supersedes a fast one. The one ordering every reader uses
     * ({@code HeadUpdate.supersedes} in schemas/head.py).
     */
    public boolean supersedes(HeadUpdate other) {
        if (other == null) {
            return true;
        }
        int cmp = Long.compareUnsigned(version, other.version);
        if (cmp != 0) {
            return cmp > 0;
        }
        return mode == Mode.EXACT && other.mode == Mode.FAST;
    }

    @Override
    public String toString() {
        return "HeadUpdate{" + headId + " v" + Long.toUnsignedString(version) + " " + mode.name().toLowerCase()
                + " d=" + d + " c=" + c + " n_retained=" + Long.toUnsignedString(nRetained)
                + (posterior != null ? " posterior" : "") + (contractVersion != null ? " contract v" + contractVersion : "")
                + (retainedClasses != null ? " classes=" + Arrays.toString(retainedClasses) : "") + "}";
    }
}
