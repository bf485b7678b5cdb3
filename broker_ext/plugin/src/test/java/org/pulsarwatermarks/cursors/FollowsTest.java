package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class FollowsTest {
    @Test
    void eachLineNamesATopicAndTheTokenOfferedForItInOrder() {
        Map<String, String> wanted = Follows.parse(
                "persistent://t/ns/b-partition-2 00112233445566ff\n\npersistent://t/ns/a 0123456789abcdef\r\n");
        assertEquals(List.of("persistent://t/ns/b-partition-2", "persistent://t/ns/a"), List.copyOf(wanted.keySet()));
        assertEquals("0123456789abcdef", wanted.get("persistent://t/ns/a"));
    }

    @Test
    void aLineThatIsNotATopicAndATokenIsRefusedWithItsNumber() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> Follows.parse("persistent://t/ns/a 0123456789abcdef\npersistent://t/ns/b\n"));
        assertEquals("line 2: expected '<topic> <token of 16 hex digits>', got 'persistent://t/ns/b'", e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> Follows.parse("persistent://t/ns/a 0123"));
        assertThrows(IllegalArgumentException.class, () -> Follows.parse("persistent://t/ns/a 0123456789ABCDEF"));
        assertThrows(IllegalArgumentException.class, () -> Follows.parse("t/ns/a 0123456789abcdef"));
    }

    @Test
    void theAnswerNamesTheTokenInPlaceTheTopicsServedElsewhereAndTheFailures() {
        Map<String, String> incarnations = new LinkedHashMap<>();
        incarnations.put("persistent://t/ns/a", "0123456789abcdef");
        assertEquals("{\"incarnations\":{\"persistent://t/ns/a\":\"0123456789abcdef\"},"
                + "\"elsewhere\":[\"persistent://t/ns/b\"],\"failed\":{\"persistent://t/ns/c\":\"the \\\"ledger\\\" is closed\"}}",
                Follows.render(incarnations, List.of("persistent://t/ns/b"),
                        Map.of("persistent://t/ns/c", "the \"ledger\" is closed")));
    }
}
