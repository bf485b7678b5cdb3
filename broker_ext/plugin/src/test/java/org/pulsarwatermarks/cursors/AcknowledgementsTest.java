package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class AcknowledgementsTest {
    @Test
    void eachLineNamesATopicAndThePositionItsGeneratorCursorMovesToInOrder() {
        Map<String, TopicCursors.Position> wanted = Acknowledgements.parse(
                "persistent://t/ns/a 5 9\n\npersistent://t/ns/b-partition-2 12 0\r\n");
        assertEquals(List.of("persistent://t/ns/a", "persistent://t/ns/b-partition-2"), List.copyOf(wanted.keySet()));
        assertEquals(new TopicCursors.Position(5, 9), wanted.get("persistent://t/ns/a"));
        assertEquals(new TopicCursors.Position(12, 0), wanted.get("persistent://t/ns/b-partition-2"));
    }

    @Test
    void aLineThatIsNotATopicAndTwoNumbersIsRefusedWithItsNumber() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> Acknowledgements.parse("persistent://t/ns/a 5 9\npersistent://t/ns/b 5\n"));
        assertEquals("line 2: expected '<topic> <ledger> <entry>', got 'persistent://t/ns/b 5'", e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> Acknowledgements.parse("persistent://t/ns/a x 9"));
        assertThrows(IllegalArgumentException.class, () -> Acknowledgements.parse("t/ns/a 5 9")); // not persistent
        assertThrows(IllegalArgumentException.class, () -> Acknowledgements.parse("persistent://t/ns/a -2 9"));
    }

    @Test
    void theAnswerSaysPerTopicWhetherItMovedIsServedElsewhereOrFailed() {
        Map<String, String> outcomes = new LinkedHashMap<>();
        outcomes.put("persistent://t/ns/a", Acknowledgements.DONE);
        outcomes.put("persistent://t/ns/b", Acknowledgements.ELSEWHERE);
        outcomes.put("persistent://t/ns/c", "failed: the \"ledger\" is closed");
        assertEquals("{\"persistent://t/ns/a\":\"done\",\"persistent://t/ns/b\":\"elsewhere\","
                + "\"persistent://t/ns/c\":\"failed: the \\\"ledger\\\" is closed\"}", Acknowledgements.render(outcomes));
    }
}
