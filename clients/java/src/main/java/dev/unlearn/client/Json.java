package dev.unlearn.client;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.math.MathContext;
import java.math.RoundingMode;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The JSON this client reads and writes, with the JDK only.
 *
 * <p>Reading ({@link #parse}): strict RFC 8259 (no NaN or Infinity, no trailing commas, UTF-8 only);
 * objects are {@code LinkedHashMap}s (a repeated key keeps its last value, as the Python
 * reference's orjson does), integers are {@code Long} or {@code BigInteger}, numbers with a
 * fraction or exponent {@code Double} (a number beyond the double range is refused, as orjson
 * refuses {@code 1e999}), so a validator can tell {@code 4} from {@code 4.0}.
 *
 * <p>Writing: the exact bytes the Python reference (orjson) writes for the same values, so a
 * request envelope, and hence its signature, is byte-identical across the two clients
 * (clients/vectors/json_numbers.json and envelopes.json pin it): compact, no spaces; strings
 * escape only {@code "}, {@code \} and control characters ({@code \b \t \n \f \r}, else
 * backslash-u00XX); doubles in their shortest round-trip digits, fixed notation for
 * 1e-5 &lt;= |x| &lt; 1e16 (with {@code .0} on integral values), else {@code d.ddde[+-]x}.
 */
public final class Json {
    private Json() {}

    /** A JSON syntax error (or bytes that are not UTF-8). */
    public static final class JsonException extends IllegalArgumentException {
        private static final long serialVersionUID = 1L;

        JsonException(String message) {
            super(message);
        }
    }

    // ------------------------------------------------------------------ reading
    /** Parse UTF-8 JSON bytes. */
    public static Object parse(byte[] utf8) {
        String text;
        try {
            text = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(utf8)).toString();
        } catch (CharacterCodingException e) {
            throw new JsonException("not UTF-8");
        }
        return parse(text);
    }

    /** Parse a JSON text. */
    public static Object parse(String text) {
        Parser p = new Parser(text);
        p.ws();
        Object v = p.value(0);
        p.ws();
        if (p.pos != text.length()) {
            throw p.err("trailing characters");
        }
        return v;
    }

    private static final class Parser {
        private static final int MAX_DEPTH = 512;
        private final String s;
        private int pos;

        Parser(String s) {
            this.s = s;
        }

        JsonException err(String msg) {
            return new JsonException(msg + " at character " + pos);
        }

        void ws() {
            while (pos < s.length()) {
                char ch = s.charAt(pos);
                if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
                    pos++;
                } else {
                    break;
                }
            }
        }

        Object value(int depth) {
            if (depth > MAX_DEPTH) {
                throw err("nested too deeply");
            }
            if (pos >= s.length()) {
                throw err("unexpected end");
            }
            char ch = s.charAt(pos);
            switch (ch) {
                case '{': return object(depth);
                case '[': return array(depth);
                case '"': return string();
                case 't': return literal("true", Boolean.TRUE);
                case 'f': return literal("false", Boolean.FALSE);
                case 'n': return literal("null", null);
                default:
                    if (ch == '-' || (ch >= '0' && ch <= '9')) {
                        return number();
                    }
                    throw err("unexpected character '" + ch + "'");
            }
        }

        Object literal(String word, Object v) {
            if (!s.startsWith(word, pos)) {
                throw err("bad literal");
            }
            pos += word.length();
            return v;
        }

        Map<String, Object> object(int depth) {
            Map<String, Object> out = new LinkedHashMap<>();
            pos++;
            ws();
            if (pos < s.length() && s.charAt(pos) == '}') {
                pos++;
                return out;
            }
            while (true) {
                ws();
                if (pos >= s.length() || s.charAt(pos) != '"') {
                    throw err("expected a string key");
                }
                String k = string();
                ws();
                expect(':');
                ws();
                out.put(k, value(depth + 1));
                ws();
                if (pos < s.length() && s.charAt(pos) == ',') {
                    pos++;
                    continue;
                }
                expect('}');
                return out;
            }
        }

        List<Object> array(int depth) {
            List<Object> out = new ArrayList<>();
            pos++;
            ws();
            if (pos < s.length() && s.charAt(pos) == ']') {
                pos++;
                return out;
            }
            while (true) {
                ws();
                out.add(value(depth + 1));
                ws();
                if (pos < s.length() && s.charAt(pos) == ',') {
                    pos++;
                    continue;
                }
                expect(']');
                return out;
            }
        }

        void expect(char ch) {
            if (pos >= s.length() || s.charAt(pos) != ch) {
                throw err("expected '" + ch + "'");
            }
            pos++;
        }

        String string() {
            pos++;
            StringBuilder sb = new StringBuilder();
            while (true) {
                if (pos >= s.length()) {
                    throw err("unterminated string");
                }
                char ch = s.charAt(pos++);
                if (ch == '"') {
                    return sb.toString();
                }
                if (ch < 0x20) {
                    throw err("control character in string");
                }
                if (ch != '\\') {
                    sb.append(ch);
                    continue;
                }
                if (pos >= s.length()) {
                    throw err("unterminated escape");
                }
                char e = s.charAt(pos++);
                switch (e) {
                    case '"': sb.append('"'); break;
                    case '\\': sb.append('\\'); break;
                    case '/': sb.append('/'); break;
                    case 'b': sb.append('\b'); break;
                    case 'f': sb.append('\f'); break;
                    case 'n': sb.append('\n'); break;
                    case 'r': sb.append('\r'); break;
                    case 't': sb.append('\t'); break;
                    case 'u':
                        if (pos + 4 > s.length()) {
                            throw err("short u-escape");
                        }
                        int cp = 0;
                        for (int i = 0; i < 4; i++) {
                            int dgt = Character.digit(s.charAt(pos + i), 16);
                            if (dgt < 0) {
                                throw err("bad u-escape");
                            }
                            cp = cp * 16 + dgt;
                        }
                        pos += 4;
                        sb.append((char) cp);
                        break;
                    default:
                        throw err("bad escape");
                }
            }
        }

        Object number() {
            int start = pos;
            if (s.charAt(pos) == '-') {
                pos++;
            }
            if (pos >= s.length()) {
                throw err("bad number");
            }
            if (s.charAt(pos) == '0') {
                pos++;
            } else if (s.charAt(pos) >= '1' && s.charAt(pos) <= '9') {
                while (pos < s.length() && Character.isDigit(s.charAt(pos)) && s.charAt(pos) < 128) {
                    pos++;
                }
            } else {
                throw err("bad number");
            }
            boolean isFloat = false;
            if (pos < s.length() && s.charAt(pos) == '.') {
                isFloat = true;
                pos++;
                digits();
            }
            if (pos < s.length() && (s.charAt(pos) == 'e' || s.charAt(pos) == 'E')) {
                isFloat = true;
                pos++;
                if (pos < s.length() && (s.charAt(pos) == '+' || s.charAt(pos) == '-')) {
                    pos++;
                }
                digits();
            }
            String t = s.substring(start, pos);
            if (isFloat) {
                double v = Double.parseDouble(t);
                if (Double.isInfinite(v)) {
                    throw err("number out of range");
                }
                return v;
            }
            BigInteger big = new BigInteger(t);
            return big.bitLength() < 64 ? (Object) big.longValue() : big;
        }

        void digits() {
            int start = pos;
            while (pos < s.length() && s.charAt(pos) >= '0' && s.charAt(pos) <= '9') {
                pos++;
            }
            if (pos == start) {
                throw err("bad number");
            }
        }
    }

    // ------------------------------------------------------------------ writing
    /** Append {@code v} as orjson writes it (Map, List, String, Boolean, null, numbers, double[]). */
    public static void write(StringBuilder out, Object v) {
        if (v == null) {
            out.append("null");
        } else if (v instanceof String) {
            writeString(out, (String) v);
        } else if (v instanceof Boolean) {
            out.append(((Boolean) v) ? "true" : "false");
        } else if (v instanceof Double || v instanceof Float) {
            out.append(number(((Number) v).doubleValue()));
        } else if (v instanceof Long || v instanceof Integer || v instanceof BigInteger) {
            out.append(v.toString());
        } else if (v instanceof double[]) {
            double[] a = (double[]) v;
            out.append('[');
            for (int i = 0; i < a.length; i++) {
                if (i > 0) {
                    out.append(',');
                }
                out.append(number(a[i]));
            }
            out.append(']');
        } else if (v instanceof Map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                writeString(out, (String) e.getKey());
                out.append(':');
                write(out, e.getValue());
            }
            out.append('}');
        } else if (v instanceof List) {
            out.append('[');
            boolean first = true;
            for (Object x : (List<?>) v) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                write(out, x);
            }
            out.append(']');
        } else {
            throw new IllegalArgumentException("cannot write " + v.getClass().getName() + " as JSON");
        }
    }

    /** {@code v} as orjson writes it, UTF-8. */
    public static byte[] toBytes(Object v) {
        StringBuilder sb = new StringBuilder();
        write(sb, v);
        return sb.toString().getBytes(StandardCharsets.UTF_8);
    }

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    static void writeString(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char ch = s.charAt(i);
            if (Character.isSurrogate(ch)) {
                boolean paired = Character.isHighSurrogate(ch) && i + 1 < s.length()
                        && Character.isLowSurrogate(s.charAt(i + 1));
                if (!paired) {
                    throw new IllegalArgumentException("string is not encodable as UTF-8 (lone surrogate)");
                }
                out.append(ch).append(s.charAt(++i));
                continue;
            }
            switch (ch) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\b': out.append("\\b"); break;
                case '\t': out.append("\\t"); break;
                case '\n': out.append("\\n"); break;
                case '\f': out.append("\\f"); break;
                case '\r': out.append("\\r"); break;
                default:
                    if (ch < 0x20) {
                        out.append("\\u00").append(HEX[ch >> 4]).append(HEX[ch & 0xf]);
                    } else {
                        out.append(ch);
                    }
            }
        }
        out.append('"');
    }

    /**
     * A finite double as orjson spells it: the shortest decimal that reads back to the same
     * double (the correctly rounded one among equally short), fixed notation when the decimal
     * exponent is in -5..15, else scientific with an explicit sign.
     */
    public static String number(double x) {
        if (!Double.isFinite(x)) {
            throw new IllegalArgumentException("JSON cannot carry " + x);
        }
        if (x == 0) {
            return (Double.doubleToRawLongBits(x) < 0) ? "-0.0" : "0.0";
        }
        BigDecimal exact = new BigDecimal(x);
        BigDecimal shortest = null;
        for (int p = 1; p <= 17 && shortest == null; p++) {
            BigDecimal r = exact.round(new MathContext(p, RoundingMode.HALF_EVEN));
            // the nearest p-digit decimal, or (at a power of two, where the interval that reads
            // back to x is lopsided) its neighbour: the closest of those that round-trip
            BigDecimal unit = BigDecimal.ONE.scaleByPowerOfTen(-r.scale());
            for (BigDecimal cand : new BigDecimal[] {r, r.add(unit), r.subtract(unit)}) {
                if (cand.signum() != 0 && cand.precision() <= p && cand.doubleValue() == x
                        && (shortest == null || cand.subtract(exact).abs().compareTo(shortest.subtract(exact).abs()) < 0)) {
                    shortest = cand;
                }
            }
        }
        if (shortest == null) {
            throw new AssertionError("no round-trip decimal for " + x);
        }
        BigDecimal stripped = shortest.stripTrailingZeros();
        String digits = stripped.unscaledValue().abs().toString();
        int exp10 = digits.length() - 1 - stripped.scale(); // exponent of the leading digit
        StringBuilder sb = new StringBuilder();
        if (x < 0) {
            sb.append('-');
        }
        if (exp10 >= -5 && exp10 < 16) {
            if (exp10 < 0) {
                sb.append("0.");
                for (int i = 0; i < -exp10 - 1; i++) {
                    sb.append('0');
                }
                sb.append(digits);
            } else if (digits.length() <= exp10 + 1) {
                sb.append(digits);
                for (int i = digits.length(); i <= exp10; i++) {
                    sb.append('0');
                }
                sb.append(".0");
            } else {
                sb.append(digits, 0, exp10 + 1).append('.').append(digits, exp10 + 1, digits.length());
            }
        } else {
            sb.append(digits.charAt(0));
            if (digits.length() > 1) {
                sb.append('.').append(digits, 1, digits.length());
            }
            sb.append('e').append(exp10 < 0 ? "-" : "+").append(Math.abs(exp10));
        }
        return sb.toString();
    }
}
