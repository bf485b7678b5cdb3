package org.pulsarwatermarks.cursors;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;

/**
 * {@code POST /watermark-cursors/follow}: a generator starts following topics (issue 47's take-over, batched). Per
 * topic the plugin makes the {@code __wm_generator} subscription where it is missing (durable, from the earliest
 * entry) and sets the topic property {@code wm.incarnation} to the token given where it is unset. The body has a
 * line per topic, {@code <topic> <token>}; the answer names, per topic, the token in place, or that another broker
 * serves it, or the failure. Plain: JUnit tests it.
 */
public final class Follows {
    /** The topic property naming the topic's incarnation (docs/PROTOCOL.md section 9): kept in its managed ledger. */
    public static final String INCARNATION_PROPERTY = "wm.incarnation";
    private static final Pattern TOKEN = Pattern.compile("[0-9a-f]{16}");

    private Follows() {}

    /** The token offered per topic, in the body's order; a malformed line is refused with its number. */
    public static Map<String, String> parse(String body) {
        Map<String, String> wanted = new LinkedHashMap<>();
        String[] lines = body.split("\n", -1);
        for (int i = 0; i < lines.length; i++) {
            String line = lines[i].strip();
            if (line.isEmpty()) {
                continue;
            }
            String[] parts = line.split("\\s+");
            if (parts.length != 2 || Namespaces.namespaceOf(parts[0]) == null || !TOKEN.matcher(parts[1]).matches()) {
                throw new IllegalArgumentException("line " + (i + 1)
                        + ": expected '<topic> <token of 16 hex digits>', got '" + line + "'");
            }
            wanted.put(parts[0], parts[1]);
        }
        return wanted;
    }

    /** The answer: {@code {"incarnations": {topic: token in place}, "elsewhere": [topic], "failed": {topic: why}}}. */
    public static String render(Map<String, String> incarnations, List<String> elsewhere, Map<String, String> failed) {
        StringBuilder out = new StringBuilder(64 * (incarnations.size() + elsewhere.size() + failed.size()) + 64);
        out.append("{\"incarnations\":");
        object(out, incarnations);
        out.append(",\"elsewhere\":[");
        String comma = "";
        for (String topic : elsewhere) {
            out.append(comma);
            ChangesJson.string(out, topic);
            comma = ",";
        }
        out.append("],\"failed\":");
        object(out, failed);
        return out.append('}').toString();
    }

    private static void object(StringBuilder out, Map<String, String> values) {
        out.append('{');
        String comma = "";
        for (Map.Entry<String, String> value : values.entrySet()) {
            out.append(comma);
            ChangesJson.string(out, value.getKey());
            out.append(':');
            ChangesJson.string(out, value.getValue());
            comma = ",";
        }
        out.append('}');
    }
}
