package dev.unlearn.client;

import java.io.IOException;
import java.io.Reader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;

/**
 * The Java client's Kafka security from the same properties file every Python client reads
 * ({@code UNLEARN_KAFKA_PROPERTIES}; docs/configuration.md): librdkafka's key names, turned into
 * the Java client's. One file per principal serves both languages: {@code sasl.username} and
 * {@code sasl.password} become {@code sasl.jaas.config}; {@code ssl.ca.location} a PEM
 * truststore; {@code ssl.certificate.location} and {@code ssl.key.location} a PEM keystore. With
 * TLS the broker's host name is always verified ({@code ssl.endpoint.identification.algorithm=https});
 * a file that tries to turn that off, or holds a key the Python clients would refuse, fails here,
 * naming the file and the key.
 */
public final class KafkaSecurity {
    private static final Set<String> KEYS = Set.of("security.protocol", "sasl.mechanism", "sasl.username",
            "sasl.password", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password");
    private static final Set<String> REFUSED = Set.of("ssl.endpoint.identification.algorithm",
            "enable.ssl.certificate.verification");
    private static final List<String> PROTOCOLS = List.of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL");

    private KafkaSecurity() {}

    /** The Java client properties of the file at {@code path} (empty for an empty file). */
    public static Properties read(Path path) {
        Properties file = new Properties();
        try (Reader r = Files.newBufferedReader(path, StandardCharsets.UTF_8)) {
            file.load(r);
        } catch (IOException e) {
            throw new IllegalArgumentException(path + ": cannot read it (" + e.getMessage() + ")", e);
        }
        for (String key : file.stringPropertyNames()) {
            if (REFUSED.contains(key)) {
                throw new IllegalArgumentException(path + ": " + key + " cannot be set: the broker's certificate and "
                        + "host name are always verified");
            }
            if (!KEYS.contains(key)) {
                throw new IllegalArgumentException(path + ": " + key + " is not a security key this project reads "
                        + "(librdkafka names: " + String.join(", ", KEYS.stream().sorted().toList()) + ")");
            }
        }
        return translate(file, path);
    }

    private static Properties translate(Properties f, Path path) {
        String protocol = f.getProperty("security.protocol", "PLAINTEXT");
        if (!PROTOCOLS.contains(protocol)) {
            throw new IllegalArgumentException(path + ": security.protocol must be one of " + PROTOCOLS);
        }
        Properties out = new Properties();
        out.put("security.protocol", protocol);
        if (protocol.startsWith("SASL_")) {
            String mechanism = need(f, "sasl.mechanism", path);
            String module = mechanism.equals("PLAIN") ? "org.apache.kafka.common.security.plain.PlainLoginModule"
                    : "org.apache.kafka.common.security.scram.ScramLoginModule";
            out.put("sasl.mechanism", mechanism);
            out.put("sasl.jaas.config", module + " required username=\"" + quote(need(f, "sasl.username", path))
                    + "\" password=\"" + quote(need(f, "sasl.password", path)) + "\";");
        }
        if (protocol.endsWith("SSL")) {
            out.put("ssl.endpoint.identification.algorithm", "https");
            String ca = f.getProperty("ssl.ca.location");
            if (ca != null) {
                out.put("ssl.truststore.type", "PEM");
                out.put("ssl.truststore.location", ca);
            }
            String cert = f.getProperty("ssl.certificate.location");
            String key = f.getProperty("ssl.key.location");
            if ((cert == null) != (key == null)) {
                throw new IllegalArgumentException(path + ": mTLS needs both ssl.certificate.location and "
                        + "ssl.key.location");
            }
            if (cert != null) {  // inline PEM: Java reads a PEM keystore file only with an encrypted key
                out.put("ssl.keystore.type", "PEM");
                out.put("ssl.keystore.certificate.chain", contents(cert, path));
                out.put("ssl.keystore.key", contents(key, path));
                if (f.getProperty("ssl.key.password") != null) {
                    out.put("ssl.key.password", f.getProperty("ssl.key.password"));
                }
            }
        }
        return out;
    }

    private static String need(Properties f, String key, Path path) {
        String v = f.getProperty(key);
        if (v == null || v.isEmpty()) {
            throw new IllegalArgumentException(path + ": security.protocol=" + f.getProperty("security.protocol")
                    + " needs " + key);
        }
        return v;
    }

    private static String quote(String s) {
        return s.replace("\\", "\\\\").replace("\"", "\\\"");
    }

    private static String contents(String file, Path path) {
        try {
            return Files.readString(Path.of(file));
        } catch (IOException e) {
            throw new IllegalArgumentException(path + ": " + file + " is not a readable file", e);
        }
    }

    /** {@link #read} of {@code UNLEARN_KAFKA_PROPERTIES} when it is set, else no properties (plaintext). */
    public static Properties fromEnv(Map<String, String> env) {
        String path = env.get("UNLEARN_KAFKA_PROPERTIES");
        return path == null || path.isEmpty() ? new Properties() : read(Path.of(path));
    }
}
