package org.pulsarwatermarks.cursors;

import java.util.List;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import org.apache.bookkeeper.mledger.AsyncCallbacks;
import org.apache.bookkeeper.mledger.Entry;
import org.apache.bookkeeper.mledger.ManagedCursor;
import org.apache.bookkeeper.mledger.ManagedLedger;
import org.apache.bookkeeper.mledger.ManagedLedgerException;
import org.apache.bookkeeper.mledger.Position;
import org.apache.bookkeeper.mledger.PositionFactory;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads one followed topic's entries just behind the writer, in log order, with a non-durable cursor of its own
 * (entries just written come from the broker's cache): the edge where Pulsar's managed ledger is adapted for the
 * intake. Each batch read is handed to {@code sink} on the intake's one thread, which scans it
 * ({@link MarkerScanner}); the next read is asked for only after that, so batches arrive in order. Retention is
 * the durable {@code __wm_generator} subscription's job, not this cursor's. As the broker's dispatchers do, it reads
 * no further than the topic's max read position: the entries of a Pulsar transaction still open wait there until it
 * commits or aborts (the tracker passes over those of aborted ones).
 */
final class TopicReader implements AsyncCallbacks.ReadEntriesCallback {
    static final String CURSOR_NAME = "__wm_intake";
    private static final int ENTRIES_PER_READ = 500;
    private static final long RETRY_MS = 500;
    /** How soon to look again while an open transaction holds the reading back. */
    private static final long HELD_MS = 100;
    private static final Logger log = LoggerFactory.getLogger(TopicReader.class);
    private static final java.util.concurrent.atomic.AtomicLong OPENED = new java.util.concurrent.atomic.AtomicLong();

    /** Where read entries go, on the intake's thread; the reader releases them after. */
    interface Sink {
        void read(TopicReader reader, String topic, List<Entry> entries);
    }

    private final String topic;
    private final ManagedLedger ledger;
    private final ManagedCursor cursor;
    private final Supplier<Position> readable;
    private final ScheduledExecutorService thread;
    private final Sink sink;
    private volatile boolean closed;
    private volatile Position limit = PositionFactory.EARLIEST; // the max read position the pending read was asked with

    private TopicReader(String topic, ManagedLedger ledger, ManagedCursor cursor, Supplier<Position> readable,
            ScheduledExecutorService thread, Sink sink) {
        this.topic = topic;
        this.ledger = ledger;
        this.cursor = cursor;
        this.readable = readable;
        this.thread = thread;
        this.sink = sink;
    }

    /**
     * Reads {@code topic} from the entry after {@code after} (the generator's mark-delete position) on, up to
     * {@code readable} (the topic's max read position) at each read.
     */
    static TopicReader open(String topic, ManagedLedger ledger, Supplier<Position> readable,
            TopicCursors.Position after, ScheduledExecutorService thread, Sink sink) throws ManagedLedgerException {
        Position start = PositionFactory.create(after.ledger(), after.entry());
        // a name of its own: the ledger hands back a cursor of the same name still open (one being removed)
        ManagedCursor cursor = ledger.newNonDurableCursor(start, CURSOR_NAME + "-" + OPENED.incrementAndGet());
        cursor.setActive(); // a non-durable cursor waiting for entries is woken by a new one only while active
        return new TopicReader(topic, ledger, cursor, readable, thread, sink);
    }

    /** Starts reading: once its owner knows it, so the first read's entries find where they go. */
    void start() {
        readMore();
    }

    private void readMore() {
        if (!closed) {
            limit = readable.get();
            cursor.asyncReadEntriesOrWait(ENTRIES_PER_READ, this, null, limit);
        }
    }

    @Override
    public void readEntriesComplete(List<Entry> entries, Object ctx) {
        if (entries.isEmpty()) { // nothing up to the limit: it moved since the read was asked (read on), or is held
            boolean held = readable.get().compareTo(limit) <= 0;
            thread.schedule(this::readMore, held ? HELD_MS : 0, TimeUnit.MILLISECONDS);
            return;
        }
        thread.execute(() -> {
            try {
                if (!closed) {
                    sink.read(this, topic, entries);
                }
            } catch (RuntimeException e) {
                log.warn("watermark-cursors: scanning {} failed; reading on", topic, e);
            } finally {
                entries.forEach(Entry::release);
            }
            readMore();
        });
    }

    @Override
    public void readEntriesFailed(ManagedLedgerException exception, Object ctx) {
        if (closed || exception instanceof ManagedLedgerException.CursorAlreadyClosedException
                || exception instanceof ManagedLedgerException.ManagedLedgerAlreadyClosedException) {
            return; // unloaded or deleted: the tracker closes this reader
        }
        log.debug("watermark-cursors: reading {} failed ({}); again in {} ms", topic, exception.getMessage(), RETRY_MS);
        thread.schedule(this::readMore, RETRY_MS, TimeUnit.MILLISECONDS);
    }

    /** Stops reading and removes the cursor (the topic is unloaded, deleted, or no longer followed). */
    void close() {
        closed = true;
        cursor.cancelPendingReadRequest();
        ledger.asyncDeleteCursor(cursor.getName(), new AsyncCallbacks.DeleteCursorCallback() {
            @Override
            public void deleteCursorComplete(Object ctx) {}

            @Override
            public void deleteCursorFailed(ManagedLedgerException exception, Object ctx) {
                log.debug("watermark-cursors: removing the intake cursor of {}: {}", topic, exception.getMessage());
            }
        }, null);
    }
}
