package dev.unlearn.client;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The answer to a delete or delete_subject on {@code <prefix>receipts} (docs/formats.md,
 * "Receipt", {@code unlearn.receipt/v3}): {@code applied} (the first head version that excludes
 * the samples, and that version's retained-rows hash when known), {@code rejected} (a reason code)
 * or {@code tombstoned} (nothing was removed; the delete's tombstone refuses older adds: of every
 * client, or only of {@link #tombstoneClientId} when it is not null).
 * {@link #decode} accepts exactly what the reference's {@code decode_receipt} accepts.
 */
public final class Receipt {
    private static final String SCHEMA = "unlearn.receipt/v3";
    private static final Set<String> ALLOWED = Set.of("schema", "event_id", "subject_id", "head_id", "sample_ids",
            "status", "reason", "head_version", "digest", "ts", "retained_hash", "tombstone_ts", "tombstone_expires",
            "tombstone_client_id");
    private static final BigInteger U64 = BigInteger.ONE.shiftLeft(64);

    private final String eventId;
    private final String subjectId;
    private final String headId;
    private final List<String> sampleIds;
    private final String status;
    private final double ts;
    private final Long headVersion;
    private final String digest;
    private final String reason;
    private final String retainedHash;
    private final Double tombstoneTs;
    private final Double tombstoneExpires;
    private final String tombstoneClientId;

    private Receipt(String eventId, String subjectId, String headId, List<String> sampleIds, String status, double ts,
                    Long headVersion, String digest, String reason, String retainedHash, Double tombstoneTs,
                    Double tombstoneExpires, String tombstoneClientId) {
        this.eventId = eventId;
        this.subjectId = subjectId;
        this.headId = headId;
        this.sampleIds = sampleIds;
        this.status = status;
        this.ts = ts;
        this.headVersion = headVersion;
        this.digest = digest;
        this.reason = reason;
        this.retainedHash = retainedHash;
        this.tombstoneTs = tombstoneTs;
        this.tombstoneExpires = tombstoneExpires;
        this.tombstoneClientId = tombstoneClientId;
    }

    public String eventId() { return eventId; }
    public String subjectId() { return subjectId; }
    public String headId() { return headId; }
    public List<String> sampleIds() { return sampleIds; }
    /** "applied", "rejected" or "tombstoned". */
    public String status() { return status; }
    public boolean applied() { return "applied".equals(status); }
    public double ts() { return ts; }
    /** Applied: the first head version that excludes the samples (unsigned 64-bit); else null. */
    public Long headVersion() { return headVersion; }
    public String digest() { return digest; }
    public String reason() { return reason; }
    public String retainedHash() { return retainedHash; }
    public Double tombstoneTs() { return tombstoneTs; }
    public Double tombstoneExpires() { return tombstoneExpires; }
    /** Tombstoned: the only client whose adds the tombstone refuses; null: every client's. */
    public String tombstoneClientId() { return tombstoneClientId; }

    @Override
    public String toString() {
        return "Receipt{" + eventId + " " + status + (headVersion != null ? " head_version "
                + Long.toUnsignedString(headVersion) : "") + (reason != null ? " reason " + reason : "")
                + " samples " + sampleIds + "}";
    }

    private static CodecException fail(String msg) {
        return new CodecException("receipt: " + msg);
    }

    /** Parse and validate a receipt record value; {@link CodecException} on anything wrong. */
    public static Receipt decode(byte[] value) {
        Object doc;
        try {
            doc = Json.parse(value);
        } catch (Json.JsonException e) {
            throw fail("not JSON: " + e.getMessage());
        }
        if (!(doc instanceof Map)) {
            throw fail("not a JSON object");
        }
        Map<?, ?> d = (Map<?, ?>) doc;
        Object schema = d.get("schema");
        if (!SCHEMA.equals(schema)) {
            throw fail("unknown schema " + schema);
        }
        for (Object k : d.keySet()) {
            if (!ALLOWED.contains(k)) {
                throw fail("unknown field " + k);
            }
        }
        for (String k : new String[] {"event_id", "subject_id", "head_id", "sample_ids", "status", "ts"}) {
            if (!d.containsKey(k)) {
                throw fail("missing field '" + k + "'");
            }
        }
        for (String k : new String[] {"event_id", "subject_id", "head_id"}) {
            if (!(d.get(k) instanceof String) || !Ids.isValid((String) d.get(k))) {
                throw fail(k + " must be 1..128 characters of [A-Za-z0-9._:@+-]");
            }
        }
        Object samples = d.get("sample_ids");
        List<String> ids = new ArrayList<>();
        if (!(samples instanceof List)) {
            throw fail("sample_ids must be a list of ids");
        }
        for (Object s : (List<?>) samples) {
            if (!(s instanceof String) || !Ids.isValid((String) s)) {
                throw fail("sample_ids must be a list of ids");
            }
            ids.add((String) s);
        }
        double ts = nonNegative(d.get("ts"), "ts");
        Object status = d.get("status");
        if (!"tombstoned".equals(status) && (d.containsKey("tombstone_ts") || d.containsKey("tombstone_expires")
                || d.containsKey("tombstone_client_id"))) {
            throw fail("only a tombstoned receipt has tombstone_ts, tombstone_expires, tombstone_client_id");
        }
        Long version = null;
        String digest = null;
        String reason = null;
        String retained = null;
        Double tombTs = null;
        Double tombExpires = null;
        String tombClient = null;
        if ("applied".equals(status)) {
            if (!d.containsKey("head_version")) {
                throw fail("an applied receipt needs head_version");
            }
            if (d.containsKey("reason")) {
                throw fail("an applied receipt has no reason");
            }
            version = u64(d.get("head_version"));
            if (d.containsKey("digest")) {
                digest = hex64(d.get("digest"), "digest");
            }
            if (d.containsKey("retained_hash")) {
                retained = hex64(d.get("retained_hash"), "retained_hash");
            }
        } else if ("rejected".equals(status)) {
            if (d.containsKey("head_version") || d.containsKey("digest") || d.containsKey("retained_hash")) {
                throw fail("a rejected receipt has no head_version, digest or retained_hash");
            }
            Object r = d.get("reason");
            if (!(r instanceof String) || ((String) r).isEmpty()) {
                throw fail("a rejected receipt needs a non-empty reason");
            }
            reason = (String) r;
        } else if ("tombstoned".equals(status)) {
            for (String k : new String[] {"head_version", "digest", "retained_hash", "reason"}) {
                if (d.containsKey(k)) {
                    throw fail("a tombstoned receipt has no head_version, digest, retained_hash or reason");
                }
            }
            if (!d.containsKey("tombstone_ts")) {
                throw fail("a tombstoned receipt needs tombstone_ts");
            }
            tombTs = nonNegative(d.get("tombstone_ts"), "tombstone_ts");
            if (d.containsKey("tombstone_expires")) {
                tombExpires = nonNegative(d.get("tombstone_expires"), "tombstone_expires");
            }
            if (d.containsKey("tombstone_client_id")) {
                Object c = d.get("tombstone_client_id");
                if (!(c instanceof String) || !Ids.isValid((String) c)) {
                    throw fail("tombstone_client_id must be 1..128 characters of [A-Za-z0-9._:@+-]");
                }
                tombClient = (String) c;
            }
        } else {
            throw fail("status must be applied | rejected | tombstoned, got " + status);
        }
        return new Receipt((String) d.get("event_id"), (String) d.get("subject_id"), (String) d.get("head_id"),
                Collections.unmodifiableList(ids), (String) status, ts, version, digest, reason, retained, tombTs,
                tombExpires, tombClient);
    }

    private static double nonNegative(Object v, String name) {
        if (!(v instanceof Long || v instanceof BigInteger || v instanceof Double)) {
            throw fail(name + " must be a finite number >= 0");
        }
        double x = ((Number) v).doubleValue();
        if (!(x >= 0 && Double.isFinite(x))) {
            throw fail(name + " must be a finite number >= 0");
        }
        return x;
    }

    private static long u64(Object v) {
        BigInteger b;
        if (v instanceof Long) {
            b = BigInteger.valueOf((Long) v);
        } else if (v instanceof BigInteger) {
            b = (BigInteger) v;
        } else if (v instanceof Double && Double.isFinite((Double) v) && (Double) v == Math.rint((Double) v)) {
            b = new java.math.BigDecimal((Double) v).toBigInteger();
        } else {
            throw fail("head_version must be an int in 0..2^64-1");
        }
        if (b.signum() < 0 || b.compareTo(U64) >= 0) {
            throw fail("head_version must be an int in 0..2^64-1");
        }
        return b.longValue();
    }

    private static String hex64(Object v, String name) {
        if (!(v instanceof String) || !Hex.isHex64((String) v)) {
            throw fail(name + " must be 64 lowercase hex characters");
        }
        return (String) v;
    }
}
