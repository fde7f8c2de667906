package dev.unlearn.client;

import java.nio.file.Path;
import java.time.Duration;

/** The README's Java example, compiled with the tests so it cannot fall behind the API (not run). */
final class ReadmeExample {
    private ReadmeExample() {}

    static void example(double[] vec) throws Exception {
        var signer = RequestSigner.fromFile(Path.of("app.pem"), null);          // signed mode (optional)
        try (var client = UnlearnClient.builder("127.0.0.1:9092").clientId("app").signer(signer).build();
             var heads = new HeadFollower("127.0.0.1:9092", "unlearn.").start()) {
            client.add("faces", "alice", "s1", 3, Input.featuresF32(vec));     // sealed for transit by default
            Receipt r = client.delete("faces", "s1", "alice").waitReceipt(Duration.ofSeconds(30));
            heads.waitFor("faces", u -> Long.compareUnsigned(u.version(), r.headVersion()) >= 0, Duration.ofSeconds(30));
            Prediction p = heads.predict("faces", vec);                          // as serving: scores, class, variance
            System.out.println(r.status() + " " + p.predictedClass() + " " + p.variance());
        }
    }
}
