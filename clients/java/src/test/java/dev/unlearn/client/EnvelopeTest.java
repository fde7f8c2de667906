package dev.unlearn.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.Base64;
import java.util.Deque;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** Envelopes, signatures, transit sealing and receipts against envelopes.json, transit.json, receipts.json. */
class EnvelopeTest {

    /** A Request from a vector's API fields (what a Java caller would pass). */
    static Request request(Map<String, Object> s) {
        Map<String, Object> in = s.containsKey("input") ? Vectors.map(s.get("input")) : null;
        Double ts = s.containsKey("ts") ? Vectors.num(s.get("ts")) : null;
        List<String> nans = s.containsKey("nan") ? ((List<?>) s.get("nan")).stream().map(Object::toString)
                .collect(java.util.stream.Collectors.toList()) : List.of();
        String ev = (String) s.get("event_id");
        String head = (String) s.get("head_id");
        String client = (String) s.get("client_id");
        String subject = (String) s.get("subject_id");
        String sample = (String) s.get("sample_id");
        switch ((String) s.get("op")) {
            case "delete":
                return Request.delete(ev, head, client, subject, sample, ts);
            case "delete_subject":
                return Request.deleteSubject(ev, head, client, subject, ts);
            default:
                break;
        }
        Input input;
        String kind = in == null ? "features" : (String) in.get("kind");
        if (in == null) { // the vector's input held NaN, which JSON cannot carry
            input = Input.features(new double[] {Double.NaN});
        } else if ("features".equals(kind)) {
            double[] v = Vectors.doubles(in.get("values"));
            String enc = (String) in.get("encoding");
            input = "json".equals(enc) ? Input.features(v) : "f64".equals(enc) ? Input.featuresF64(v)
                    : Input.featuresF32(v);
        } else if ("text".equals(kind)) {
            input = Input.text((String) in.get("text"));
        } else {
            input = Input.imagePng(Vectors.b64(in.get("png_b64")));
        }
        if (nans.contains("label")) {
            return Request.add(ev, head, client, subject, sample, new double[] {Double.NaN}, input, ts);
        }
        Object label = s.get("label");
        if (label instanceof List) {
            return Request.add(ev, head, client, subject, sample, Vectors.doubles(label), input, ts);
        }
        return Request.add(ev, head, client, subject, sample, (Long) label, input, ts);
    }

    @Test
    void envelopesAndSignaturesAreByteIdentical() {
        Map<String, Object> v = Vectors.load("envelopes.json");
        Map<String, Object> key = Vectors.map(v.get("signing_key"));
        RequestSigner signer = RequestSigner.fromSeed(Hex.decode((String) key.get("seed_hex")), null);
        assertEquals(key.get("key_id"), signer.keyId());
        assertArrayEquals(Vectors.b64(key.get("public_b64")), signer.publicKey());
        RequestSigner fromPem = RequestSigner.fromPem((String) key.get("pkcs8_pem"), null);
        assertArrayEquals(signer.publicKey(), fromPem.publicKey());
        for (Map<String, Object> cs : Vectors.list(v, "cases")) {
            byte[] value = request(cs).encode();
            assertEquals(cs.get("value"), new String(value, StandardCharsets.UTF_8), (String) cs.get("name"));
            assertEquals(cs.get("sig_key"), signer.keyId());
            assertEquals(cs.get("sig"), signer.signatureHeader(value), (String) cs.get("name"));
            assertTrue(RequestSigner.verify(value, Base64.getDecoder().decode((String) cs.get("sig")),
                    signer.publicKey()));
            value[value.length - 2] ^= 1;
            assertFalse(RequestSigner.verify(value, signer.sign(new byte[0]), signer.publicKey()));
        }
        Map<String, Object> named = Vectors.map(key.get("named"));
        RequestSigner k2 = RequestSigner.fromSeed(Hex.decode((String) key.get("seed_hex")), "k-2026");
        assertEquals("k-2026", k2.keyId());
        assertEquals(named.get("sig"), k2.signatureHeader(((String) named.get("value")).getBytes(StandardCharsets.UTF_8)));
    }

    @Test
    void invalidRequestsFailAtTheSourceWithTheReferenceReason() {
        for (Map<String, Object> cs : Vectors.list(Vectors.load("envelopes.json"), "invalid")) {
            InvalidRequestException ex = assertThrows(InvalidRequestException.class, () -> request(cs).encode(),
                    (String) cs.get("name"));
            assertEquals(cs.get("reason"), ex.reason(), (String) cs.get("name"));
        }
    }

