package org.pulsarwatermarks.cursors;

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
        return TopicLines.parse(body, "<topic> <token of 16 hex digits>", 1,
                fields -> TOKEN.matcher(fields[0]).matches() ? fields[0] : null);
    }

    /** The answer: {@code {"incarnations": {topic: token in place}, "elsewhere": [topic], "failed": {topic: why}}}. */
    public static String render(Map<String, String> incarnations, List<String> elsewhere, Map<String, String> failed) {
        StringBuilder out = new StringBuilder(64 * (incarnations.size() + elsewhere.size() + failed.size()) + 64);
        out.append("{\"incarnations\":");
        out.append(Acknowledgements.render(incarnations)); // a JSON object of strings, as that answer is
        out.append(",\"elsewhere\":[");
        String comma = "";
        for (String topic : elsewhere) {
            out.append(comma);
            ChangesJson.string(out, topic);
            comma = ",";
        }
        out.append("],\"failed\":");
        out.append(Acknowledgements.render(failed));
        return out.append('}').toString();
    }
}
