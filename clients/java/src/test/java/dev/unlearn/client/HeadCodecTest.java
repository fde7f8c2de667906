package dev.unlearn.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/** The ULHD decoder against the Python reference's vectors (heads.json, heads_malformed.json). */
class HeadCodecTest {

    @TestFactory
    Stream<DynamicTest> decodesEveryValidVectorFieldForField() {
        return Vectors.list(Vectors.load("heads.json"), "cases").stream().map(cs -> DynamicTest.dynamicTest(
                (String) cs.get("name"), () -> {
                    HeadUpdate h = HeadCodec.decode(Vectors.b64(cs.get("message")));
                    Map<String, Object> e = Vectors.map(cs.get("expect"));
                    assertEquals(e.get("head_id"), h.headId());
                    assertEquals(Vectors.u64(e.get("version")), h.version());
                    assertEquals(e.get("mode"), h.mode().name().toLowerCase());
                    assertEquals(e.get("digest"), h.digest());
                    assertEquals(Vectors.u64(e.get("n_retained")), h.nRetained());
                    assertEquals(Vectors.u64(e.get("events_covered")), h.eventsCovered());
                    List<?> offs = (List<?>) e.get("offsets");
                    assertEquals(offs.size(), h.partitions().length);
                    for (int i = 0; i < offs.size(); i++) {
                        List<?> po = (List<?>) offs.get(i);
                        assertEquals((long) (Long) po.get(0), h.partitions()[i]);
                        assertEquals((long) (Long) po.get(1), h.offsets()[i]);
                    }
                    assertEquals(Double.doubleToRawLongBits(Vectors.leBits((String) e.get("drift_bits"))),
                            Double.doubleToRawLongBits(h.drift()));
                    assertEquals(Double.doubleToRawLongBits(Vectors.leBits((String) e.get("gamma_bits"))),
                            Double.doubleToRawLongBits(h.gamma()));
                    assertEquals(Double.doubleToRawLongBits(Vectors.leBits((String) e.get("created_ts_bits"))),
                            Double.doubleToRawLongBits(h.createdTs()));
                    assertEquals((long) (Long) e.get("d"), h.d());
                    assertEquals((long) (Long) e.get("c"), h.c());
                    assertArrayEquals(Vectors.bits(Vectors.f64le((String) e.get("weights_f64le"))),
                            Vectors.bits(h.weights()), "weights bit for bit");
                    assertEquals(e.get("has_posterior"), h.hasPosterior());
                    if (h.hasPosterior()) {
                        assertArrayEquals(Vectors.bits(Vectors.f64le((String) e.get("posterior_f64le"))),
                                Vectors.bits(h.posterior()), "posterior bit for bit");
                    } else {
                        assertNull(e.get("posterior_f64le"));
                    }
                    assertEquals(e.get("retained_hash"), h.retainedHash());
                    assertEquals(e.get("contract_version"), h.contractVersion());
                    Object classes = e.get("retained_classes");
                    boolean[] mask = h.retainedClasses();
                    if (classes == null) {
                        assertNull(mask);
                    } else {
                        List<Long> want = new ArrayList<>();
                        for (Object o : (List<?>) classes) {
                            want.add((Long) o);
                        }
                        List<Long> got = new ArrayList<>();
                        for (int j = 0; j < mask.length; j++) {
                            if (mask[j]) {
                                got.add((long) j);
                            }
                        }
                        assertEquals(want, got);
                        assertEquals(h.c(), mask.length);
                    }
                }));
    }

    @TestFactory
    Stream<DynamicTest> refusesEveryMalformedVectorWithTheSameCheck() {
        return Vectors.list(Vectors.load("heads_malformed.json"), "cases").stream().map(cs -> DynamicTest.dynamicTest(
                (String) cs.get("name"), () -> {
                    CodecException ex = assertThrows(CodecException.class,
                            () -> HeadCodec.decode(Vectors.b64(cs.get("message"))));
                    String kind = ((String) cs.get("kind")).toLowerCase();
                    assertTrue(ex.getMessage().toLowerCase().contains(kind),
                            () -> "expected '" + kind + "' in: " + ex.getMessage() + " (python: "
                                    + cs.get("python_error") + ")");
                }));
    }

    /** Fuzz: any truncation, bit flip or byte change of valid messages is a CodecException or a
     * clean decode (a change the CRC cannot see does not exist here: CRC32C sees every 1-bit flip),
     * never another exception. */
    @Test
    void mutatedMessagesNeverCrashTheDecoder() {
        Random rnd = new Random(22);
        for (Map<String, Object> cs : Vectors.list(Vectors.load("heads.json"), "cases")) {
            byte[] ok = Vectors.b64(cs.get("message"));
            for (int t = 0; t < 300; t++) {
                byte[] m;
                switch (t % 3) {
                    case 0:
                        m = java.util.Arrays.copyOf(ok, rnd.nextInt(ok.length));
                        break;
                    case 1:
                        m = ok.clone();
                        m[rnd.nextInt(m.length)] ^= (byte) (1 << rnd.nextInt(8));
                        break;
                    default:
                        m = ok.clone();
                        m[16 + rnd.nextInt(m.length - 20)] = (byte) rnd.nextInt(256);
                        int crc = HeadCodec.crc32c(m, 0, m.length - 4);
                        java.nio.ByteBuffer.wrap(m).order(java.nio.ByteOrder.LITTLE_ENDIAN).putInt(m.length - 4, crc);
                }
                final byte[] msg = m;
                try {
                    HeadCodec.decode(msg);
                } catch (CodecException expected) {
                    // refused: fine
                }
                if (t % 3 != 2) {
                    assertThrows(CodecException.class, () -> HeadCodec.decode(msg));
                }
            }
        }
    }

    @Test
    void supersedesIsVersionThenExactOverFast() {
        Map<String, Object> cs = Vectors.list(Vectors.load("heads.json"), "cases").get(0);
        HeadUpdate exact = HeadCodec.decode(Vectors.b64(cs.get("message")));
        assertTrue(exact.supersedes(null));
        assertFalse(exact.supersedes(exact));
        HeadUpdate extremes = null;
        for (Map<String, Object> c : Vectors.list(Vectors.load("heads.json"), "cases")) {
            if ("extremes".equals(c.get("name"))) {
                extremes = HeadCodec.decode(Vectors.b64(c.get("message")));
            }
        }
        assertTrue(extremes.supersedes(exact), "version 2^64-1 is the largest (unsigned)");
        assertFalse(exact.supersedes(extremes));
    }
}
