package org.pulsarwatermarks.cursors;

import java.util.LinkedHashMap;
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
        Map<String, TopicCursors.Position> wanted = new LinkedHashMap<>();
        String[] lines = body.split("\n", -1);
        for (int i = 0; i < lines.length; i++) {
            String line = lines[i].strip();
            if (line.isEmpty()) {
                continue;
            }
            String[] parts = line.split("\\s+");
            try {
                if (parts.length != 3 || Namespaces.namespaceOf(parts[0]) == null) {
                    throw new NumberFormatException();
                }
                long ledger = Long.parseLong(parts[1]);
                long entry = Long.parseLong(parts[2]);
                if (ledger < 0 || entry < -1) {
                    throw new NumberFormatException();
                }
                wanted.put(parts[0], new TopicCursors.Position(ledger, entry));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException(
                        "line " + (i + 1) + ": expected '<topic> <ledger> <entry>', got '" + line + "'");
            }
        }
        return wanted;
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
