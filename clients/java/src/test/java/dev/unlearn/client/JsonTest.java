package dev.unlearn.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.math.BigInteger;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class JsonTest {
    /** Every double of json_numbers.json is spelled exactly as orjson spells it. */
    @Test
    void numbersAreSpelledAsTheReferenceSpellsThem() {
        List<Map<String, Object>> cases = Vectors.list(Vectors.load("json_numbers.json"), "cases");
        for (Map<String, Object> cs : cases) {
            double x = Double.longBitsToDouble(Long.parseUnsignedLong((String) cs.get("bits"), 16));
            assertEquals(cs.get("json"), Json.number(x), () -> "bits " + cs.get("bits"));
            assertEquals(Double.doubleToRawLongBits(x), Double.doubleToRawLongBits(Double.parseDouble(Json.number(x))));
        }
        assertEquals(true, cases.size() > 900);
    }

    @Test
    void parsesStrictlyAndKeepsIntegersApartFromFloats() {
        Map<?, ?> m = (Map<?, ?>) Json.parse("{\"a\": 4, \"b\": 4.0, \"c\": 18446744073709551615, \"a\": [true, null]}");
        assertEquals(List.of(true), List.of(((List<?>) m.get("a")).get(0)));
        assertEquals(4.0, m.get("b"));
        assertEquals(new BigInteger("18446744073709551615"), m.get("c"));
        assertEquals("é\n\u0001", Json.parse("\"\\u00e9\\n\\u0001\""));
        for (String bad : new String[] {"", "{", "[1,]", "{\"a\":1,}", "NaN", "1e999", "01", "\"\u0001\"", "tru",
                                         "[1] x", "-", "1.", ".5"}) {
            assertThrows(Json.JsonException.class, () -> Json.parse(bad), bad);
        }
    }
}
