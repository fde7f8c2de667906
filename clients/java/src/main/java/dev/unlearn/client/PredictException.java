package dev.unlearn.client;

/** A predict input the head refuses, with serving's reason code (e.g. {@code dimension_mismatch}). */
public class PredictException extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;
    private final String reason;

    public PredictException(String reason, String detail) {
        super(reason + ": " + detail);
        this.reason = reason;
    }

    /** The machine-readable reason code (as serving's HTTP error names it). */
    public String reason() {
        return reason;
    }
}
