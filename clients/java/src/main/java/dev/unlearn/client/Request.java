package dev.unlearn.client;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * One {@code unlearn.request/v1} envelope (docs/formats.md): {@link #encode()} validates it with
 * the featurizer's rules (a bad request fails at the source with the same reason code) and
 * writes the exact bytes the Python SDK writes for the same request, so its signature is the same.
 */
public final class Request {
    public static final String SCHEMA = "unlearn.request/v1";
    private static final long MAX_CLASS = 2147483647L;

    final String eventId;
    final String op;
    final String headId;
    final String clientId;
    final String subjectId;
    final String sampleId;
    final Long classLabel;
    final double[] vectorLabel;
    final Input input;
    final Double ts;

    private Request(String eventId, String op, String headId, String clientId, String subjectId, String sampleId,
                    Long classLabel, double[] vectorLabel, Input input, Double ts) {
        this.eventId = eventId;
        this.op = op;
        this.headId = headId;
        this.clientId = clientId;
        this.subjectId = subjectId;
        this.sampleId = sampleId;
        this.classLabel = classLabel;
        this.vectorLabel = vectorLabel;
        this.input = input;
        this.ts = ts;
    }

    /** An add with a class index label (0..2^31-1). {@code ts}: Unix seconds, or null. */
    public static Request add(String eventId, String headId, String clientId, String subjectId, String sampleId,
                              long label, Input input, Double ts) {
        return new Request(eventId, "add", headId, clientId, subjectId, sampleId, label, null, input, ts);
    }

    /** An add with a target-vector label. */
    public static Request add(String eventId, String headId, String clientId, String subjectId, String sampleId,
                              double[] label, Input input, Double ts) {
        return new Request(eventId, "add", headId, clientId, subjectId, sampleId, null, label.clone(), input, ts);
    }

    public static Request delete(String eventId, String headId, String clientId, String subjectId, String sampleId,
                                 Double ts) {
        return new Request(eventId, "delete", headId, clientId, subjectId, sampleId, null, null, null, ts);
    }

    public static Request deleteSubject(String eventId, String headId, String clientId, String subjectId, Double ts) {
        return new Request(eventId, "delete_subject", headId, clientId, subjectId, null, null, null, null, ts);
    }

    /** The same request with another input (what transit sealing does). */
    Request withInput(Input sealed) {
        return new Request(eventId, op, headId, clientId, subjectId, sampleId, classLabel, vectorLabel, sealed, ts);
    }

    public String eventId() { return eventId; }
    public String op() { return op; }
    public String headId() { return headId; }
    public String clientId() { return clientId; }
    public String subjectId() { return subjectId; }
    public String sampleId() { return sampleId; }

    /** Whether the input is sealed for transit. */
    public boolean isSealed() {
        return input instanceof Input.Sealed;
    }

    void validate() {
        id("event_id", eventId);
        id("head_id", headId);
        id("client_id", clientId);
        id("subject_id", subjectId);
        if (!"delete_subject".equals(op)) {
            id("sample_id", sampleId);
        }
        if ("add".equals(op)) {
            if (classLabel != null) {
                if (classLabel < 0 || classLabel > MAX_CLASS) {
                    throw new InvalidRequestException("bad_label", "a class label is an int in 0..2^31-1, got "
                            + classLabel);
                }
            } else {
                if (vectorLabel == null || vectorLabel.length == 0) {
                    throw new InvalidRequestException("bad_label", "a label vector must be non-empty");
                }
                for (double v : vectorLabel) {
                    if (!Double.isFinite(v)) {
                        throw new InvalidRequestException("non_finite_label", "a label value is NaN or infinite");
                    }
                }
            }
            if (input == null) {
                throw new InvalidRequestException("missing_field:input", "an add needs an input");
            }
            input.validate();
        }
        if (ts != null && !(Double.isFinite(ts) && ts >= 0)) {
            throw new InvalidRequestException("bad_ts", "ts must be a finite number >= 0, got " + ts);
        }
    }

    private static void id(String name, String v) {
        if (!Ids.isValid(v)) {
            throw new InvalidRequestException("bad_field:" + name, name + " must be 1..128 characters of "
                    + "[A-Za-z0-9._:@+-]");
        }
    }

    /** The JSON object, fields in the reference's order (only those the op takes). */
    Map<String, Object> toJson() {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("schema", SCHEMA);
        m.put("event_id", eventId);
        m.put("op", op);
        m.put("head_id", headId);
        m.put("client_id", clientId);
        m.put("subject_id", subjectId);
        if (sampleId != null) {
            m.put("sample_id", sampleId);
        }
        if ("add".equals(op)) {
            m.put("label", classLabel != null ? (Object) classLabel : vectorLabel);
            m.put("input", input.toJson());
        }
        if (ts != null) {
            m.put("ts", ts);
        }
        return m;
    }

    /** The record value for {@code <prefix>requests} (key it by the subject id); validates first. */
    public byte[] encode() {
        validate();
        return Json.toBytes(toJson());
    }
}
