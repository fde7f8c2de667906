package dev.unlearn.client;

import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;

/**
 * For tests/infra/test_kafka_tls.py: connects to {@code args[0]} with the security of
 * {@code UNLEARN_KAFKA_PROPERTIES} ({@link KafkaSecurity}) and lists the cluster's nodes. Prints
 * {@code ok nodes=N}, or {@code refused: <cause chain>} and exits 1.
 */
public final class TlsProbeMain {
    private TlsProbeMain() {}

    public static void main(String[] args) {
        Properties p = KafkaSecurity.fromEnv(System.getenv());
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, 15000);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, 10000);
        try (Admin admin = Admin.create(p)) {
            int n = admin.describeCluster().nodes().get(20, TimeUnit.SECONDS).size();
            System.out.println("ok nodes=" + n);
        } catch (Exception e) {
            StringBuilder chain = new StringBuilder();
            for (Throwable t = e; t != null; t = t.getCause()) {
                chain.append(" <- ").append(t.getClass().getSimpleName()).append(": ").append(t.getMessage());
            }
            System.out.println("refused:" + chain);
            System.exit(1);
        }
    }
}
