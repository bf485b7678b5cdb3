package org.pulsarwatermarks.cursors;

import io.netty.buffer.ByteBuf;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.function.IntFunction;
import org.apache.pulsar.common.api.proto.CompressionType;
import org.apache.pulsar.common.api.proto.KeyValue;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.api.proto.SingleMessageMetadata;
import org.apache.pulsar.common.compression.CompressionCodecProvider;
import org.apache.pulsar.common.protocol.Commands;

/**
 * Finds the watermark markers in an entry as the broker writes it: a message whose property {@code wm.marker}
 * names its kind, sent alone or inside a batch, compressed or not (docs/PROTOCOL.md). Every other message is
 * data: the data messages between two markers of an entry are summed (how many, the lowest event time) so the
 * generator can tell a producer that wrote below its own watermark without receiving a data message. What an
 * entry holds is reported in its order: the data before a marker, the marker, the data after it.
 *
 * <p>Plain: JUnit tests it without a broker. Not thread-safe: it reuses one metadata object per field (the
 * broker's own way, no allocation per entry), so each thread that scans has its own scanner. The entry's
 * buffer is only read: its indexes and reference count are left as they were; a marker's payload is copied.
 */
public final class MarkerScanner {
    public static final String MARKER_PROPERTY = "wm.marker";
    /** The lowest event time of data that carries none (an event time of 0 is none, as in Pulsar's client). */
    public static final long NO_EVENT_TIME = Long.MAX_VALUE;

    /** What an entry held. */
    public enum Outcome { DATA, MARKERS, ENCRYPTED, MALFORMED, ABORTED }

    /**
     * A marker found: the entry, its index in a batch ({@code -1} and size 0 when sent alone), the producer,
     * the kind (the property's value), the payload, the publish time, and whether it was sent in a Pulsar
     * transaction (in the log before its transaction commits or aborts: consumers see it only once committed).
     */
    public record Marker(
            long ledgerId, long entryId, int batchIndex, int batchSize, String producer, String kind,
            byte[] payload, long publishTime, boolean transactional) {}

    /** Where a scan reports. */
    public interface Sink {
        void marker(Marker marker);

        /**
         * Data messages of the entry with no marker between them: how many, the batch index of the last one
         * ({@code -1} for a message sent alone), and the lowest event time ({@link #NO_EVENT_TIME}: none).
         */
        void data(String producer, long ledgerId, long entryId, int lastBatchIndex, int messages, long lowestEventTime);

        /**
         * Whether the Pulsar transaction of an entry was aborted: consumers never see its messages, so nothing of it
         * is reported. Asked only of entries sent in a transaction; the broker's transaction buffer answers.
         */
        default boolean aborted(long txnMostBits, long txnLeastBits, long ledgerId, long entryId) {
            return false;
        }
    }

    private final MessageMetadata metadata = new MessageMetadata();
    private final SingleMessageMetadata single = new SingleMessageMetadata();

    /** Scans one entry; never throws for what the entry holds (a malformed one is {@link Outcome#MALFORMED}). */
    public Outcome scan(ByteBuf entry, long ledgerId, long entryId, Sink sink) {
        ByteBuf buffer = entry.duplicate(); // own indexes; the content and reference count stay the broker's
        try {
            Commands.skipBrokerEntryMetadataIfExist(buffer);
            Commands.parseMessageMetadata(buffer, metadata);
        } catch (RuntimeException e) {
            return Outcome.MALFORMED;
        }
        if (metadata.getEncryptionKeysCount() > 0) {
            return Outcome.ENCRYPTED; // neither properties inside a batch nor payloads can be read
        }
        String producer = metadata.getProducerName();
        long publishTime = metadata.getPublishTime();
        boolean transactional = metadata.hasTxnidMostBits() || metadata.hasTxnidLeastBits();
        if (transactional && sink.aborted(metadata.getTxnidMostBits(), metadata.getTxnidLeastBits(), ledgerId, entryId)) {
            return Outcome.ABORTED;
        }
        if (!metadata.hasNumMessagesInBatch()) {
            String kind = markerKind(metadata.getPropertiesCount(), metadata::getPropertyAt);
            if (kind == null) {
                sink.data(producer, ledgerId, entryId, -1, 1, eventTime(metadata.hasEventTime(), metadata.getEventTime()));
                return Outcome.DATA;
            }
            ByteBuf payload = null;
            try {
                payload = uncompressed(buffer);
                sink.marker(new Marker(ledgerId, entryId, -1, 0, producer, kind, copy(payload, payload.readableBytes()),
                        publishTime, transactional));
                return Outcome.MARKERS;
            } catch (Exception e) {
                return Outcome.MALFORMED;
            } finally {
                release(payload, buffer);
            }
        }
        return scanBatch(buffer, ledgerId, entryId, producer, publishTime, transactional, sink);
    }

