package org.pulsarwatermarks.cursors;

import java.util.Map;

/**
 * {@code POST /watermark-cursors/acknowledge}: the generator moves its {@code __wm_generator} cursor inside the
 * broker, with no consumer of its own (issue 47). The body has a line per topic, {@code <topic> <ledger> <entry>},
 * the position its cursor moves to (all up to it acknowledged); the answer says per topic {@code "done"},
 * {@code "elsewhere"} (another broker serves it) or {@code "failed: ..."}. Plain: JUnit tests it.
 */
public final class Acknowledgements {
    public static final String DONE = "done";
    public static final String ELSEWHERE = "elsewhere";

    private Acknowledgements() {}

    /** The positions the body asks for, per topic, in its order; a malformed line is refused with its number. */
    public static Map<String, TopicCursors.Position> parse(String body) {
        return TopicLines.parse(body, "<topic> <ledger> <entry>", 2, fields -> {
            long ledger = Long.parseLong(fields[0]);
            long entry = Long.parseLong(fields[1]);
            return ledger < 0 || entry < -1 ? null : new TopicCursors.Position(ledger, entry);
        });
    }

    /** The answer: a JSON object of each topic's outcome. */
    public static String render(Map<String, String> outcomes) {
        StringBuilder out = new StringBuilder(64 * outcomes.size() + 2).append('{');
        String comma = "";
        for (Map.Entry<String, String> outcome : outcomes.entrySet()) {
            out.append(comma);
            ChangesJson.string(out, outcome.getKey());
            out.append(':');
            ChangesJson.string(out, outcome.getValue());
            comma = ",";
        }
        return out.append('}').toString();
    }
}
