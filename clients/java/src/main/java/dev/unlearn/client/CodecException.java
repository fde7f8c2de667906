package dev.unlearn.client;

/**
 * Bytes that are not a valid message of the expected format: truncated, corrupt (checksum),
 * an unknown version or flag, an inconsistent length, a value out of range. The message says
 * which check refused it (docs/formats.md, "Binary framing").
 */
public class CodecException extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;

    public CodecException(String message) {
        super(message);
    }
}
