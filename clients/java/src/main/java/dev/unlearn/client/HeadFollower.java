package dev.unlearn.client;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Predicate;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Follows the head-update topic family ({@code <prefix>heads.p<P>.g<G>}, every generation, found
 * by the pattern of docs/formats.md and re-listed as topics appear) and the head registry
 * ({@code <prefix>head-registry}) from their beginning, in one daemon thread; keeps the newest
 * update per head by {@link HeadUpdate#supersedes} in a {@link HeadStore}, and predicts as
 * serving does: inputs quantized with the contract version the update names
 * ({@link ContractBook}), scores ranked over the retained classes, variance from the update's
 * posterior or the last exact one's. Undecodable records are counted and skipped, never fatal.
 */
public final class HeadFollower implements AutoCloseable {
    private final Properties config;
    private final Pattern heads;
    private final String registry;
    private final HeadStore store = new HeadStore();
    private final ContractBook contracts = new ContractBook();
    private final AtomicLong badUpdates = new AtomicLong();
    private final AtomicLong badContracts = new AtomicLong();
    private final Duration relist;
    private volatile HeadContract fallback = HeadContract.SETTINGS_DEFAULT;
    private volatile double sigma2 = 1.0;
    private volatile boolean running;
    private volatile Throwable failure;
    private KafkaConsumer<byte[], byte[]> consumer;
    private Thread thread;

    /** A follower of {@code prefix}'s heads on {@code bootstrap} (not started). */
    public HeadFollower(String bootstrap, String prefix) {
        this(props(bootstrap), prefix, Duration.ofSeconds(1));
    }

    /** With explicit Kafka consumer properties (bootstrap, security, ...). */
    public HeadFollower(Properties kafka, String prefix, Duration relist) {
        Properties c = new Properties();
        c.putAll(kafka);
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.putIfAbsent(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, 64 << 20);
        c.putIfAbsent(ConsumerConfig.FETCH_MAX_BYTES_CONFIG, 64 << 20);
        this.config = c;
        this.heads = Pattern.compile("^" + Pattern.quote(prefix) + "heads\\.p[0-9]+\\.g[0-9]+$");
        this.registry = prefix + "head-registry";
        this.relist = relist;
    }

    private static Properties props(String bootstrap) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        return p;
    }

    /** The contract for heads the registry has none for (serving's settings; default 30 bits, bound 1, l2). */
    public HeadFollower fallbackContract(HeadContract c) { this.fallback = c; return this; }
    /** sigma^2 of the variance (serving's {@code UNLEARN_SERVE_SIGMA2}, default 1). */
    public HeadFollower sigma2(double s) { this.sigma2 = s; return this; }

    /** Start the following thread. */
    public synchronized HeadFollower start() {
        if (thread != null) {
            return this;
        }
        consumer = new KafkaConsumer<>(config);
        running = true;
        thread = new Thread(this::loop, "unlearn-heads");
        thread.setDaemon(true);
        thread.start();
        return this;
    }

    private void loop() {
        Set<TopicPartition> assigned = new HashSet<>();
        long nextList = 0;
        try {
            while (running) {
                if (System.currentTimeMillis() >= nextList) {
                    nextList = System.currentTimeMillis() + relist.toMillis();
                    List<TopicPartition> now = new ArrayList<>();
                    for (Map.Entry<String, List<PartitionInfo>> t : consumer.listTopics(Duration.ofSeconds(10)).entrySet()) {
                        if (heads.matcher(t.getKey()).matches() || registry.equals(t.getKey())) {
                            for (PartitionInfo p : t.getValue()) {
                                now.add(new TopicPartition(t.getKey(), p.partition()));
                            }
                        }
                    }
                    if (!assigned.containsAll(now)) {
                        List<TopicPartition> fresh = new ArrayList<>(now);
                        fresh.removeAll(assigned);
                        assigned.addAll(now);
                        consumer.assign(assigned);
                        consumer.seekToBeginning(fresh);
                    }
                }
                if (assigned.isEmpty()) {
                    Thread.sleep(100);
                    continue;
                }
                for (ConsumerRecord<byte[], byte[]> rec : consumer.poll(Duration.ofMillis(100))) {
                    if (rec.value() == null) {
                        continue;
                    }
                    if (registry.equals(rec.topic())) {
                        try {
                            contracts.put(HeadContract.decode(rec.value()));
                        } catch (IllegalArgumentException e) {
                            badContracts.incrementAndGet();
                        }
                        continue;
                    }
                    try {
                        offer(HeadCodec.decode(rec.value()));
                    } catch (CodecException e) {
                        badUpdates.incrementAndGet();
                    }
                }
            }
        } catch (WakeupException e) {
            // close()
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (RuntimeException e) {
            failure = e;
        } finally {
            consumer.close(Duration.ofSeconds(2));
        }
    }

    private void offer(HeadUpdate u) {
        synchronized (store) {
            store.offer(u);
            store.notifyAll();
        }
    }

    /** The current served state of {@code headId} (one reference: use it for a whole request), or null. */
    public ServedHead get(String headId) {
        return store.get(headId);
    }

    /** The contract a served head predicts with (registry, else the fallback). */
    public HeadContract contractFor(HeadUpdate u) {
        HeadContract c = contracts.contractFor(u);
        return c != null ? c : fallback;
    }

    /**
     * Block until the served update of {@code headId} satisfies {@code predicate}; returns that
     * served state, or throws {@link ClientException} after {@code timeout} (or if the thread died).
     */
    public ServedHead waitFor(String headId, Predicate<HeadUpdate> predicate, Duration timeout) {
        long deadline = System.currentTimeMillis() + timeout.toMillis();
        synchronized (store) {
            while (true) {
                ServedHead h = store.get(headId);
                if (h != null && predicate.test(h.update())) {
                    return h;
                }
                if (failure != null) {
                    throw new ClientException("head follower failed: " + failure, failure);
                }
                long left = deadline - System.currentTimeMillis();
                if (left <= 0) {
                    throw new ClientException("head '" + headId + "' did not reach the wanted state within " + timeout
                            + " (served: " + (h == null ? "none" : h.update()) + ")");
                }
                try {
                    store.wait(Math.min(left, 200));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new ClientException("interrupted", e);
                }
            }
        }
    }

    /** Predict one feature vector with the current version of {@code headId} (top 1). */
    public Prediction predict(String headId, double[] features) {
        return predict(headId, features, 1);
    }

    /** Predict with the {@code topK} best retained classes; {@link PredictException} for a refused input. */
    public Prediction predict(String headId, double[] features, int topK) {
        ServedHead h = store.get(headId);
        if (h == null) {
            throw new PredictException("unknown_head", "no head '" + headId + "' has been published (yet)");
        }
        return h.predict(features, contractFor(h.update()), sigma2, topK);
    }

    /** Head updates that did not decode (skipped). */
    public long badUpdates() { return badUpdates.get(); }

    /** Registry records that did not parse as contracts (skipped). */
    public long badContracts() { return badContracts.get(); }

    @Override
    public synchronized void close() {
        if (thread == null) {
            return;
        }
        running = false;
        consumer.wakeup();
        try {
            thread.join(5000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        thread = null;
    }
}
