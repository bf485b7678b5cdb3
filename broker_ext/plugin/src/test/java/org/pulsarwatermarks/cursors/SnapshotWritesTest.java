package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.netty.buffer.ByteBuf;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.protocol.Commands;
import org.junit.jupiter.api.Test;

class SnapshotWritesTest {
    private static final byte[] PAYLOAD = "a snapshot's bytes".getBytes(StandardCharsets.UTF_8);

    @Test
    void eachLineNamesATopicTheProducerNameAndThePayloadInBase64InOrder() {
        String encoded = Base64.getEncoder().encodeToString(PAYLOAD);
        Map<String, SnapshotWrites.Wanted> wanted = SnapshotWrites.parse(
                "persistent://t/ns/a __wm_snapshot-g1 " + encoded + "\n\npersistent://t/ns/b-partition-2 p2 AAE=\r\n");
        assertEquals(List.of("persistent://t/ns/a", "persistent://t/ns/b-partition-2"), List.copyOf(wanted.keySet()));
        assertEquals("__wm_snapshot-g1", wanted.get("persistent://t/ns/a").producer());
        assertArrayEquals(PAYLOAD, wanted.get("persistent://t/ns/a").payload());
        assertArrayEquals(new byte[] {0, 1}, wanted.get("persistent://t/ns/b-partition-2").payload());
    }

    @Test
    void aLineWithoutAProducerOrWithAPayloadThatIsNotBase64IsRefusedWithItsNumber() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> SnapshotWrites.parse("persistent://t/ns/a p AAE=\npersistent://t/ns/b AAE=\n"));
        assertEquals("line 2: expected '<topic> <producer> <base64 payload>', got 'persistent://t/ns/b AAE='",
                e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> SnapshotWrites.parse("persistent://t/ns/a p not*base64"));
    }

    @Test
    void theEntryIsAMessageAsAProducerWritesIt() {
        ByteBuf entry = SnapshotWrites.entry(new SnapshotWrites.Wanted("__wm_snapshot-g1", PAYLOAD), 42, 1_700_000_000_500L);
        try {
            MessageMetadata metadata = Commands.parseMessageMetadata(entry);
            assertEquals("__wm_snapshot-g1", metadata.getProducerName());
            assertEquals(42, metadata.getSequenceId());
            assertEquals(1_700_000_000_500L, metadata.getPublishTime());
            assertEquals(1, metadata.getPropertiesCount());
            assertEquals(MarkerScanner.MARKER_PROPERTY, metadata.getPropertyAt(0).getKey());
            assertEquals("W_SNAPSHOT", metadata.getPropertyAt(0).getValue());
            byte[] payload = new byte[entry.readableBytes()];
            entry.readBytes(payload);
            assertArrayEquals(PAYLOAD, payload);
        } finally {
            entry.release();
        }
    }

    @Test
    void theIntakeFindsTheRecordItWroteAsASnapshotMarker() {
        ByteBuf entry = SnapshotWrites.entry(new SnapshotWrites.Wanted("__wm_snapshot-g1", PAYLOAD), 1, 2);
        try {
            MarkerScannerTest.Found found = MarkerScannerTest.scan(entry, MarkerScanner.Outcome.MARKERS);
            assertEquals(1, found.markers.size());
            assertEquals("W_SNAPSHOT#-1/0 a snapshot's bytes", MarkerScannerTest.text(found.markers.get(0)));
            assertEquals("__wm_snapshot-g1", found.markers.get(0).producer());
        } finally {
            entry.release();
        }
    }

    @Test
    void aWrittenRecordIsAnsweredWithItsPosition() {
        assertEquals("written 5 9", SnapshotWrites.written(5, 9));
    }
}
