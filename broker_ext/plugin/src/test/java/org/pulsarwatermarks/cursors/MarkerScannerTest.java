package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import org.apache.pulsar.common.api.proto.CompressionType;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.api.proto.SingleMessageMetadata;
import org.apache.pulsar.common.compression.CompressionCodecProvider;
import org.apache.pulsar.common.intercept.AppendBrokerTimestampMetadataInterceptor;
import org.apache.pulsar.common.intercept.BrokerEntryMetadataInterceptor;
import org.apache.pulsar.common.protocol.Commands;
import org.junit.jupiter.api.Test;

class MarkerScannerTest {
    /** One message of an entry as a producer sends it: a marker (kind set) or data (event time, 0: none). */
    record Message(String kind, String payload, long eventTime) {
        static Message marker(String kind, String payload) {
            return new Message(kind, payload, 0);
        }

        static Message data(long eventTime) {
            return new Message(null, "data", eventTime);
        }
    }

    /** What the scanner reported, and in which order. */
    static class Found implements MarkerScanner.Sink {
        final List<MarkerScanner.Marker> markers = new ArrayList<>();
        final List<String> data = new ArrayList<>();
        final List<String> order = new ArrayList<>();

        @Override
        public void marker(MarkerScanner.Marker marker) {
            markers.add(marker);
            order.add(marker.kind());
        }

        @Override
        public void data(String producer, long ledgerId, long entryId, int lastBatchIndex, int messages,
                long lowestEventTime) {
            String text = producer + "@" + ledgerId + ":" + entryId + ":" + lastBatchIndex + " x" + messages + " >="
                    + lowestEventTime;
            data.add(text);
            order.add("data");
        }
    }

    static ByteBuf plain(Message message) {
        MessageMetadata metadata = metadata();
        if (message.kind() != null) {
            metadata.addProperty().setKey(MarkerScanner.MARKER_PROPERTY).setValue(message.kind());
        } else if (message.eventTime() > 0) {
            metadata.setEventTime(message.eventTime());
        }
        metadata.addProperty().setKey("other").setValue("x");
        return Commands.serializeMetadataAndPayload(Commands.ChecksumType.Crc32c, metadata, bytes(message.payload()));
    }

    /** A batch as Pulsar's client builds it: every message's metadata and payload, then the whole compressed. */
    static ByteBuf batch(CompressionType compression, Message... messages) {
        ByteBuf batch = Unpooled.buffer();
        for (Message message : messages) {
            SingleMessageMetadata single = new SingleMessageMetadata();
            ByteBuf payload = bytes(message.payload());
            single.setPayloadSize(payload.readableBytes());
            if (message.kind() != null) {
                single.addProperty().setKey(MarkerScanner.MARKER_PROPERTY).setValue(message.kind());
            } else if (message.eventTime() > 0) {
                single.setEventTime(message.eventTime());
            }
            batch = Commands.serializeSingleMessageInBatchWithPayload(single, payload, batch);
        }
        MessageMetadata metadata = metadata().setNumMessagesInBatch(messages.length);
        int uncompressed = batch.readableBytes();
        ByteBuf body = batch;
        if (compression != CompressionType.NONE) {
            body = CompressionCodecProvider.getCompressionCodec(compression).encode(batch);
            metadata.setCompression(compression).setUncompressedSize(uncompressed);
        }
        return Commands.serializeMetadataAndPayload(Commands.ChecksumType.Crc32c, metadata, body);
    }

    static MessageMetadata metadata() {
        return new MessageMetadata().setProducerName("p1").setSequenceId(7).setPublishTime(1_700_000_000_123L);
    }

    static ByteBuf bytes(String text) {
        return Unpooled.wrappedBuffer(text.getBytes(StandardCharsets.UTF_8));
    }

    static Found scan(ByteBuf entry, MarkerScanner.Outcome expected) {
        Found found = new Found();
        int readerIndex = entry.readerIndex();
        assertEquals(expected, new MarkerScanner().scan(entry, 5, 9, found));
        assertEquals(readerIndex, entry.readerIndex()); // the broker's buffer is left as it was
        return found;
    }

    static String text(MarkerScanner.Marker marker) {
        return marker.kind() + "#" + marker.batchIndex() + "/" + marker.batchSize() + " "
                + new String(marker.payload(), StandardCharsets.UTF_8);
    }

    @Test
    void aMarkerSentAloneIsFoundWithItsPayloadProducerAndPublishTime() {
        Found found = scan(plain(Message.marker("W_SET", "set-payload")), MarkerScanner.Outcome.MARKERS);
        assertEquals(1, found.markers.size());
        MarkerScanner.Marker marker = found.markers.get(0);
        assertEquals("W_SET#-1/0 set-payload", text(marker));
        assertEquals("p1", marker.producer());
        assertEquals(1_700_000_000_123L, marker.publishTime());
        assertEquals(5, marker.ledgerId());
        assertEquals(9, marker.entryId());
        assertFalse(marker.transactional());
        assertEquals(List.of(), found.data);
    }

    @Test
    void aMarkerSentInAPulsarTransactionSaysSo() {
        MessageMetadata metadata = metadata().setTxnidMostBits(1).setTxnidLeastBits(2);
        metadata.addProperty().setKey(MarkerScanner.MARKER_PROPERTY).setValue("W_SET");
        ByteBuf entry = Commands.serializeMetadataAndPayload(Commands.ChecksumType.Crc32c, metadata, bytes("s"));
        assertTrue(scan(entry, MarkerScanner.Outcome.MARKERS).markers.get(0).transactional());
    }

