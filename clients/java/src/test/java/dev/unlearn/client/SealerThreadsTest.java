package dev.unlearn.client;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

class SealerThreadsTest {
    /** Threads sharing one sealer: exactly max_messages seals succeed, never one more. */
    @Test
    void aSharedSealerCountsExactly() throws Exception {
        Map<String, Object> tk = Vectors.map(Vectors.load("transit.json").get("transit_key"));
        Transit.PublicKeyRecord rec = Transit.PublicKeyRecord.decode(
                ((String) tk.get("record")).getBytes(StandardCharsets.UTF_8));
        TransitSealer sealer = new TransitSealer(rec, Keys.randomPrivate(new java.security.SecureRandom()),
                () -> new byte[12], 100);
        AtomicInteger ok = new AtomicInteger();
        AtomicInteger refused = new AtomicInteger();
        CountDownLatch go = new CountDownLatch(1);
        Thread[] ts = new Thread[8];
        for (int t = 0; t < ts.length; t++) {
            final int id = t;
            ts[t] = new Thread(() -> {
                try {
                    go.await();
                } catch (InterruptedException e) {
                    return;
                }
                for (int i = 0; i < 30; i++) {
                    try {
                        sealer.seal(Request.add("e" + id + "-" + i, "h", "c", "s", "x", 1, Input.features(new double[] {1}), 1.0));
                        ok.incrementAndGet();
                    } catch (IllegalStateException e) {
                        refused.incrementAndGet();
                    }
                }
            });
            ts[t].start();
        }
        go.countDown();
        for (Thread t : ts) {
            t.join();
        }
        assertEquals(100, ok.get());
        assertEquals(140, refused.get());
    }

    @Test
    void crc32cIsCastagnoli() {
        byte[] check = "123456789".getBytes(StandardCharsets.US_ASCII);
        assertEquals(0xE3069283, HeadCodec.crc32c(check, 0, check.length));
    }
}