    private Outcome scanBatch(ByteBuf buffer, long ledgerId, long entryId, String producer, long publishTime,
            boolean transactional, Sink sink) {
        int size = metadata.getNumMessagesInBatch();
        ByteBuf batch = null;
        List<Runnable> reports = new ArrayList<>(2); // told once the whole batch read well: nothing of a malformed one
        boolean markers = false;
        int data = 0;
        long lowest = NO_EVENT_TIME;
        try {
            batch = uncompressed(buffer);
            for (int index = 0; index < size; index++) {
                int metadataSize = batch.readInt();
                single.parseFrom(batch, metadataSize);
                int payloadSize = single.getPayloadSize();
                if (payloadSize < 0 || payloadSize > batch.readableBytes()) {
                    return Outcome.MALFORMED;
                }
                String kind = markerKind(single.getPropertiesCount(), single::getPropertyAt);
                if (kind == null) {
                    data++;
                    lowest = Math.min(lowest, eventTime(single.hasEventTime(), single.getEventTime()));
                    batch.skipBytes(payloadSize);
                    continue;
                }
                if (data > 0) {
                    reports.add(dataReport(sink, producer, ledgerId, entryId, index - 1, data, lowest));
                    data = 0;
                    lowest = NO_EVENT_TIME;
                }
                Marker marker = new Marker(ledgerId, entryId, index, size, producer, kind, copy(batch, payloadSize),
                        publishTime, transactional);
                reports.add(() -> sink.marker(marker));
                markers = true;
            }
        } catch (Exception e) {
            return Outcome.MALFORMED;
        } finally {
            release(batch, buffer);
        }
        if (data > 0) {
            reports.add(dataReport(sink, producer, ledgerId, entryId, size - 1, data, lowest));
        }
        reports.forEach(Runnable::run);
        return markers ? Outcome.MARKERS : Outcome.DATA;
    }

    private static Runnable dataReport(Sink sink, String producer, long ledgerId, long entryId, int lastBatchIndex,
            int messages, long lowest) {
        return () -> sink.data(producer, ledgerId, entryId, lastBatchIndex, messages, lowest);
    }

    /** The marker kind among a message's properties, or null for data. */
    private static String markerKind(int count, IntFunction<KeyValue> property) {
        for (int i = 0; i < count; i++) {
            KeyValue keyValue = property.apply(i);
            if (MARKER_PROPERTY.equals(keyValue.getKey())) {
                return keyValue.getValue();
            }
        }
        return null;
    }

    private static long eventTime(boolean present, long eventTime) {
        return present && eventTime > 0 ? eventTime : NO_EVENT_TIME;
    }

    /** The rest of the entry, decompressed when the producer compressed it (a new buffer then, else the same). */
    private ByteBuf uncompressed(ByteBuf buffer) throws IOException {
        CompressionType compression = metadata.hasCompression() ? metadata.getCompression() : CompressionType.NONE;
        if (compression == CompressionType.NONE) {
            return buffer;
        }
        return CompressionCodecProvider.getCompressionCodec(compression).decode(buffer, metadata.getUncompressedSize());
    }

    private static void release(ByteBuf decompressed, ByteBuf entry) {
        if (decompressed != null && decompressed != entry) {
            decompressed.release();
        }
    }

    private static byte[] copy(ByteBuf buffer, int length) {
        byte[] bytes = new byte[length];
        buffer.readBytes(bytes);
        return bytes;
    }
}
