package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class ChangesJsonTest {
    @Test
    void rendersPositionsAsTheAdminApiDoes() {
        Changes changes = new Changes("e1", 7, false,
                Map.of("persistent://public/default/t", CursorReportTest.cursors(9)), List.of("persistent://public/default/gone"), List.of("persistent://public/default/fresh"));
        assertEquals("{\"epoch\":\"e1\",\"seq\":7,\"full\":false,\"topics\":{\"persistent://public/default/t\":"
                + "{\"owner\":\"gen-1\",\"created\":1700000000000,\"incarnation\":\"0123456789abcdef\",\"lastConfirmed\":[5,20],\"ledgers\":[[5,0]],"
                + "\"cursors\":{\"__wm_generator\":[5,1],\"app\":[5,9]}}},"
                + "\"gone\":[\"persistent://public/default/gone\"],\"new\":[\"persistent://public/default/fresh\"]}",
                ChangesJson.render(changes));
    }

    @Test
    void escapesNamesAndWritesAMissingOwnerAndIncarnationAsNull() {
        TopicCursors noOwner = new TopicCursors(new java.util.TreeMap<>(Map.of("a\"b\\c\n", new TopicCursors.Position(-1, -1))),
                null, new TopicCursors.Position(3, -1), List.of(), 0, null);
        String json = ChangesJson.render(new Changes("e", 1, true, Map.of("t", noOwner), List.of(), List.of()));
        assertEquals("{\"epoch\":\"e\",\"seq\":1,\"full\":true,\"topics\":{\"t\":{\"owner\":null,\"created\":0,\"incarnation\":null,\"lastConfirmed\":[3,-1],"
                + "\"ledgers\":[],\"cursors\":{\"a\\\"b\\\\c\\n\":[-1,-1]}}},\"gone\":[],\"new\":[]}", json);
    }

    @Test
    void aTopicsIntakeRidesInItsObject() {
        TopicIntake.Batch batch = new TopicIntake.Batch(List.of(), new TopicCursors.Position(5, 20), false);
        Changes changes = new Changes("e1", 7, false, Map.of("t", CursorReportTest.cursors(9)), List.of(), List.of(),
                Map.of("t", batch));
        assertEquals("{\"epoch\":\"e1\",\"seq\":7,\"full\":false,\"topics\":{\"t\":"
                + "{\"owner\":\"gen-1\",\"created\":1700000000000,\"incarnation\":\"0123456789abcdef\",\"lastConfirmed\":[5,20],\"ledgers\":[[5,0]],"
                + "\"cursors\":{\"__wm_generator\":[5,1],\"app\":[5,9]},"
                + "\"intake\":{\"found\":[],\"scannedTo\":[5,20],\"overflowed\":false}}},"
                + "\"gone\":[],\"new\":[]}", ChangesJson.render(changes));
    }
}
