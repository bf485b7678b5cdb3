package org.pulsarwatermarks.cursors;

import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The generator's POST bodies ({@link Acknowledgements}, {@link Follows}): a line per topic, {@code <topic> <fields>},
 * blank lines skipped, read per topic in the body's order; a malformed line is refused with its number. Plain.
 */
final class TopicLines {
    /** A line's fields after the topic, read; null (or a {@link NumberFormatException}) when malformed. */
    interface Fields<T> {
        T read(String[] fields);
    }

    private TopicLines() {}

    static <T> Map<String, T> parse(String body, String expected, int fields, Fields<T> reader) {
        Map<String, T> wanted = new LinkedHashMap<>();
        String[] lines = body.split("\n", -1);
        for (int i = 0; i < lines.length; i++) {
            String line = lines[i].strip();
            if (line.isEmpty()) {
                continue;
            }
            String[] parts = line.split("\\s+");
            T value = null;
            if (parts.length == 1 + fields && Namespaces.namespaceOf(parts[0]) != null) {
                try {
                    value = reader.read(Arrays.copyOfRange(parts, 1, parts.length));
                } catch (NumberFormatException e) {
                    value = null;
                }
            }
            if (value == null) {
                throw new IllegalArgumentException("line " + (i + 1) + ": expected '" + expected + "', got '" + line
                        + "'");
            }
            wanted.put(parts[0], value);
        }
        return wanted;
    }
}
