package org.pulsarwatermarks.cursors;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import java.util.Base64;
import java.util.Map;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.protocol.Commands;

/**
 * {@code POST /watermark-cursors/snapshots}: the generator's {@code W_SNAPSHOT} records, written into their data
 * topics by the plugin, so the generator holds no producer per partition for them (issue 47). The body has a line
 * per topic, {@code <topic> <producer> <payload>}: the producer name the record carries and its payload in base64.
 * The answer says per topic {@code "written <ledger> <entry>"}, {@code "elsewhere"} (another broker serves it) or
 * {@code "failed: ..."}. Plain: JUnit tests it.
 */
public final class SnapshotWrites {
    public static final String SNAPSHOT = "W_SNAPSHOT";

    /** One record to write: the producer name it carries and its payload. */
    public record Wanted(String producer, byte[] payload) {}

    private SnapshotWrites() {}

    /** The records the body asks for, per topic, in its order; a malformed line is refused with its number. */
    public static Map<String, Wanted> parse(String body) {
        return TopicLines.parse(body, "<topic> <producer> <base64 payload>", 2, fields -> {
            try {
                return new Wanted(fields[0], Base64.getDecoder().decode(fields[1]));
            } catch (IllegalArgumentException e) {
                return null;
            }
        });
    }

    /** A topic's outcome once its record is in the log. */
    public static String written(long ledgerId, long entryId) {
        return "written " + ledgerId + " " + entryId;
    }

    /**
     * The entry as a producer without batching writes it: the marker property, the producer name, a sequence id and
     * the publish time in its metadata, the payload after it. The caller releases it.
     */
    public static ByteBuf entry(Wanted wanted, long sequenceId, long publishTime) {
        MessageMetadata metadata = new MessageMetadata().setProducerName(wanted.producer()).setSequenceId(sequenceId)
                .setPublishTime(publishTime);
        metadata.addProperty().setKey(MarkerScanner.MARKER_PROPERTY).setValue(SNAPSHOT);
        return Commands.serializeMetadataAndPayload(Commands.ChecksumType.Crc32c, metadata,
                Unpooled.wrappedBuffer(wanted.payload()));
    }
}
