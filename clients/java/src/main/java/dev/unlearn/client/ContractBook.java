package dev.unlearn.client;

import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Every head contract version read from the head registry, per head: what
 * {@code common/registry.contract_at} gives serving. The contract of a head update is the
 * version it names when known, else the head's latest (versions differ only in their label space).
 */
public final class ContractBook {
    private final Map<String, TreeMap<Long, HeadContract>> byHead = new ConcurrentHashMap<>();

    /** Keep one contract version (a later record of the same version replaces it). */
    public synchronized void put(HeadContract c) {
        byHead.computeIfAbsent(c.headId(), k -> new TreeMap<>()).put(c.version(), c);
    }

    /** The contract {@code update} was built under, else the head's latest; null when none is known. */
    public synchronized HeadContract contractFor(HeadUpdate update) {
        TreeMap<Long, HeadContract> versions = byHead.get(update.headId());
        if (versions == null || versions.isEmpty()) {
            return null;
        }
        Long want = update.contractVersion();
        HeadContract exact = want == null ? null : versions.get(want);
        return exact != null ? exact : versions.lastEntry().getValue();
    }
}
