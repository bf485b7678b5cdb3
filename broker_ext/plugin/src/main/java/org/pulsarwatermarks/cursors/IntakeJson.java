package org.pulsarwatermarks.cursors;

import java.util.Base64;
import java.util.Map;

/**
 * The wire form of one topic's {@link TopicIntake.Batch} in the long poll's answer: markers with their payload in
 * base64, data stretches per producer as {@code [messages, lowest event time or null]}, positions as
 * {@code [ledger, entry, batch index]} ({@code broker_ext/intake/plugin_stream.py} reads it).
 */
public final class IntakeJson {
    private IntakeJson() {}

    public static void render(StringBuilder out, TopicIntake.Batch batch) {
        out.append("{\"found\":[");
        boolean first = true;
        for (TopicIntake.Found found : batch.found()) {
            out.append(first ? "" : ",");
            first = false;
            if (found instanceof TopicIntake.MarkerFound m) {
                marker(out, m.marker());
            } else {
                data(out, (TopicIntake.DataFound) found);
            }
        }
        out.append("],\"scannedTo\":[").append(batch.scannedTo().ledger()).append(',')
                .append(batch.scannedTo().entry()).append("],\"overflowed\":").append(batch.overflowed()).append('}');
    }

    private static void marker(StringBuilder out, MarkerScanner.Marker marker) {
        out.append("{\"marker\":");
        ChangesJson.string(out, marker.kind());
        out.append(",\"at\":[").append(marker.ledgerId()).append(',').append(marker.entryId()).append(',')
                .append(marker.batchIndex()).append("],\"producer\":");
        ChangesJson.string(out, marker.producer());
        out.append(",\"payload\":\"").append(Base64.getEncoder().encodeToString(marker.payload()))
                .append("\",\"publishTime\":").append(marker.publishTime())
                .append(",\"txn\":").append(marker.transactional()).append('}');
    }

    private static void data(StringBuilder out, TopicIntake.DataFound data) {
        out.append("{\"data\":[").append(data.last().ledger()).append(',').append(data.last().entry()).append(',')
                .append(data.lastBatchIndex()).append("],\"producers\":{");
        boolean first = true;
        for (Map.Entry<String, TopicIntake.Stretch> producer : data.producers().entrySet()) {
            out.append(first ? "" : ",");
            first = false;
            ChangesJson.string(out, producer.getKey());
            TopicIntake.Stretch stretch = producer.getValue();
            out.append(":[").append(stretch.messages()).append(',');
            if (stretch.lowestEventTime() == MarkerScanner.NO_EVENT_TIME) {
                out.append("null");
            } else {
                out.append(stretch.lowestEventTime());
            }
            out.append(']');
        }
        out.append("}}");
    }
}
