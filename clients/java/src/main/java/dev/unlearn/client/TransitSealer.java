package dev.unlearn.client;

import java.security.SecureRandom;

/**
 * One producer's ephemeral X25519 key for one transit key: the exchange and HKDF happen once, each
 * {@link #seal} is one AES-256-GCM encryption with a fresh random 96-bit nonce and the request's
 * own associated data (docs/formats.md, "Sealed inputs", step 3). Only the derived AES key is kept.
 * At most {@link Transit#SEALER_MAX_MESSAGES} seals (then {@link IllegalStateException}: roll a new
 * sealer). Thread-safe: the count is taken under a lock.
 */
public final class TransitSealer {
    /** Where nonces come from (tests inject fixed ones; production: SecureRandom). */
    interface NonceSource {
        byte[] next();
    }

    private final Transit.PublicKeyRecord key;
    private final byte[] epk;
    private final byte[] aesKey;
    private final long maxMessages;
    private final NonceSource nonces;
    private long sealed;

    /** A sealer with a fresh random ephemeral key. */
    public TransitSealer(Transit.PublicKeyRecord key) {
        this(key, Keys.randomPrivate(new SecureRandom()), randomNonces(), Transit.SEALER_MAX_MESSAGES);
    }

    TransitSealer(Transit.PublicKeyRecord key, byte[] ephemeralPrivate, NonceSource nonces, long maxMessages) {
        this.key = key;
        this.epk = Transit.x25519PublicKey(ephemeralPrivate);
        byte[] shared = Transit.x25519(ephemeralPrivate, key.publicKey);
        this.aesKey = Transit.transitKey(shared, epk, key.publicKey);
        this.nonces = nonces;
        this.maxMessages = maxMessages;
    }

    private static NonceSource randomNonces() {
        SecureRandom rnd = new SecureRandom();
        return () -> {
            byte[] n = new byte[12];
            rnd.nextBytes(n);
            return n;
        };
    }

    public Transit.PublicKeyRecord key() { return key; }

    public synchronized boolean exhausted() {
        return sealed >= maxMessages;
    }

    /** {@code request} with its input sealed (adds only; anything else is returned as it is). */
    public Request seal(Request request) {
        if (!"add".equals(request.op) || request.input == null || request.isSealed()) {
            return request;
        }
        request.validate(); // a bad request fails before anything is sealed
        synchronized (this) {
            if (sealed >= maxMessages) {
                throw new IllegalStateException("transit sealer for key " + key.keyId + " has sealed its "
                        + maxMessages + " messages: use a new ephemeral key");
            }
            sealed++;
        }
        byte[] plaintext = Json.toBytes(request.input.toJson());
        byte[] nonce = nonces.next();
        byte[] aad = Transit.aad(request.eventId, request.headId, request.subjectId, request.sampleId, key.keyId);
        byte[] ct = Transit.aesGcmEncrypt(aesKey, nonce, plaintext, aad);
        return request.withInput(new Input.Sealed(key.keyId, epk.clone(), nonce, ct));
    }
}
