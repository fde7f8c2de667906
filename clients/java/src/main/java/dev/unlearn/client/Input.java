package dev.unlearn.client;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * An add's {@code input} (docs/formats.md, "Request envelope"): a feature vector as JSON numbers
 * or as little-endian float64 / float32 bytes ({@code features_bin}), a text, a PNG image, or one
 * of those sealed for transit. {@link #toJson()} is the JSON object in the reference's field order.
 */
public abstract class Input {
    private Input() {}

    /** The JSON object of this input (also the plaintext of a sealed one). */
    abstract Map<String, Object> toJson();

    abstract void validate();

    /** Features as JSON numbers (input kind {@code features}). */
    public static Input features(double[] values) {
        return new Features(values.clone(), null);
    }

    /** Features as {@code features_bin} {@code <f8}: exactly the float64 values JSON would give. */
    public static Input featuresF64(double[] values) {
        return new Features(values.clone(), "<f8");
    }

    /** Features as {@code features_bin} {@code <f4}: the featurizer quantizes these float32 values. */
    public static Input featuresF32(float[] values) {
        double[] wide = new double[values.length];
        for (int i = 0; i < values.length; i++) {
            wide[i] = values[i];
        }
        return new Features(wide, "<f4");
    }

    /** Float64 values rounded to float32 (Java's cast: round to nearest even, as numpy's astype). */
    public static Input featuresF32(double[] values) {
        float[] f = new float[values.length];
        for (int i = 0; i < values.length; i++) {
            f[i] = (float) values[i];
        }
        return featuresF32(f);
    }

    public static Input text(String text) {
        return new Text(text);
    }

    public static Input imagePng(byte[] png) {
        return new Image(png.clone());
    }

    static final class Features extends Input {
        final double[] values;
        final String dtype; // null: JSON numbers

        Features(double[] values, String dtype) {
            this.values = values;
            this.dtype = dtype;
        }

        @Override
        void validate() {
            if (values.length == 0) {
                throw new InvalidRequestException("bad_features", "features must be a non-empty vector of numbers");
            }
            for (double v : values) {
                if (!Double.isFinite(v)) {
                    throw new InvalidRequestException("non_finite_feature", "a feature value is NaN or infinite");
                }
            }
        }

        @Override
        Map<String, Object> toJson() {
            Map<String, Object> m = new LinkedHashMap<>();
            if (dtype == null) {
                m.put("kind", "features");
                m.put("values", values);
                return m;
            }
            boolean f4 = "<f4".equals(dtype);
            ByteBuffer bb = ByteBuffer.allocate(values.length * (f4 ? 4 : 8)).order(ByteOrder.LITTLE_ENDIAN);
            for (double v : values) {
                if (f4) {
                    bb.putFloat((float) v);
                } else {
                    bb.putDouble(v);
                }
            }
            m.put("kind", "features_bin");
            m.put("dtype", dtype);
            m.put("data", Base64.getEncoder().encodeToString(bb.array()));
            return m;
        }
    }

    static final class Text extends Input {
        final String text;

        Text(String text) {
            this.text = text;
        }

        @Override
        void validate() {
            if (text == null || text.isEmpty()) {
                throw new InvalidRequestException("bad_text", "input.text must be a non-empty string");
            }
        }

        @Override
        Map<String, Object> toJson() {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("kind", "text");
            m.put("text", text);
            return m;
        }
    }

    static final class Image extends Input {
        final byte[] png;

        Image(byte[] png) {
            this.png = png;
        }

        @Override
        void validate() {
            if (png.length == 0) {
                throw new InvalidRequestException("bad_base64", "image data must not be empty");
            }
        }

        @Override
        Map<String, Object> toJson() {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("kind", "image");
            m.put("format", "png");
            m.put("data", Base64.getEncoder().encodeToString(png));
            return m;
        }
    }

    /** An input sealed for transit ({@code kind: sealed}; docs/formats.md, "Sealed inputs"). */
    static final class Sealed extends Input {
        final String keyId;
        final byte[] epk;
        final byte[] nonce;
        final byte[] ciphertext;

        Sealed(String keyId, byte[] epk, byte[] nonce, byte[] ciphertext) {
            this.keyId = keyId;
            this.epk = epk;
            this.nonce = nonce;
            this.ciphertext = ciphertext;
        }

        @Override
        void validate() {
            if (!keyId.matches("[0-9a-f]{32}") || epk.length != 32 || nonce.length != 12 || ciphertext.length < 16) {
                throw new InvalidRequestException("bad_sealed_input", "a sealed input needs a 32-hex key_id, a "
                        + "32-byte epk, a 12-byte nonce and at least 16 bytes of ciphertext");
            }
        }

        @Override
        Map<String, Object> toJson() {
            Base64.Encoder b64 = Base64.getEncoder();
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("kind", "sealed");
            m.put("key_id", keyId);
            m.put("epk", b64.encodeToString(epk));
            m.put("nonce", b64.encodeToString(nonce));
            m.put("ciphertext", b64.encodeToString(ciphertext));
            return m;
        }
    }
}
