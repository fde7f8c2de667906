package dev.unlearn.client;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.KeyPair;
import java.security.MessageDigest;
import java.util.Arrays;
import java.util.Base64;
import java.util.Map;
import javax.crypto.Cipher;
import javax.crypto.KeyAgreement;
import javax.crypto.Mac;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;

/**
 * Transit sealing primitives (docs/formats.md, "Sealed inputs"; reference {@code schemas/transit.py}):
 * X25519 between an ephemeral key and the partition's published transit key, HKDF-SHA256 (written
 * here over the JDK's HmacSHA256) to the AES-256 key, AES-256-GCM with the associated data that
 * binds the ciphertext to one request. Also the by-head partition rule and the public key record.
 */
public final class Transit {
    public static final String HKDF_INFO = "unlearn-transit/v1 aes-256-gcm";
    public static final String PURPOSE = "request-input";
    public static final String KEY_SCHEMA = "unlearn.transit-key/v1";
    /** Requests sealed under one derived key before a new ephemeral key (the nonce-collision bound). */
    public static final long SEALER_MAX_MESSAGES = 1L << 20;
    private static final byte[] AAD_TAG = "unlearn-transit/v1\0".getBytes(StandardCharsets.US_ASCII);

    private Transit() {}

    /** A published transit key ({@code unlearn.transit-key/v1} on {@code <prefix>transit-keys}). */
    public static final class PublicKeyRecord {
        public final int partition;
        public final String keyId;
        final byte[] publicKey;
        public final double created;
        public final double useUntil;

        public PublicKeyRecord(int partition, String keyId, byte[] publicKey, double created, double useUntil) {
            this.partition = partition;
            this.keyId = keyId;
            this.publicKey = publicKey.clone();
            this.created = created;
            this.useUntil = useUntil;
        }

        public byte[] publicKey() { return publicKey.clone(); }

        /** Decode a record value; {@link TransitException} for anything else (as the reference). */
        public static PublicKeyRecord decode(byte[] value) {
            Map<?, ?> m;
            try {
                Object doc = Json.parse(value);
                if (!(doc instanceof Map) || !KEY_SCHEMA.equals(((Map<?, ?>) doc).get("schema"))) {
                    throw new TransitException("not a transit-key record");
                }
                m = (Map<?, ?>) doc;
                Object p = m.get("partition");
                Object k = m.get("key_id");
                Object pk = m.get("public_key");
                Object c = m.get("created");
                Object u = m.get("use_until");
                if (!(p instanceof Long) || !(k instanceof String) || !(pk instanceof String)
                        || !(c instanceof Number) || !(u instanceof Number)) {
                    throw new TransitException("bad transit-key record: missing or mistyped fields");
                }
                byte[] raw = Base64.getDecoder().decode((String) pk);
                long part = (Long) p;
                if (raw.length != 32 || part < 0 || part > Integer.MAX_VALUE) {
                    throw new TransitException("bad transit-key record: public key not 32 bytes, or bad partition");
                }
                return new PublicKeyRecord((int) part, (String) k, raw, ((Number) c).doubleValue(),
                        ((Number) u).doubleValue());
            } catch (IllegalArgumentException e) {
                if (e instanceof TransitException) {
                    throw e;
                }
                throw new TransitException("bad transit-key record: " + e.getMessage());
            }
        }
    }

