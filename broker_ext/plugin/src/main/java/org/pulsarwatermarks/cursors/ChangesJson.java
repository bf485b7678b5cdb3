package org.pulsarwatermarks.cursors;

import java.util.Map;

/**
 * The wire form of {@link Changes} (docs/PROTOCOL.md, "The broker plugin"): JSON with positions as
 * {@code [ledger, entry]} pairs, as the admin API's internal stats would give them; a topic's intake, when asked
 * for, inside its object ({@link IntakeJson}).
 */
public final class ChangesJson {
    private ChangesJson() {}

    public static String render(Changes changes) {
        StringBuilder out = new StringBuilder(256 + 160 * changes.topics().size());
        out.append("{\"epoch\":");
        string(out, changes.epoch());
        out.append(",\"seq\":").append(changes.seq());
        out.append(",\"full\":").append(changes.full());
        out.append(",\"topics\":{");
        boolean first = true;
        for (Map.Entry<String, TopicCursors> topic : changes.topics().entrySet()) {
            if (!first) {
                out.append(',');
            }
            first = false;
            string(out, topic.getKey());
            out.append(':');
            topic(out, topic.getValue(), changes.intake().get(topic.getKey()));
        }
        out.append("},\"gone\":[");
        for (int i = 0; i < changes.gone().size(); i++) {
            if (i > 0) {
                out.append(',');
            }
            string(out, changes.gone().get(i));
        }
        out.append("],\"new\":[");
        for (int i = 0; i < changes.fresh().size(); i++) {
            if (i > 0) {
                out.append(',');
            }
            string(out, changes.fresh().get(i));
        }
        return out.append("]}").toString();
    }

    private static void topic(StringBuilder out, TopicCursors cursors, TopicIntake.Batch intake) {
        out.append("{\"owner\":");
        stringOrNull(out, cursors.owner());
        out.append(",\"created\":").append(cursors.created());
        out.append(",\"incarnation\":");
        stringOrNull(out, cursors.incarnation());
        out.append(",\"lastConfirmed\":");
        position(out, cursors.lastConfirmed());
        out.append(",\"ledgers\":[");
        for (int i = 0; i < cursors.ledgers().size(); i++) {
            TopicCursors.Ledger ledger = cursors.ledgers().get(i);
            out.append(i > 0 ? "," : "").append('[').append(ledger.id()).append(',').append(ledger.entries()).append(']');
        }
        out.append("],\"cursors\":{");
        boolean first = true;
        for (Map.Entry<String, TopicCursors.Position> cursor : cursors.cursors().entrySet()) {
            if (!first) {
                out.append(',');
            }
            first = false;
            string(out, cursor.getKey());
            out.append(':');
            position(out, cursor.getValue());
        }
        out.append('}');
        if (intake != null) {
            out.append(",\"intake\":");
            IntakeJson.render(out, intake);
        }
        out.append('}');
    }

    private static void position(StringBuilder out, TopicCursors.Position position) {
        out.append('[').append(position.ledger()).append(',').append(position.entry()).append(']');
    }

    private static void stringOrNull(StringBuilder out, String text) {
        if (text == null) {
            out.append("null");
        } else {
            string(out, text);
        }
    }

    static void string(StringBuilder out, String text) {
        out.append('"');
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }
}
