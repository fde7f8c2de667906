package dev.unlearn.client;

import java.time.Duration;

/** No receipt arrived in time for a delete: names the event, the head and the topic. */
public class ReceiptTimeoutException extends ClientException {
    private static final long serialVersionUID = 1L;
    private final String eventId;
    private final String headId;

    public ReceiptTimeoutException(String eventId, String headId, Duration timeout, String topic) {
        super("no receipt for event '" + eventId + "' (head '" + headId + "') on " + topic + " within "
                + timeout.toMillis() / 1000.0 + "s; are the featurizer and ledger workers running and caught up? "
                + "(rejected or unauthenticated requests are in the deadletter topic)");
        this.eventId = eventId;
        this.headId = headId;
    }

    public String eventId() { return eventId; }
    public String headId() { return headId; }
}
