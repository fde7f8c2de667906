/*
 * Kafka 4.x moved Sanitizer to org.apache.kafka.common.utils.internals; Debezium 3.6.1.Final's
 * metrics (io.debezium.metrics.Metrics) still call the old class, and its task dies with
 * NoClassDefFoundError at start. This forwarder restores the old name on Connect's classpath
 * (built by infra/connect/install-jars.sh; docs/cdc.md, "Versions"). Nothing else is missing:
 * every other org.apache.kafka class Debezium names is in kafka-clients 4.4.0.
 */
package org.apache.kafka.common.utils;

public final class Sanitizer {
    private Sanitizer() {
    }

    public static String sanitize(String name) {
        return org.apache.kafka.common.utils.internals.Sanitizer.sanitize(name);
    }

    public static String desanitize(String name) {
        return org.apache.kafka.common.utils.internals.Sanitizer.desanitize(name);
    }

    public static String jmxSanitize(String name) {
        return org.apache.kafka.common.utils.internals.Sanitizer.jmxSanitize(name);
    }
}