    @Test
    void anEntryOfAnAbortedPulsarTransactionIsPassedOverWithNothingFound() {
        // consumers never see it, so the generator must not fold it: the sink says which transactions aborted
        List<String> asked = new ArrayList<>();
        Found found = new Found() {
            @Override
            public boolean aborted(long txnMostBits, long txnLeastBits, long ledgerId, long entryId) {
                asked.add(txnMostBits + ":" + txnLeastBits + "@" + ledgerId + ":" + entryId);
                return txnLeastBits == 2;
            }
        };
        for (long least : new long[] {2, 3}) {
            ByteBuf batch = batch(CompressionType.NONE, Message.marker("W_SET", "s")); // a batch, as a client sends
            ByteBuf body = batch.duplicate();
            MessageMetadata metadata = Commands.parseMessageMetadata(body); // its metadata, now in a transaction
            metadata.setTxnidMostBits(1).setTxnidLeastBits(least);
            ByteBuf entry = Commands.serializeMetadataAndPayload(Commands.ChecksumType.Crc32c, metadata, body);
            MarkerScanner.Outcome outcome = new MarkerScanner().scan(entry, 5, 9, found);
            assertEquals(least == 2 ? MarkerScanner.Outcome.ABORTED : MarkerScanner.Outcome.MARKERS, outcome);
        }
        assertEquals(List.of("1:2@5:9", "1:3@5:9"), asked);
        assertEquals(List.of("W_SET"), found.order); // the committed (or open) one only
    }

    @Test
    void dataSentAloneIsCountedWithItsEventTime() {
        Found found = scan(plain(Message.data(1234)), MarkerScanner.Outcome.DATA);
        assertEquals(List.of(), found.markers);
        assertEquals(List.of("p1@5:9:-1 x1 >=1234"), found.data);
    }

    @Test
    void markersInsideABatchAreFoundAtTheirIndexAndTheDataBetweenIsSummedInOrder() {
        for (CompressionType compression : new CompressionType[] {
                CompressionType.NONE, CompressionType.LZ4, CompressionType.ZLIB, CompressionType.ZSTD,
                CompressionType.SNAPPY}) {
            Found found = scan(batch(compression, Message.data(300), Message.data(200),
                    Message.marker("W_SET", "s"), Message.data(0), Message.marker("W_IDLE", "i")),
                    MarkerScanner.Outcome.MARKERS);
            assertEquals(List.of("W_SET#2/5 s", "W_IDLE#4/5 i"), found.markers.stream().map(MarkerScannerTest::text)
                    .toList(), compression.toString());
            // an event time of 0 is none
            assertEquals(List.of("p1@5:9:1 x2 >=200", "p1@5:9:3 x1 >=" + MarkerScanner.NO_EVENT_TIME), found.data,
                    compression.toString());
            assertEquals(List.of("data", "W_SET", "data", "W_IDLE"), found.order, compression.toString());
        }
    }

    @Test
    void aBatchOfDataOnlyIsSummedOnce() {
        Found found = scan(batch(CompressionType.LZ4, Message.data(50), Message.data(40)), MarkerScanner.Outcome.DATA);
        assertEquals(List.of(), found.markers);
        assertEquals(List.of("p1@5:9:1 x2 >=40"), found.data);
    }

    @Test
    void dataWithoutEventTimesReportsNone() {
        Found found = scan(batch(CompressionType.NONE, Message.data(0), Message.data(0)), MarkerScanner.Outcome.DATA);
        assertEquals(List.of("p1@5:9:1 x2 >=" + MarkerScanner.NO_EVENT_TIME), found.data);
    }

    @Test
    void anEntryWithTheBrokersOwnMetadataInFrontIsReadTheSame() {
        Set<BrokerEntryMetadataInterceptor> interceptors = Set.of(new AppendBrokerTimestampMetadataInterceptor());
        ByteBuf entry = Commands.addBrokerEntryMetadata(
                batch(CompressionType.LZ4, Message.marker("W_SET", "s"), Message.data(10)), interceptors);
        Found found = scan(entry, MarkerScanner.Outcome.MARKERS);
        assertEquals(List.of("W_SET#0/2 s"), found.markers.stream().map(MarkerScannerTest::text).toList());
    }

    @Test
    void anEncryptedEntryCannotBeReadAndSaysSo() {
        MessageMetadata metadata = metadata();
        metadata.addEncryptionKey().setKey("k").setValue(new byte[] {1, 2});
        metadata.addProperty().setKey(MarkerScanner.MARKER_PROPERTY).setValue("W_SET");
        ByteBuf entry = Commands.serializeMetadataAndPayload(Commands.ChecksumType.Crc32c, metadata, bytes("secret"));
        Found found = scan(entry, MarkerScanner.Outcome.ENCRYPTED);
        assertEquals(List.of(), found.markers);
    }

    @Test
    void bytesThatAreNoEntryAreMalformedNotAnException() {
        Found found = scan(Unpooled.wrappedBuffer(new byte[] {0x0e, 0x01, 0x7f, 0x7f, 0x7f}),
                MarkerScanner.Outcome.MALFORMED);
        assertEquals(List.of(), found.markers);
        ByteBuf truncated = batch(CompressionType.NONE, Message.data(1), Message.marker("W_SET", "s"));
        truncated.writerIndex(truncated.writerIndex() - 3);
        assertEquals(MarkerScanner.Outcome.MALFORMED, new MarkerScanner().scan(truncated, 5, 9, new Found()));
    }

    @Test
    void aMarkersPayloadIsCopiedSoTheEntryCanBeReleased() {
        ByteBuf entry = plain(Message.marker("W_SET", "abc"));
        Found found = scan(entry, MarkerScanner.Outcome.MARKERS);
        entry.setZero(0, entry.capacity());
        assertArrayEquals("abc".getBytes(StandardCharsets.UTF_8), found.markers.get(0).payload());
    }
}
