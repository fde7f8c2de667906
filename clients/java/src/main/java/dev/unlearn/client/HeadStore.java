package dev.unlearn.client;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * head id -> current {@link ServedHead}, kept by the {@link HeadUpdate#supersedes} rule exactly as
 * serving's {@code HeadStore}: an update that does not supersede the served one is stale. Readers
 * take one reference ({@link #get}) and never lock; writers swap it in one assignment.
 */
public final class HeadStore {
    private final Map<String, ServedHead> heads = new ConcurrentHashMap<>();

    /** Serve {@code update} if it supersedes the current head: true ("accepted") or false ("stale"). */
    public synchronized boolean offer(HeadUpdate update) {
        ServedHead cur = heads.get(update.headId());
        if (cur != null && !update.supersedes(cur.update())) {
            return false;
        }
        heads.put(update.headId(), ServedHead.next(cur, update));
        return true;
    }

    /** The current served state of {@code headId}, or null. */
    public ServedHead get(String headId) {
        return heads.get(headId);
    }

    /** A snapshot copy of every served head. */
    public Map<String, ServedHead> all() {
        return Map.copyOf(heads);
    }
}