    /** {@code "unlearn-transit/v1\0"} then purpose, event, head, subject, sample and key ids, each u16 LE length + UTF-8. */
    public static byte[] aad(String eventId, String headId, String subjectId, String sampleId, String keyId) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        out.writeBytes(AAD_TAG);
        for (String s : new String[] {PURPOSE, eventId, headId, subjectId, sampleId, keyId}) {
            byte[] b = s.getBytes(StandardCharsets.UTF_8);
            out.write(b.length & 0xff);
            out.write((b.length >>> 8) & 0xff);
            out.writeBytes(b);
        }
        return out.toByteArray();
    }

    /** HKDF-SHA256 (RFC 5869) of {@code ikm} with {@code salt} and {@code info}, {@code length} <= 32*255 bytes. */
    public static byte[] hkdfSha256(byte[] ikm, byte[] salt, byte[] info, int length) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(salt.length == 0 ? new byte[32] : salt, "HmacSHA256"));
            byte[] prk = mac.doFinal(ikm);
            mac.init(new SecretKeySpec(prk, "HmacSHA256"));
            byte[] out = new byte[length];
            byte[] t = new byte[0];
            int done = 0;
            for (int i = 1; done < length; i++) {
                mac.update(t);
                mac.update(info);
                mac.update((byte) i);
                t = mac.doFinal();
                int n = Math.min(t.length, length - done);
                System.arraycopy(t, 0, out, done, n);
                done += n;
            }
            return out;
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException(e);
        }
    }

    /** X25519(private, public) of raw 32-byte keys; {@link TransitException} for a low-order public key. */
    public static byte[] x25519(byte[] privateKey, byte[] publicKey) {
        try {
            KeyPair pair = Keys.pairOf("X25519", privateKey);
            KeyAgreement ka = KeyAgreement.getInstance("X25519");
            ka.init(pair.getPrivate());
            ka.doPhase(Keys.x25519Public(publicKey), true);
            byte[] shared = ka.generateSecret();
            if (Arrays.equals(shared, new byte[32])) {
                throw new TransitException("X25519 gave the all-zero secret (a low-order public key)");
            }
            return shared;
        } catch (GeneralSecurityException e) {
            throw new TransitException("X25519 failed: " + e.getMessage());
        }
    }

    /** The raw X25519 public key of a raw private key. */
    public static byte[] x25519PublicKey(byte[] privateKey) {
        return Keys.rawPublic(Keys.pairOf("X25519", privateKey).getPublic());
    }

    /** The AES-256 key: HKDF-SHA256(shared, salt = epk || transit public key, info). */
    public static byte[] transitKey(byte[] shared, byte[] epk, byte[] publicKey) {
        byte[] salt = Arrays.copyOf(epk, epk.length + publicKey.length);
        System.arraycopy(publicKey, 0, salt, epk.length, publicKey.length);
        return hkdfSha256(shared, salt, HKDF_INFO.getBytes(StandardCharsets.US_ASCII), 32);
    }

    /** AES-256-GCM encryption: ciphertext || 16-byte tag. */
    static byte[] aesGcmEncrypt(byte[] key, byte[] nonce, byte[] plaintext, byte[] aad) {
        try {
            Cipher c = Cipher.getInstance("AES/GCM/NoPadding");
            c.init(Cipher.ENCRYPT_MODE, new SecretKeySpec(key, "AES"), new GCMParameterSpec(128, nonce));
            c.updateAAD(aad);
            return c.doFinal(plaintext);
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("AES-GCM failed", e);
        }
    }

    /** AES-256-GCM decryption; {@link TransitException} when the tag does not verify. */
    static byte[] aesGcmDecrypt(byte[] key, byte[] nonce, byte[] ciphertext, byte[] aad) {
        try {
            Cipher c = Cipher.getInstance("AES/GCM/NoPadding");
            c.init(Cipher.DECRYPT_MODE, new SecretKeySpec(key, "AES"), new GCMParameterSpec(128, nonce));
            c.updateAAD(aad);
            return c.doFinal(ciphertext);
        } catch (GeneralSecurityException e) {
            throw new TransitException("sealed input does not open: " + e.getMessage());
        }
    }

    /**
     * The by-head partition of a head: the first 8 bytes of SHA-256(UTF-8 head id) as a big-endian
     * unsigned integer, modulo the partition count of {@code <prefix>requests.by-head}.
     */
    public static int headPartition(String headId, int partitions) {
        if (partitions < 1) {
            throw new IllegalArgumentException("partitions must be >= 1, got " + partitions);
        }
        try {
            byte[] h = MessageDigest.getInstance("SHA-256").digest(headId.getBytes(StandardCharsets.UTF_8));
            long v = 0;
            for (int i = 0; i < 8; i++) {
                v = (v << 8) | (h[i] & 0xff);
            }
            return (int) Long.remainderUnsigned(v, partitions);
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException(e);
        }
    }
}
