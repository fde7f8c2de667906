package dev.unlearn.client;

import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

class TraceparentTest {
    /** A W3C traceparent: version 00, 32 and 16 lowercase hex ids (never all zero), sampled. */
    @Test
    void aNewTraceparentIsAValidW3cContext() {
        String a = UnlearnClient.newTraceparent();
        String b = UnlearnClient.newTraceparent();
        assertTrue(a.matches("00-[0-9a-f]{32}-[0-9a-f]{16}-01"), a);
        assertTrue(!a.substring(3, 35).matches("0+") && !a.substring(36, 52).matches("0+"), a);
        assertNotEquals(a, b);
    }
}
