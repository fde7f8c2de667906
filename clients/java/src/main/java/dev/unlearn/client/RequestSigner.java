package dev.unlearn.client;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyPair;
import java.security.MessageDigest;
import java.security.Signature;
import java.util.Arrays;
import java.util.Base64;

/**
 * Signs request values for signed mode (docs/formats.md, "Signature headers"; docs/security.md):
 * Ed25519 over the record value's exact bytes, carried in the headers {@code unlearn-sig-key}
 * (the key id, UTF-8) and {@code unlearn-sig} (padded standard base64 of the 64-byte signature).
 * The key id defaults to the key's fingerprint, {@code ed25519:} + 16 hex digits of SHA-256 of the
 * raw public key, as the Python SDK and {@code unlearn clients} name it.
 */
public final class RequestSigner {
    public static final String SIG_KEY_HEADER = "unlearn-sig-key";
    public static final String SIG_HEADER = "unlearn-sig";
    private static final byte[] PKCS8_PREFIX = Hex.decode("302e020100300506032b657004220420");

    private final KeyPair pair;
    private final byte[] publicKey;
    private final String keyId;

    private RequestSigner(byte[] seed, String keyId) {
        this.pair = Keys.pairOf("Ed25519", seed);
        this.publicKey = Keys.rawPublic(pair.getPublic());
        this.keyId = keyId != null ? keyId : fingerprint(publicKey);
        if (!Ids.isValid(this.keyId)) {
            throw new IllegalArgumentException("a key id is an id (1..128 of [A-Za-z0-9._:@+-]), got " + this.keyId);
        }
    }

    /** A signer for the 32-byte Ed25519 private key (seed); {@code keyId} null: the fingerprint. */
    public static RequestSigner fromSeed(byte[] seed, String keyId) {
        return new RequestSigner(seed, keyId);
    }

    /** A signer for a PKCS#8 PEM Ed25519 private key (what {@code unlearn clients keygen} and openssl write). */
    public static RequestSigner fromPem(String pem, String keyId) {
        String body = pem.replaceAll("-----(BEGIN|END) PRIVATE KEY-----", "").replaceAll("\\s", "");
        byte[] der = Base64.getDecoder().decode(body);
        if (der.length != PKCS8_PREFIX.length + 32
                || !Arrays.equals(Arrays.copyOf(der, PKCS8_PREFIX.length), PKCS8_PREFIX)) {
            throw new IllegalArgumentException("not an unencrypted PKCS#8 Ed25519 private key");
        }
        return new RequestSigner(Arrays.copyOfRange(der, PKCS8_PREFIX.length, der.length), keyId);
    }

    /** {@link #fromPem} of a file. */
    public static RequestSigner fromFile(Path pemFile, String keyId) throws IOException {
        return fromPem(Files.readString(pemFile, StandardCharsets.US_ASCII), keyId);
    }

    /** The default key id of a raw Ed25519 public key. */
    public static String fingerprint(byte[] publicKey) {
        try {
            byte[] h = MessageDigest.getInstance("SHA-256").digest(publicKey);
            return "ed25519:" + Hex.encode(h, 0, 8);
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException(e);
        }
    }

    public String keyId() { return keyId; }

    /** The raw 32-byte public key (what the client registry stores). */
    public byte[] publicKey() { return publicKey.clone(); }

    /** The 64-byte Ed25519 signature of {@code value}. */
    public byte[] sign(byte[] value) {
        try {
            Signature s = Signature.getInstance("Ed25519");
            s.initSign(pair.getPrivate());
            s.update(value);
            return s.sign();
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("Ed25519 signing failed", e);
        }
    }

    /** The {@code unlearn-sig} header value: padded standard base64 of the signature. */
    public String signatureHeader(byte[] value) {
        return Base64.getEncoder().encodeToString(sign(value));
    }

    /** Whether {@code signature} is a valid signature of {@code value} by the raw {@code publicKey}. */
    public static boolean verify(byte[] value, byte[] signature, byte[] publicKey) {
        if (signature.length != 64 || publicKey.length != 32) {
            return false;
        }
        try {
            Signature s = Signature.getInstance("Ed25519");
            s.initVerify(Keys.ed25519Public(publicKey));
            s.update(value);
            return s.verify(signature);
        } catch (GeneralSecurityException e) {
            return false;
        }
    }
}
