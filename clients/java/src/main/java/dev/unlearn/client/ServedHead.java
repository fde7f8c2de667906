package dev.unlearn.client;

import java.util.ArrayList;
import java.util.List;

/**
 * One immutable served state of a head, as serving's {@code predict.ServedHead}: the update and
 * the posterior used for variance (the update's own T, else the T of the last exact update of
 * the same dimension that carried one), so a prediction never mixes two heads.
 */
public final class ServedHead {
    private final HeadUpdate update;
    private final double[] posterior;
    private final Long posteriorVersion;

    ServedHead(HeadUpdate update, double[] posterior, Long posteriorVersion) {
        this.update = update;
        this.posterior = posterior;
        this.posteriorVersion = posteriorVersion;
    }

    /** The state after offering {@code update} to {@code current} (null: nothing served yet). */
    static ServedHead next(ServedHead current, HeadUpdate update) {
        if (update.hasPosterior()) {
            return new ServedHead(update, update.posteriorView(), update.version());
        }
        if (current != null && current.posterior != null && current.update.d() == update.d()) {
            return new ServedHead(update, current.posterior, current.posteriorVersion);
        }
        return new ServedHead(update, null, null);
    }

    public HeadUpdate update() { return update; }
    /** The version whose posterior gives the variance (null: none known yet). */
    public Long posteriorVersion() { return posteriorVersion; }
    /** "current_head", "last_exact_head" or null, as serving's response names the variance's source. */
    public String posteriorSource() {
        if (posterior == null) {
            return null;
        }
        return update.hasPosterior() ? "current_head" : "last_exact_head";
    }

    /**
     * Predict one raw feature vector: quantized with {@code contract} (the head's, see
     * {@link HeadContract#quantize}), then scores, classes ranked over the output columns and
     * the predictive variance, as serving computes them. {@link PredictException} for an input
     * the head refuses.
     */
    public Prediction predict(double[] features, HeadContract contract, double sigma2, int topK) {
        if (topK < 1) {
            throw new IllegalArgumentException("top_k must be >= 1, got " + topK);
        }
        if (!"features".equals(contract.inputKind())) {
            throw new PredictException("backbone_mismatch", "head " + update.headId() + " takes "
                    + contract.inputKind() + " inputs (contract v" + contract.version() + "), got features");
        }
        int d = update.d();
        int c = update.c();
        if (features.length != d) {
            throw new PredictException("dimension_mismatch", features.length + " features, head "
                    + update.headId() + " has d = " + d);
        }
        double[] x = contract.featureRow(features);
        double[] w = update.weightsView();
        double[] raw = new double[c];
        for (int i = 0; i < d; i++) {
            double xi = x[i];
            for (int j = 0; j < c; j++) {
                raw[j] += xi * w[i * c + j];
            }
        }
        double[] scores = new double[c];
        List<Integer> cols = new ArrayList<>();
        for (int j = 0; j < c; j++) {
            boolean out = update.isOutput(j);
            scores[j] = out ? raw[j] : Double.NaN;
            if (out) {
                cols.add(j);
            }
        }
        // best first; NaN last; equal scores (and -0.0 == 0.0) keep the lower index first (a stable sort)
        cols.sort((a, b) -> {
            double sa = raw[a];
            double sb = raw[b];
            if (Double.isNaN(sa) || Double.isNaN(sb)) {
                return Boolean.compare(Double.isNaN(sa), Double.isNaN(sb));
            }
            return sa > sb ? -1 : (sa < sb ? 1 : 0);
        });
        int k = Math.min(topK, cols.size());
        int[] top = new int[k];
        for (int i = 0; i < k; i++) {
            top[i] = cols.get(i);
        }
        double variance = Double.NaN;
        if (posterior != null) {
            double v = 0;
            for (int i = 0; i < d; i++) {
                double row = 0;
                for (int j = 0; j < d; j++) {
                    row += posterior[i * d + j] * x[j];
                }
                v += x[i] * row;
            }
            variance = sigma2 * v;
        }
        return new Prediction(update.headId(), update.version(), x, scores, k > 0 ? top[0] : -1, top, variance,
                posteriorVersion);
    }
}
