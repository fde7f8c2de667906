package dev.unlearn.client;

/** The client cannot do what was asked: closed, no broker or topic, undelivered request, no transit key. */
public class ClientException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public ClientException(String message) {
        super(message);
    }

    public ClientException(String message, Throwable cause) {
        super(message, cause);
    }
}
