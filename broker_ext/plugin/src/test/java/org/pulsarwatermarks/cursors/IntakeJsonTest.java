package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.junit.jupiter.api.Test;

class IntakeJsonTest {
    @Test
    void rendersMarkersWithTheirPayloadInBase64AndStretchesPerProducer() {
        MarkerScanner.Marker marker = new MarkerScanner.Marker(5, 4, 2, 5, "p\"1", "W_SET",
                "\u0081\u00a1".getBytes(StandardCharsets.ISO_8859_1), 1_700_000_000_123L, true);
        TopicIntake.Batch batch = new TopicIntake.Batch(List.of(
                new TopicIntake.DataFound(new TopicCursors.Position(5, 1), new TopicCursors.Position(5, 3), -1,
                        new TreeMap<>(Map.of("a", new TopicIntake.Stretch(15, 200),
                                "b", new TopicIntake.Stretch(1, MarkerScanner.NO_EVENT_TIME))), 3),
                new TopicIntake.MarkerFound(marker, 4)),
                new TopicCursors.Position(5, 6), false);
        StringBuilder out = new StringBuilder();
        IntakeJson.render(out, batch);
        assertEquals("{\"found\":[{\"data\":[5,3,-1],\"producers\":{\"a\":[15,200],\"b\":[1,null]}},"
                + "{\"marker\":\"W_SET\",\"at\":[5,4,2],\"producer\":\"p\\\"1\",\"payload\":\"gaE=\","
                + "\"publishTime\":1700000000123,\"txn\":true}],\"scannedTo\":[5,6],\"overflowed\":false}",
                out.toString());
    }

    @Test
    void anOverflowedIntakeSaysSo() {
        StringBuilder out = new StringBuilder();
        IntakeJson.render(out, new TopicIntake.Batch(List.of(), new TopicCursors.Position(-1, -1), true));
        assertEquals("{\"found\":[],\"scannedTo\":[-1,-1],\"overflowed\":true}", out.toString());
    }
}
