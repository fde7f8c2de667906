package dev.unlearn.client;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;

/**
 * Reads {@code <prefix>receipts} from "now" on in one daemon thread and completes the futures of
 * registered event ids (docs/client.md, "Why no receipt can be missed"): {@link #start} assigns
 * every partition at its current end and resolves those positions before it returns, and a
 * delete's event id is registered before its request is produced, so no receipt slips past.
 * No consumer group (explicit assignment, nothing committed). Receipts of other event ids are dropped.
 */
final class ReceiptListener implements AutoCloseable {
    private final String topic;
    private final Properties config;
    private final Map<String, CompletableFuture<Receipt>> waiters = new ConcurrentHashMap<>();
    private final AtomicLong bad = new AtomicLong();
    private volatile Throwable failure;
    private volatile boolean running;
    private KafkaConsumer<byte[], byte[]> consumer;
    private Thread thread;

    ReceiptListener(Properties consumerConfig, String topic) {
        this.config = consumerConfig;
        this.topic = topic;
    }

    synchronized ReceiptListener start(Duration timeout) {
        if (thread != null) {
            return this;
        }
        KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(config);
        CountDownLatch ready = new CountDownLatch(1);
        try {
            List<PartitionInfo> parts = c.partitionsFor(topic, timeout);
            if (parts == null || parts.isEmpty()) {
                throw new ClientException("topic " + topic + " does not exist (run `unlearn topics create` "
                        + "with the same prefix first)");
            }
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo p : parts) {
                tps.add(new TopicPartition(topic, p.partition()));
            }
            c.assign(tps);
            c.seekToEnd(tps);
            for (TopicPartition tp : tps) {
                c.position(tp, timeout); // resolve the end now: anything produced later is read
            }
        } catch (RuntimeException e) {
            c.close();
            throw e instanceof ClientException ? e : new ClientException("cannot read " + topic + ": " + e, e);
        }
        consumer = c;
        running = true;
        thread = new Thread(() -> loop(ready), "unlearn-receipts");
        thread.setDaemon(true);
        thread.start();
        return this;
    }

    private void loop(CountDownLatch ready) {
        ready.countDown();
        try {
            while (running) {
                for (ConsumerRecord<byte[], byte[]> rec : consumer.poll(Duration.ofMillis(200))) {
                    if (rec.value() == null) {
                        continue;
                    }
                    Receipt r;
                    try {
                        r = Receipt.decode(rec.value());
                    } catch (CodecException e) {
                        bad.incrementAndGet();
                        continue;
                    }
                    CompletableFuture<Receipt> w = waiters.get(r.eventId());
                    if (w != null) {
                        w.complete(r);
                    }
                }
            }
        } catch (WakeupException e) {
            // close()
        } catch (RuntimeException e) {
            failure = e;
            for (CompletableFuture<Receipt> w : waiters.values()) {
                w.completeExceptionally(new ClientException("receipt listener failed: " + e, e));
            }
        } finally {
            consumer.close(Duration.ofSeconds(2));
        }
    }

    /** Keep the receipt of {@code eventId} when it comes (call before producing the request). */
    CompletableFuture<Receipt> register(String eventId) {
        if (failure != null) {
            throw new ClientException("receipt listener failed: " + failure);
        }
        return waiters.computeIfAbsent(eventId, k -> new CompletableFuture<>());
    }

    void forget(String eventId) {
        waiters.remove(eventId);
    }

    long badReceipts() {
        return bad.get();
    }

    String topic() {
        return topic;
    }

    @Override
    public synchronized void close() {
        if (thread == null) {
            return;
        }
        running = false;
        consumer.wakeup();
        try {
            thread.join(TimeUnit.SECONDS.toMillis(5));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        thread = null;
    }
}
