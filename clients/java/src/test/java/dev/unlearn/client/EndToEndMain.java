package dev.unlearn.client;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

/**
 * The Java side of tests/clients/test_java.py: against a running featurizer and ledger it
 * adds samples (signed, sealed for transit, in the three feature encodings), deletes one sample
 * and one subject, waits for their receipts and for an exact head that excludes them, and predicts
 * with its HeadFollower. Prints one JSON object per line; the Python test checks every line
 * against the Python reference (same head version, serving's predict). Args: bootstrap prefix
 * head_id signing_seed_hex client_id.
 */
public final class EndToEndMain {
    private EndToEndMain() {}

    static void emit(String kind, Map<String, Object> body) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("kind", kind);
        m.putAll(body);
        System.out.println(new String(Json.toBytes(m), java.nio.charset.StandardCharsets.UTF_8));
        System.out.flush();
    }

    static Map<String, Object> receipt(Receipt r) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("event_id", r.eventId());
        m.put("status", r.status());
        m.put("sample_ids", new ArrayList<Object>(r.sampleIds()));
        m.put("head_version", r.headVersion() == null ? null : Long.toUnsignedString(r.headVersion()));
        m.put("reason", r.reason());
        return m;
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String prefix = args[1];
        String head = args[2];
        RequestSigner signer = RequestSigner.fromSeed(Hex.decode(args[3]), null);
        String clientId = args[4];
        int d = 6;
        int n = 24;
        Random rnd = new Random(7);
        double[][] x = new double[n][d];
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < d; j++) {
                x[i][j] = rnd.nextGaussian() + (j == i % 3 ? 2.0 : 0.0);
            }
        }
        // AUTO where no featurizer ever published a transit key (a prefix nobody serves): the add
        // waits the bounded transitWait, then is refused; it is never sent in plaintext.
        try (UnlearnClient lonely = UnlearnClient.builder(bootstrap).topicPrefix(prefix + "nokeys.")
                .clientId(clientId).signer(signer).transitWait(Duration.ofSeconds(1)).build()) {
            long t0 = System.nanoTime();
            boolean refused = false;
            try {
                lonely.add(head, "u0", "s-lonely", 0, Input.features(x[0]));
            } catch (ClientException expected) {
                refused = expected.getMessage().contains("within 1 s");
            }
            emit("auto_without_key", Map.of("refused", refused, "waited_ms", (System.nanoTime() - t0) / 1_000_000));
        }
        try (UnlearnClient client = UnlearnClient.builder(bootstrap).topicPrefix(prefix).clientId(clientId)
                .signer(signer).seal(UnlearnClient.Seal.ALWAYS).build();
             HeadFollower follower = new HeadFollower(bootstrap, prefix).start()) {
            client.listenReceipts();
            List<RequestHandle> adds = new ArrayList<>();
            long deadline = System.currentTimeMillis() + 90_000;
            for (int i = 0; i < n; i++) {
                Input in = i % 3 == 0 ? Input.features(x[i]) : i % 3 == 1 ? Input.featuresF64(x[i]) : Input.featuresF32(x[i]);
                while (true) {
                    try {
                        adds.add(client.add(head, "u" + (i % 4), "s-" + i, i % 3, in));
                        break;
                    } catch (ClientException noKeyYet) {
                        if (System.currentTimeMillis() > deadline) {
                            throw noKeyYet;
                        }
                        Thread.sleep(250); // the featurizer publishes its transit key once it owns the partition
                    }
                }
            }
            int sealed = 0;
            for (RequestHandle h : adds) {
                h.waitDelivered(Duration.ofSeconds(30));
                sealed += h.sealed() ? 1 : 0;
            }
            emit("adds", Map.of("n", (long) n, "sealed", (long) sealed));
            Duration wait = Duration.ofSeconds(120);
            Receipt one = client.delete(head, "s-3", "u3").waitReceipt(wait);
            emit("receipt", receipt(one));
            Receipt subject = client.deleteSubject(head, "u1").waitReceipt(wait);
            emit("receipt", receipt(subject));
            Receipt none = client.delete(head, "never-added", "u0").waitReceipt(wait);
            emit("receipt", receipt(none));
            long v = Math.max(one.headVersion(), subject.headVersion());
            ServedHead h = follower.waitFor(head, u -> Long.compareUnsigned(u.version(), v) >= 0
                    && u.mode() == HeadUpdate.Mode.EXACT && u.hasPosterior(), wait);
            HeadUpdate u = h.update();
            Map<String, Object> hm = new LinkedHashMap<>();
            hm.put("version", Long.toUnsignedString(u.version()));
            hm.put("mode", u.mode().name().toLowerCase());
            hm.put("n_retained", Long.toUnsignedString(u.nRetained()));
            hm.put("digest", u.digest());
            hm.put("contract_version", u.contractVersion());
            emit("head", hm);
            HeadContract contract = follower.contractFor(u);
            for (int i = 0; i < 5; i++) {
                double[] f = new double[d];
                for (int j = 0; j < d; j++) {
                    f[j] = rnd.nextGaussian();
                }
                Prediction p = h.predict(f, contract, 1.0, 2);
                Map<String, Object> pm = new LinkedHashMap<>();
                pm.put("features", f);
                pm.put("version", Long.toUnsignedString(p.version()));
                List<Object> scores = new ArrayList<>();
                for (double s : p.scores()) {
                    scores.add(Double.isNaN(s) ? null : (Object) s);
                }
                pm.put("scores", scores);
                pm.put("predicted_class", p.predictedClass() < 0 ? null : (Object) (long) p.predictedClass());
                List<Object> top = new ArrayList<>();
                for (int t : p.topClasses()) {
                    top.add((long) t);
                }
                pm.put("top_classes", top);
                pm.put("variance", p.hasVariance() ? (Object) p.variance() : null);
                emit("predict", pm);
            }
            emit("done", Map.of("bad_updates", follower.badUpdates()));
        }
    }
}
