package dev.unlearn.client;

/** A transit key or sealed input that is unusable (malformed record, low-order key, wrong key). */
public class TransitException extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;

    public TransitException(String message) {
        super(message);
    }
}
