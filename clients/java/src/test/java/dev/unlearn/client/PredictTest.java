package dev.unlearn.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/** HeadStore + predict against serving's own outputs (predict.json): 1e-12 agreement. */
class PredictTest {
    static final double TOL = 1e-12;

    static void close(double want, double got, String what) {
        assertTrue(Math.abs(want - got) <= TOL * Math.max(1.0, Math.abs(want)),
                () -> what + ": python " + want + ", java " + got);
    }

    @TestFactory
    Stream<DynamicTest> servingScenarios() {
        return Vectors.list(Vectors.load("predict.json"), "scenarios").stream().map(sc -> DynamicTest.dynamicTest(
                (String) sc.get("name"), () -> {
                    HeadStore store = new HeadStore();
                    String headId = null;
                    for (Map<String, Object> offer : Vectors.list(sc, "offers")) {
                        HeadUpdate u = HeadCodec.decode(Vectors.b64(offer.get("message")));
                        headId = u.headId();
                        assertEquals(offer.get("result"), store.offer(u) ? "accepted" : "stale");
                    }
                    ServedHead served = store.get(headId);
                    Map<String, Object> want = Vectors.map(sc.get("served"));
                    assertEquals(Vectors.u64(want.get("version")), served.update().version());
                    assertEquals(want.get("mode"), served.update().mode().name().toLowerCase());
                    assertEquals(want.get("posterior_version"), served.posteriorVersion());
                    assertEquals(want.get("posterior_source"), served.posteriorSource());
                    ContractBook book = new ContractBook();
                    for (Map<String, Object> c : Vectors.list(sc, "contracts")) {
                        book.put(HeadContract.fromMap(c));
                    }
                    HeadContract con = book.contractFor(served.update());
                    assertEquals(want.get("contract_version"), con == null ? null : con.version());
                    if (con == null) {
                        con = HeadContract.SETTINGS_DEFAULT;
                    }
                    double sigma2 = Vectors.num(sc.get("sigma2"));
                    int topK = (int) (long) (Long) sc.get("top_k");
                    for (Map<String, Object> p : Vectors.list(sc, "predictions")) {
                        double[] f = Vectors.doubles(p.get("features"));
                        if (p.containsKey("error")) {
                            final HeadContract fc = con;
                            PredictException ex = assertThrows(PredictException.class,
                                    () -> served.predict(f, fc, sigma2, topK));
                            assertEquals(p.get("error"), ex.reason());
                            continue;
                        }
                        Prediction got = served.predict(f, con, sigma2, topK);
                        long[] q = con.quantize(f);
                        List<?> wantQ = (List<?>) p.get("q");
                        for (int i = 0; i < q.length; i++) {
                            assertEquals((long) (Long) wantQ.get(i), q[i], "q[" + i + "]");
                        }
                        assertArrayEquals(Vectors.bits(Vectors.f64le((String) p.get("x_f64le"))),
                                Vectors.bits(got.featureRow()), "dequantized row bit for bit");
                        List<?> scores = (List<?>) p.get("scores");
                        for (int j = 0; j < scores.size(); j++) {
                            if (scores.get(j) == null) {
                                assertTrue(Double.isNaN(got.scores()[j]), "score " + j + " is absent");
                            } else {
                                close(Vectors.num(scores.get(j)), got.scores()[j], "score " + j);
                            }
                        }
                        Object pc = p.get("predicted_class");
                        assertEquals(pc == null ? -1L : (long) (Long) pc, got.predictedClass());
                        List<?> top = (List<?>) p.get("top_classes");
                        assertEquals(top.size(), got.topClasses().length);
                        for (int i = 0; i < top.size(); i++) {
                            assertEquals((long) (Long) top.get(i), got.topClasses()[i]);
                        }
                        if (p.get("variance") == null) {
                            assertFalse(got.hasVariance());
                        } else {
                            assertNotNull(got.posteriorVersion());
                            close(Vectors.num(p.get("variance")), got.variance(), "variance");
                        }
                    }
                }));
    }
}
