package dev.unlearn.client;

import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.HexFormat;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Produces {@code unlearn.request/v1} envelopes to {@code <prefix>requests} and hands back
 * receipt handles (docs/client.md; the Java twin of the Python SDK's {@code UnlearnClient}).
 *
 * <ul>
 *   <li>Keyed by subject id with an idempotent producer ({@code enable.idempotence}, {@code acks=all}):
 *       a subject's add is never reordered after its delete, a retry never duplicates.</li>
 *   <li>Signed with an Ed25519 {@link RequestSigner} when given (headers over the value's bytes).</li>
 *   <li>Adds sealed for transit by default ({@link Seal#AUTO}); the producer's delivery timeout is
 *       three quarters of the transit grace, so a sealed request is delivered before its key can be
 *       destroyed, or fails loudly.</li>
 *   <li>One receipt listener per client, started before the first delete is produced.</li>
 * </ul>
 * Thread-safe for producing. Close it before the broker goes away.
 */
public final class UnlearnClient implements AutoCloseable {
    /** {@code UNLEARN_TRANSIT_SEAL}: seal when a key is published / always (else refuse) / never. */
    public enum Seal { AUTO, ALWAYS, OFF }

    private final String prefix;
    private final String clientId;
    private final RequestSigner signer;
    private final Seal seal;
    private final String requestsTopic;
    private final KafkaProducer<byte[], byte[]> producer;
    private final Properties consumerConfig;
    private final TransitKeyCache transit;
    private final Duration listenTimeout;
    private final Duration transitWait;
    private ReceiptListener listener;
    private volatile boolean closed;

    /** Build one with {@link #builder(String)}. */
    public static Builder builder(String bootstrap) {
        return new Builder(bootstrap);
    }

    /** Settings of a client (defaults as the Python SDK's Settings). */
    public static final class Builder {
        private final Properties extra = new Properties();
        private String prefix = "unlearn.";
        private String clientId = "unlearn-client";
        private RequestSigner signer;
        private Seal seal = Seal.AUTO;
        private double transitGraceSeconds = 15.0;
        private Duration transitWait = Duration.ofSeconds(30);
        private Duration listenTimeout = Duration.ofSeconds(30);

        private Builder(String bootstrap) {
            extra.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        }

        /** Topic prefix ({@code UNLEARN_TOPIC_PREFIX}, default {@code unlearn.}). */
        public Builder topicPrefix(String p) { this.prefix = p; return this; }
        /** The envelope's {@code client_id} (default {@code unlearn-client}). */
        public Builder clientId(String id) { this.clientId = id; return this; }
        /** Sign every request (signed mode). */
        public Builder signer(RequestSigner s) { this.signer = s; return this; }
        public Builder seal(Seal s) { this.seal = s; return this; }
        /** The featurizers' {@code UNLEARN_TRANSIT_GRACE_SECONDS} (default 15). */
        public Builder transitGraceSeconds(double s) { this.transitGraceSeconds = s; return this; }
        /**
         * {@code UNLEARN_TRANSIT_WAIT_SECONDS} (default 30): how long an add under {@link Seal#AUTO}
         * waits for its head's transit key before it is refused (never sent in plaintext).
         */
        public Builder transitWait(Duration d) { this.transitWait = d; return this; }
        /** How long starting the receipt listener may take. */
        public Builder listenTimeout(Duration d) { this.listenTimeout = d; return this; }
        /** Any Kafka client property (security, ...), for both the producer and the consumers. */
        public Builder kafkaProperty(String k, Object v) { extra.put(k, v); return this; }
        /**
         * Kafka security from the properties file every Python client reads
         * ({@code UNLEARN_KAFKA_PROPERTIES}, librdkafka names; {@link KafkaSecurity#read}).
         */
        public Builder kafkaPropertiesFile(java.nio.file.Path file) { extra.putAll(KafkaSecurity.read(file)); return this; }

        public UnlearnClient build() {
            if (!Ids.isValid(clientId)) {
                throw new IllegalArgumentException("client id must be an id, got " + clientId);
            }
            return new UnlearnClient(this);
        }
    }

    private UnlearnClient(Builder b) {
        this.prefix = b.prefix;
        this.clientId = b.clientId;
        this.signer = b.signer;
        this.seal = b.seal;
        this.listenTimeout = b.listenTimeout;
        this.transitWait = b.transitWait;
        this.requestsTopic = prefix + "requests";
        Properties p = new Properties();
        p.putAll(b.extra);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        if (seal != Seal.OFF) {
            int delivery = Math.max(1000, (int) (b.transitGraceSeconds * 750));
            p.putIfAbsent(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, delivery);
            p.putIfAbsent(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, Math.max(500, delivery - 10));
        }
        this.producer = new KafkaProducer<>(p);
        Properties c = new Properties();
        c.putAll(b.extra);
        c.remove(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG);
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        this.consumerConfig = c;
        this.transit = seal == Seal.OFF ? null : new TransitKeyCache(c, prefix);
    }

    /** A fresh, globally unique event id (UUID4, 32 hex characters). */
    public static String newEventId() {
        return UUID.randomUUID().toString().replace("-", "");
    }

    private static Double now() {
        return System.currentTimeMillis() / 1000.0;
    }

    /** Add one sample with a class index label. */
    public RequestHandle add(String headId, String subjectId, String sampleId, long label, Input input) {
        return send(Request.add(newEventId(), headId, clientId, subjectId, sampleId, label, input, now()));
    }

    /** Add one sample with a target-vector label. */
    public RequestHandle add(String headId, String subjectId, String sampleId, double[] label, Input input) {
        return send(Request.add(newEventId(), headId, clientId, subjectId, sampleId, label, input, now()));
    }

    /** Delete one sample (the featurizer reuses the add's cached features); answered by one receipt. */
    public RequestHandle delete(String headId, String sampleId, String subjectId) {
        return send(Request.delete(newEventId(), headId, clientId, subjectId, sampleId, now()));
    }

    /** Delete every sample of a subject in a head (one receipt listing them). */
    public RequestHandle deleteSubject(String headId, String subjectId) {
        return send(Request.deleteSubject(newEventId(), headId, clientId, subjectId, now()));
    }

    /**
     * Produce any request: sealed (adds, per {@link Seal}), validated and encoded, signed, keyed by
     * subject id, with a fresh W3C {@code traceparent} header. A delete's receipt is registered
     * before the request is produced.
     */
    public RequestHandle send(Request req) {
        return send(req, newTraceparent());
    }

    /**
     * As {@link #send(Request)}, with the caller's W3C {@code traceparent} (docs/operations.md,
     * "Traces": the stages carry it to the deltas, receipt and head update; an invalid one is ignored).
     */
    public RequestHandle send(Request req, String traceparent) {
        if (closed) {
            throw new ClientException("client is closed");
        }
        req = sealForTransit(req);
        byte[] value = req.encode();
        ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(requestsTopic,
                req.subjectId.getBytes(StandardCharsets.UTF_8), value);
        if (signer != null) {
            rec.headers().add(new RecordHeader(RequestSigner.SIG_KEY_HEADER,
                    signer.keyId().getBytes(StandardCharsets.UTF_8)));
            rec.headers().add(new RecordHeader(RequestSigner.SIG_HEADER,
                    signer.signatureHeader(value).getBytes(StandardCharsets.US_ASCII)));
        }
        if (traceparent != null) {
            rec.headers().add(new RecordHeader(TRACEPARENT_HEADER, traceparent.getBytes(StandardCharsets.US_ASCII)));
        }
        CompletableFuture<Receipt> receipt = null;
        ReceiptListener l = null;
        if (!"add".equals(req.op)) {
            l = listener();
            receipt = l.register(req.eventId);
        }
        CompletableFuture<RecordMetadata> delivered = new CompletableFuture<>();
        final String eventId = req.eventId;
        final ReceiptListener fl = l;
        try {
            producer.send(rec, (md, err) -> {
                if (err != null) {
                    delivered.completeExceptionally(err);
                    if (fl != null) {
                        fl.forget(eventId);
                    }
                } else {
                    delivered.complete(md);
                }
            });
        } catch (RuntimeException e) {
            if (l != null) {
                l.forget(eventId);
            }
            throw new ClientException("cannot produce event '" + eventId + "': " + e, e);
        }
        return new RequestHandle(req, delivered, receipt, prefix + "receipts");
    }

    /** The W3C trace context header a request carries. */
    public static final String TRACEPARENT_HEADER = "traceparent";

    /** A fresh sampled W3C trace context, {@code 00-<trace id>-<span id>-01}, with random non-zero ids. */
    public static String newTraceparent() {
        SecureRandom rnd = RANDOM;
        byte[] trace = new byte[16];
        byte[] span = new byte[8];
        do {
            rnd.nextBytes(trace);
        } while (allZero(trace));
        do {
            rnd.nextBytes(span);
        } while (allZero(span));
        return "00-" + HexFormat.of().formatHex(trace) + "-" + HexFormat.of().formatHex(span) + "-01";
    }

    private static final SecureRandom RANDOM = new SecureRandom();

    private static boolean allZero(byte[] b) {
        for (byte x : b) {
            if (x != 0) {
                return false;
            }
        }
        return true;
    }

    private Request sealForTransit(Request req) {
        if (transit == null || !"add".equals(req.op) || req.isSealed()) {
            return req;
        }
        long deadline = System.nanoTime() + transitWait.toNanos();
        while (true) {
            TransitSealer s = transit.sealerFor(req.headId);
            if (s == null) {
                // AUTO waits (bounded) for the featurizer's key, as the Python SDK does: an add is
                // never sent in plaintext just because the system has only just started.
                if (seal == Seal.ALWAYS || System.nanoTime() >= deadline) {
                    throw new ClientException("no transit key is published for head '" + req.headId + "' on "
                            + transit.topic() + (seal == Seal.ALWAYS ? "" : " within " + transitWait.toSeconds()
                            + " s") + " (is a featurizer running? seal=" + seal
                            + "; use Seal.OFF where no transit keys are published)");
                }
                try {
                    Thread.sleep(250);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new ClientException("interrupted waiting for a transit key of head '" + req.headId + "'", e);
                }
                continue;
            }
            try {
                return s.seal(req);
            } catch (IllegalStateException exhausted) {
                // another thread took the sealer's last slot: ask the cache again, which rolls a new one
            }
        }
    }

    private synchronized ReceiptListener listener() {
        if (listener == null) {
            Properties c = new Properties();
            c.putAll(consumerConfig);
            listener = new ReceiptListener(c, prefix + "receipts").start(listenTimeout);
        }
        return listener;
    }

    /** Start the receipt listener now (else the first delete starts it). */
    public UnlearnClient listenReceipts() {
        listener();
        return this;
    }

    /** Wait until every produced request is acknowledged (or failed). */
    public void flush() {
        producer.flush();
    }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        try {
            producer.close(Duration.ofSeconds(10));
        } finally {
            synchronized (this) {
                if (listener != null) {
                    listener.close();
                }
            }
            if (transit != null) {
                transit.close();
            }
        }
    }
}
