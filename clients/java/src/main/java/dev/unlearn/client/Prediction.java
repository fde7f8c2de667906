package dev.unlearn.client;

/**
 * One input's prediction under one head version: what serving's {@code POST /v1/heads/{head}/predict}
 * returns for it. {@link #scores()} holds x @ W on the output columns and NaN on a class with no
 * retained sample (null in serving's JSON); {@link #predictedClass()} is -1 when the head has no
 * output column; {@link #variance()} is sigma^2 x^T T x, NaN when no posterior is known.
 */
public final class Prediction {
    private final String headId;
    private final long version;
    private final double[] row;
    private final double[] scores;
    private final int predictedClass;
    private final int[] topClasses;
    private final double variance;
    private final Long posteriorVersion;

    Prediction(String headId, long version, double[] row, double[] scores, int predictedClass, int[] topClasses,
               double variance, Long posteriorVersion) {
        this.headId = headId;
        this.version = version;
        this.row = row;
        this.scores = scores;
        this.predictedClass = predictedClass;
        this.topClasses = topClasses;
        this.variance = variance;
        this.posteriorVersion = posteriorVersion;
    }

    public String headId() { return headId; }
    /** The head version that made it (unsigned 64-bit). */
    public long version() { return version; }
    /** The dequantized feature row the head scored (what the ledger would hold for this input). */
    public double[] featureRow() { return row.clone(); }
    public double[] scores() { return scores.clone(); }
    public int predictedClass() { return predictedClass; }
    /** The best output columns, best first (ties: the lower class index first). */
    public int[] topClasses() { return topClasses.clone(); }
    public boolean hasVariance() { return !Double.isNaN(variance); }
    public double variance() { return variance; }
    /** The head version whose posterior gave the variance (null: none). */
    public Long posteriorVersion() { return posteriorVersion; }
}
