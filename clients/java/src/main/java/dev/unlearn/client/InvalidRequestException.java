package dev.unlearn.client;

/** A request that does not conform to {@code unlearn.request/v1}, with the featurizer's reason code. */
public class InvalidRequestException extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;
    private final String reason;

    public InvalidRequestException(String reason, String detail) {
        super(reason + ": " + detail);
        this.reason = reason;
    }

    /** The reason code (docs/formats.md, "Request reason codes"), e.g. {@code non_finite_feature}. */
    public String reason() {
        return reason;
    }
}
