package dev.unlearn.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.Properties;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class KafkaSecurityTest {
    @TempDir Path dir;

    private Path file(String body) throws Exception {
        Path p = dir.resolve("client.properties");
        Files.writeString(p, body);
        return p;
    }

    /** The compose deployment's file (librdkafka names) becomes the Java client's settings. */
    @Test
    void saslSslFileBecomesJavaSettings() throws Exception {
        Path f = file("security.protocol=SASL_SSL\nssl.ca.location=/etc/unlearn/ca/ca.pem\n"
                + "sasl.mechanism=SCRAM-SHA-512\nsasl.username=client\nsasl.password=pa\"ss\\\\word\n");
        Properties p = KafkaSecurity.read(f);
        assertEquals("SASL_SSL", p.get("security.protocol"));
        assertEquals("https", p.get("ssl.endpoint.identification.algorithm"));
        assertEquals("PEM", p.get("ssl.truststore.type"));
        assertEquals("/etc/unlearn/ca/ca.pem", p.get("ssl.truststore.location"));
        assertEquals("SCRAM-SHA-512", p.get("sasl.mechanism"));
        assertEquals("org.apache.kafka.common.security.scram.ScramLoginModule required username=\"client\" "
                + "password=\"pa\\\"ss\\\\word\";", p.get("sasl.jaas.config"));
        assertEquals(Properties.class, KafkaSecurity.fromEnv(Map.of()).getClass());
        assertTrue(KafkaSecurity.fromEnv(Map.of()).isEmpty());
        assertEquals(p, KafkaSecurity.fromEnv(Map.of("UNLEARN_KAFKA_PROPERTIES", f.toString())));
    }

    @Test
    void refusesWhatThePythonClientsRefuse() throws Exception {
        Path off = file("security.protocol=SSL\nssl.endpoint.identification.algorithm=\n");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> KafkaSecurity.read(off));
        assertTrue(e.getMessage().contains("ssl.endpoint.identification.algorithm cannot be set"), e.getMessage());
        Path java = file("security.protocol=SSL\nssl.truststore.location=/x.jks\n");
        e = assertThrows(IllegalArgumentException.class, () -> KafkaSecurity.read(java));
        assertTrue(e.getMessage().contains("ssl.truststore.location is not a security key"), e.getMessage());
        Path noPassword = file("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=u\n");
        e = assertThrows(IllegalArgumentException.class, () -> KafkaSecurity.read(noPassword));
        assertTrue(e.getMessage().endsWith("needs sasl.password"), e.getMessage());
    }
}