    @Test
    void transitSealingMatchesTheReferenceWithFixedKeysAndNonces() {
        Map<String, Object> v = Vectors.load("transit.json");
        Map<String, Object> tk = Vectors.map(v.get("transit_key"));
        Map<String, Object> eph = Vectors.map(v.get("ephemeral"));
        byte[] transitPrivate = Hex.decode((String) tk.get("private_hex"));
        byte[] transitPublic = Hex.decode((String) tk.get("public_hex"));
        assertArrayEquals(transitPublic, Transit.x25519PublicKey(transitPrivate));
        byte[] ephPrivate = Hex.decode((String) eph.get("private_hex"));
        byte[] epk = Transit.x25519PublicKey(ephPrivate);
        assertArrayEquals(Hex.decode((String) eph.get("public_hex")), epk);
        byte[] shared = Transit.x25519(ephPrivate, transitPublic);
        assertArrayEquals(Hex.decode((String) eph.get("shared_hex")), shared);
        assertArrayEquals(shared, Transit.x25519(transitPrivate, epk), "both sides agree");
        byte[] k = Transit.transitKey(shared, epk, transitPublic);
        assertArrayEquals(Hex.decode((String) eph.get("aes_key_hex")), k);

        Transit.PublicKeyRecord rec = Transit.PublicKeyRecord.decode(
                ((String) tk.get("record")).getBytes(StandardCharsets.UTF_8));
        assertEquals(tk.get("key_id"), rec.keyId);
        assertEquals(5, rec.partition);
        assertArrayEquals(transitPublic, rec.publicKey());
        List<Map<String, Object>> sealed = Vectors.list(v, "sealed");
        Deque<byte[]> nonces = new ArrayDeque<>();
        for (Map<String, Object> cs : sealed) {
            nonces.add(Hex.decode((String) cs.get("nonce_hex")));
        }
        TransitSealer sealer = new TransitSealer(rec, ephPrivate, nonces::removeFirst, 3);
        RequestSigner signer = RequestSigner.fromSeed(
                Hex.decode((String) Vectors.map(Vectors.load("envelopes.json").get("signing_key")).get("seed_hex")), null);
        for (Map<String, Object> cs : sealed) {
            Request plain = request(cs);
            assertEquals(cs.get("plaintext"), new String(Json.toBytes(plain.input.toJson()), StandardCharsets.UTF_8));
            assertEquals(cs.get("aad_hex"), Hex.encode(Transit.aad(plain.eventId, plain.headId, plain.subjectId,
                    plain.sampleId, rec.keyId)));
            Request s = sealer.seal(plain);
            assertTrue(s.isSealed());
            byte[] value = s.encode();
            assertEquals(cs.get("value"), new String(value, StandardCharsets.UTF_8));
            assertEquals(cs.get("sig"), signer.signatureHeader(value));
            // the featurizer's side: it opens, and only for this request
            Input.Sealed in = (Input.Sealed) s.input;
            byte[] key = Transit.transitKey(Transit.x25519(transitPrivate, in.epk), in.epk, transitPublic);
            byte[] aad = Transit.aad(plain.eventId, plain.headId, plain.subjectId, plain.sampleId, rec.keyId);
            assertEquals(cs.get("plaintext"), new String(Transit.aesGcmDecrypt(key, in.nonce, in.ciphertext, aad),
                    StandardCharsets.UTF_8));
            byte[] moved = Transit.aad(plain.eventId, plain.headId, "someone-else", plain.sampleId, rec.keyId);
            assertThrows(TransitException.class, () -> Transit.aesGcmDecrypt(key, in.nonce, in.ciphertext, moved));
        }
        assertTrue(sealer.exhausted());
        assertThrows(IllegalStateException.class, () -> sealer.seal(request(sealed.get(0))));
        Request delete = Request.delete("e", "h", "c", "s", "x", 1.0);
        assertTrue(delete == new TransitSealer(rec).seal(delete), "deletes are never sealed");
        for (Object bad : (List<?>) v.get("bad_records")) {
            assertThrows(TransitException.class,
                    () -> Transit.PublicKeyRecord.decode(((String) bad).getBytes(StandardCharsets.UTF_8)), (String) bad);
        }
        assertThrows(TransitException.class, () -> Transit.x25519(ephPrivate, new byte[32]), "low-order key");
    }

    @Test
    void headPartitionIsTheRoutersRule() {
        for (Map<String, Object> cs : Vectors.list(Vectors.load("transit.json"), "head_partition")) {
            assertEquals((long) (Long) cs.get("partition"), Transit.headPartition((String) cs.get("head_id"),
                    (int) (long) (Long) cs.get("partitions")));
        }
    }

    @Test
    void hkdfMatchesRfc5869TestCase1() {
        byte[] okm = Transit.hkdfSha256(Hex.decode("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"),
                Hex.decode("000102030405060708090a0b0c"), Hex.decode("f0f1f2f3f4f5f6f7f8f9"), 42);
        assertEquals("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865", Hex.encode(okm));
    }

    @Test
    void receiptsDecodeExactlyAsTheReference() {
        Map<String, Object> v = Vectors.load("receipts.json");
        for (Map<String, Object> cs : Vectors.list(v, "valid")) {
            Receipt r = Receipt.decode(((String) cs.get("doc")).getBytes(StandardCharsets.UTF_8));
            Map<String, Object> e = Vectors.map(cs.get("expect"));
            assertEquals(e.get("event_id"), r.eventId());
            assertEquals(e.get("subject_id"), r.subjectId());
            assertEquals(e.get("head_id"), r.headId());
            assertEquals(e.get("sample_ids"), r.sampleIds());
            assertEquals(e.get("status"), r.status());
            assertEquals(Vectors.num(e.get("ts")), r.ts());
            assertEquals(e.get("head_version"), r.headVersion() == null ? null : Long.toUnsignedString(r.headVersion()));
            assertEquals(e.get("digest"), r.digest());
            assertEquals(e.get("reason"), r.reason());
            assertEquals(e.get("retained_hash"), r.retainedHash());
            assertEquals(e.get("tombstone_ts") == null ? null : Vectors.num(e.get("tombstone_ts")), r.tombstoneTs());
            assertEquals(e.get("tombstone_expires") == null ? null : Vectors.num(e.get("tombstone_expires")),
                    r.tombstoneExpires());
            assertEquals(e.get("tombstone_client_id"), r.tombstoneClientId());
        }
        for (Map<String, Object> cs : Vectors.list(v, "invalid")) {
            byte[] doc = Vectors.b64(cs.get("doc_b64"));
            assertThrows(CodecException.class, () -> Receipt.decode(doc),
                    () -> new String(doc, StandardCharsets.UTF_8) + " (python: " + cs.get("python_error") + ")");
        }
    }
}
