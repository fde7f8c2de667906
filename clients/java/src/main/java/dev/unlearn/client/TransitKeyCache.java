package dev.unlearn.client;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;

/**
 * The published transit keys, per by-head partition, as a producer needs them (docs/formats.md,
 * "Sealed inputs", step 1; the Python SDK's {@code TransitKeyCache}): the head's partition P by
 * {@link Transit#headPartition} over the partition count of {@code <prefix>requests.by-head}, the
 * newest record with {@code partition == P} among the last records of {@code <prefix>transit-keys}
 * partition P mod M, used while its {@code use_until} is more than 1 s ahead. One
 * {@link TransitSealer} (one ephemeral key) per partition and transit key. Thread-safe.
 */
final class TransitKeyCache implements AutoCloseable {
    private static final int TAIL = 32;
    private static final double MARGIN_S = 1.0;
    private static final double RETRY_S = 1.0;

    private final Properties config;
    private final String keysTopic;
    private final String byHeadTopic;
    private final String requestsTopic;
    private final Map<Integer, Transit.PublicKeyRecord> keys = new HashMap<>();
    private final Map<Integer, TransitSealer> sealers = new HashMap<>();
    private final Map<Integer, Double> tried = new HashMap<>();
    private int[] counts; // by-head partitions, transit-keys partitions
    private KafkaConsumer<byte[], byte[]> consumer;

    TransitKeyCache(Properties consumerConfig, String prefix) {
        this.config = consumerConfig;
        this.keysTopic = prefix + "transit-keys";
        this.requestsTopic = prefix + "requests";
        this.byHeadTopic = requestsTopic + ".by-head";
    }

    String topic() {
        return keysTopic;
    }

    private static double now() {
        return System.currentTimeMillis() / 1000.0;
    }

    /** The sealer for an add of {@code headId} now, or null when no key is published. */
    synchronized TransitSealer sealerFor(String headId) {
        double now = now();
        sealers.values().removeIf(s -> s.key().useUntil <= now);
        int[] c = counts();
        if (c == null) {
            return null;
        }
        int p = Transit.headPartition(headId, c[0]);
        Transit.PublicKeyRecord key = keys.get(p);
        if (key == null || key.useUntil - MARGIN_S <= now) {
            if (now - tried.getOrDefault(p, 0.0) < RETRY_S) {
                return null;
            }
            tried.put(p, now);
            key = read(p, c[1]);
        }
        if (key == null || key.useUntil - MARGIN_S <= now) {
            return null;
        }
        TransitSealer s = sealers.get(p);
        if (s == null || !s.key().keyId.equals(key.keyId) || s.exhausted()) {
            s = new TransitSealer(key);
            sealers.put(p, s);
        }
        return s;
    }

    private int[] counts() {
        if (counts == null) {
            KafkaConsumer<byte[], byte[]> c = consumer();
            Map<String, List<PartitionInfo>> topics = c.listTopics(Duration.ofSeconds(10));
            List<PartitionInfo> byHead = topics.getOrDefault(byHeadTopic, topics.get(requestsTopic));
            List<PartitionInfo> k = topics.get(keysTopic);
            if (byHead == null || byHead.isEmpty() || k == null || k.isEmpty()) {
                return null;
            }
            counts = new int[] {byHead.size(), k.size()};
        }
        return counts;
    }

    private Transit.PublicKeyRecord read(int partition, int nKeys) {
        KafkaConsumer<byte[], byte[]> c = consumer();
        TopicPartition tp = new TopicPartition(keysTopic, partition % nKeys);
        Transit.PublicKeyRecord best = null;
        try {
            long begin = c.beginningOffsets(List.of(tp), Duration.ofSeconds(10)).get(tp);
            long end = c.endOffsets(List.of(tp), Duration.ofSeconds(10)).get(tp);
            c.assign(List.of(tp));
            c.seek(tp, Math.max(begin, end - TAIL));
            long deadline = System.currentTimeMillis() + 5000;
            while (c.position(tp) < end && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> rec : c.poll(Duration.ofMillis(100))) {
                    if (rec.value() == null) {
                        continue;
                    }
                    try {
                        Transit.PublicKeyRecord k = Transit.PublicKeyRecord.decode(rec.value());
                        if (k.partition == partition && (best == null || k.useUntil > best.useUntil)) {
                            best = k;
                        }
                    } catch (TransitException e) {
                        // not a key record: skipped, as the reference does
                    }
                }
            }
        } catch (RuntimeException e) {
            return null; // a broker hiccup: plaintext (auto) or refusal (always), never a crash
        }
        if (best != null) {
            keys.put(partition, best);
        }
        return best;
    }

    private KafkaConsumer<byte[], byte[]> consumer() {
        if (consumer == null) {
            consumer = new KafkaConsumer<>(config);
        }
        return consumer;
    }

    @Override
    public synchronized void close() {
        sealers.clear();
        if (consumer != null) {
            consumer.close(Duration.ofSeconds(2));
            consumer = null;
        }
    }
}
