package dev.unlearn.client;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.kafka.clients.producer.RecordMetadata;

/**
 * What a produced request is known by: its event id, the broker's acknowledgement and, for a
 * delete or delete_subject, its receipt (exactly one per delete: applied, rejected or tombstoned).
 */
public final class RequestHandle {
    private final String eventId;
    private final String op;
    private final String headId;
    private final String subjectId;
    private final String sampleId;
    private final boolean sealed;
    private final CompletableFuture<RecordMetadata> delivered;
    private final CompletableFuture<Receipt> receipt;
    private final String receiptsTopic;

    RequestHandle(Request req, CompletableFuture<RecordMetadata> delivered, CompletableFuture<Receipt> receipt,
                  String receiptsTopic) {
        this.eventId = req.eventId;
        this.op = req.op;
        this.headId = req.headId;
        this.subjectId = req.subjectId;
        this.sampleId = req.sampleId;
        this.sealed = req.isSealed();
        this.delivered = delivered;
        this.receipt = receipt;
        this.receiptsTopic = receiptsTopic;
    }

    public String eventId() { return eventId; }
    public String op() { return op; }
    public String headId() { return headId; }
    public String subjectId() { return subjectId; }
    public String sampleId() { return sampleId; }
    /** Whether the add's input went out sealed for transit. */
    public boolean sealed() { return sealed; }

    /** Completes with the broker's acknowledgement (partition, offset), or fails with the delivery error. */
    public CompletableFuture<RecordMetadata> delivery() {
        return delivered;
    }

    /** Block until acknowledged; {@link ClientException} if not delivered or not within {@code timeout}. */
    public RecordMetadata waitDelivered(Duration timeout) {
        try {
            return delivered.get(timeout.toMillis(), TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            throw new ClientException("event '" + eventId + "' (head '" + headId + "') was not acknowledged by the "
                    + "broker within " + timeout);
        } catch (ExecutionException e) {
            throw new ClientException("event '" + eventId + "' (head '" + headId + "') was not delivered: "
                    + e.getCause(), e.getCause());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new ClientException("interrupted", e);
        }
    }

    /** The receipt as a future (deletes only; an add gets none). */
    public CompletableFuture<Receipt> receipt() {
        if (receipt == null) {
            throw new ClientException("event '" + eventId + "' is an add: only delete and delete_subject get "
                    + "receipts (use waitDelivered for an add)");
        }
        return receipt;
    }

    /**
     * The deletion's receipt (check {@link Receipt#status()}); {@link ReceiptTimeoutException} when
     * none arrives within {@code timeout} (the request itself is acknowledged first).
     */
    public Receipt waitReceipt(Duration timeout) {
        CompletableFuture<Receipt> f = receipt();
        long deadline = System.nanoTime() + timeout.toNanos();
        waitDelivered(timeout);
        try {
            return f.get(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
        } catch (TimeoutException e) {
            throw new ReceiptTimeoutException(eventId, headId, timeout, receiptsTopic);
        } catch (ExecutionException e) {
            throw new ClientException(String.valueOf(e.getCause().getMessage()), e.getCause());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new ClientException("interrupted", e);
        }
    }
}
