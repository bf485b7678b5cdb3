package org.pulsarwatermarks.cursors;

import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;

/**
 * Which cursors an admin call may have moved, from its method and path alone. Pure.
 *
 * <p>A reset, skip, expiry, unsubscribe, unload or deletion of one topic names that topic (a
 * partitioned topic's call reaches each partition as a call of its own); a namespace-wide call, or
 * one in the older path style, may move any topic. Reads move nothing. Naming the topic instead of
 * sweeping every topic keeps the generator's own writes (a compaction or a property per topic) from
 * costing a sweep each.
 */
final class AdminRequests {
    private static final String TOPIC_PATH = "/admin/v2/persistent/";

    private AdminRequests() {}

    /** What a call may have moved: one topic, or any ({@link #EVERY_TOPIC}, whose {@code topic} is null). */
    record Touched(String topic) {
        static final Touched EVERY_TOPIC = new Touched(null);
    }

    /** What the call may have moved, or null for nothing. */
    static Touched touched(String method, String path) {
        if (path == null || "GET".equals(method) || !path.startsWith("/admin/")
                || path.startsWith("/admin/v2/non-persistent/")) {
            return null;
        }
        if (!path.startsWith(TOPIC_PATH)) {
            return Touched.EVERY_TOPIC;
        }
        String[] parts = path.substring(TOPIC_PATH.length()).split("/", 4); // tenant, namespace, topic, action
        if (parts.length < 3 || parts[2].isEmpty()) {
            return Touched.EVERY_TOPIC;
        }
        return new Touched("persistent://" + decode(parts[0]) + "/" + decode(parts[1]) + "/" + decode(parts[2]));
    }

    private static String decode(String part) {
        return URLDecoder.decode(part, StandardCharsets.UTF_8);
    }
}
