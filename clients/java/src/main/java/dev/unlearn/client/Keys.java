package dev.unlearn.client;

import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.PrivateKey;
import java.security.PublicKey;
import java.security.SecureRandom;
import java.security.spec.NamedParameterSpec;
import java.security.spec.X509EncodedKeySpec;
import java.util.Arrays;

/**
 * Raw 32-byte Ed25519 / X25519 keys (the formats' spelling) to and from JDK key objects. The JDK
 * has no "public key of this private key" call; a key pair generator fed the private bytes as its
 * randomness computes it (both generators draw exactly the 32 private bytes).
 */
final class Keys {
    private static final byte[] ED25519_SPKI = Hex.decode("302a300506032b6570032100");
    private static final byte[] X25519_SPKI = Hex.decode("302a300506032b656e032100");

    private Keys() {}

    /** A SecureRandom that hands out fixed bytes once: a key pair from known private bytes. */
    private static final class Fixed extends SecureRandom {
        private static final long serialVersionUID = 1L;
        private final byte[] bytes;
        private boolean used;

        Fixed(byte[] bytes) {
            this.bytes = bytes.clone();
        }

        @Override
        public void nextBytes(byte[] out) {
            if (used || out.length != bytes.length) {
                throw new IllegalStateException("fixed key bytes requested twice or with another length");
            }
            used = true;
            System.arraycopy(bytes, 0, out, 0, out.length);
        }
    }

    /** The key pair whose private key is {@code raw} ("Ed25519" or "X25519"). */
    static KeyPair pairOf(String algorithm, byte[] raw) {
        if (raw.length != 32) {
            throw new IllegalArgumentException(algorithm + " private keys have 32 bytes, got " + raw.length);
        }
        try {
            KeyPairGenerator g = KeyPairGenerator.getInstance(algorithm);
            g.initialize(new NamedParameterSpec(algorithm), new Fixed(raw));
            return g.generateKeyPair();
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("the JDK lacks " + algorithm, e);
        }
    }

    /** A fresh random key pair and its raw private bytes. */
    static byte[] randomPrivate(SecureRandom rnd) {
        byte[] b = new byte[32];
        rnd.nextBytes(b);
        return b;
    }

    /** The raw 32 bytes of an Ed25519 / X25519 public key (the tail of its X.509 encoding). */
    static byte[] rawPublic(PublicKey key) {
        byte[] enc = key.getEncoded();
        return Arrays.copyOfRange(enc, enc.length - 32, enc.length);
    }

    static PublicKey x25519Public(byte[] raw) throws GeneralSecurityException {
        return publicKey("X25519", X25519_SPKI, raw);
    }

    static PublicKey ed25519Public(byte[] raw) throws GeneralSecurityException {
        return publicKey("Ed25519", ED25519_SPKI, raw);
    }

    private static PublicKey publicKey(String algorithm, byte[] prefix, byte[] raw) throws GeneralSecurityException {
        if (raw.length != 32) {
            throw new GeneralSecurityException(algorithm + " public keys have 32 bytes, got " + raw.length);
        }
        byte[] spki = Arrays.copyOf(prefix, prefix.length + 32);
        System.arraycopy(raw, 0, spki, prefix.length, 32);
        return KeyFactory.getInstance(algorithm).generatePublic(new X509EncodedKeySpec(spki));
    }

    static PrivateKey privateOf(KeyPair pair) {
        return pair.getPrivate();
    }
}
