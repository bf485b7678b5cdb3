package org.pulsarwatermarks.cursors;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * One topic's markers and data, as {@link MarkerScanner} found them, in log order, kept until the generator
 * acknowledges past them: what the generator is handed instead of reading the topic itself.
 *
 * <p>Data is summed per stretch between two markers and per producer (how many messages, the lowest event
 * time): the watermark changes only at markers, so within a stretch every data message is judged against the
 * same one, and the lowest tells whether a producer wrote below its own. Each item carries the sequence number
 * of the report it was found (or last grew) in, so a long poll is told only what is new; a generator that
 * knows nothing (a restart) is told everything kept. Past {@code limit} items (a generator far behind, or
 * none), or when the broker's {@link Budget} over all topics is spent, nothing is kept: the generator is told to
 * read the log itself until it has acknowledged past all that was dropped. Plain: JUnit tests it without a
 * broker. Not thread-safe: its owner serializes calls (those of every intake sharing a budget).
 */
public final class TopicIntake {
    /** Found in the log: a marker, or a stretch of data between two. */
    public sealed interface Found permits MarkerFound, DataFound {
        TopicCursors.Position last();
    }

    public record MarkerFound(MarkerScanner.Marker marker, long seq) implements Found {
        @Override
        public TopicCursors.Position last() {
            return new TopicCursors.Position(marker.ledgerId(), marker.entryId());
        }
    }

    /**
     * Data from entry {@code first} to entry {@code last} (its message at {@code lastBatchIndex}, {@code -1} when
     * sent alone) with no marker between: per producer, a {@link Stretch}.
     */
    public record DataFound(TopicCursors.Position first, TopicCursors.Position last, int lastBatchIndex,
            Map<String, Stretch> producers, long seq) implements Found {}

    /** A producer's data messages in a stretch: how many, the lowest event time ({@link MarkerScanner#NO_EVENT_TIME}). */
    public record Stretch(long messages, long lowestEventTime) {
        Stretch plus(long more, long eventTime) {
            return new Stretch(messages + more, Math.min(lowestEventTime, eventTime));
        }
    }

    /** What a generator is told: what was found since, where the scan is, and whether it must read the log itself. */
    public record Batch(List<Found> found, TopicCursors.Position scannedTo, boolean overflowed) {}

    /** How many items all the topics of a broker keep together: the intake's memory, bounded. */
    public static final class Budget {
        private final long limit;
        private long used;

        public Budget(long limit) {
            this.limit = limit;
        }

        public long used() {
            return used;
        }
    }

    private final int limit;
    private final Budget budget;
    private final Deque<Found> found = new ArrayDeque<>();
    private TopicCursors.Position scannedTo = new TopicCursors.Position(-1, -1);
    private TopicCursors.Position acknowledged = new TopicCursors.Position(-1, -1);
    private TopicCursors.Position droppedTo = null;

    public TopicIntake(int limit) {
        this(limit, new Budget(Long.MAX_VALUE));
    }

    public TopicIntake(int limit, Budget budget) {
        this.limit = limit;
        this.budget = budget;
    }

    public void marker(MarkerScanner.Marker marker, long seq) {
        TopicCursors.Position at = new TopicCursors.Position(marker.ledgerId(), marker.entryId());
        if (keeps(at)) {
            add(new MarkerFound(marker, seq));
        }
    }

    public void data(String producer, long ledgerId, long entryId, int lastBatchIndex, long messages,
            long lowestEventTime, long seq) {
        TopicCursors.Position at = new TopicCursors.Position(ledgerId, entryId);
        if (!keeps(at)) {
            return;
        }
        if (found.peekLast() instanceof DataFound stretch) { // the stretch since the last marker grows
            Map<String, Stretch> producers = new HashMap<>(stretch.producers());
            producers.merge(producer, new Stretch(messages, lowestEventTime),
                    (before, more) -> before.plus(more.messages(), more.lowestEventTime()));
            found.pollLast();
            found.addLast(new DataFound(stretch.first(), at, lastBatchIndex, producers, seq));
        } else {
            add(new DataFound(at, at, lastBatchIndex, Map.of(producer, new Stretch(messages, lowestEventTime)), seq));
        }
    }

    /** Every entry up to {@code position} was scanned (with or without anything found). */
    public void scannedTo(TopicCursors.Position position) {
        if (compare(position, scannedTo) > 0) {
            scannedTo = position;
        }
    }

    /** The generator acknowledged up to {@code position} (its {@code __wm_generator} cursor): forget what is before. */
    public void acknowledged(TopicCursors.Position position) {
        if (compare(position, acknowledged) <= 0) {
            return;
        }
        acknowledged = position;
        while (!found.isEmpty() && compare(found.peekFirst().last(), position) <= 0) {
            found.pollFirst();
            budget.used--;
        }
        if (droppedTo != null && compare(droppedTo, position) <= 0) {
            droppedTo = null; // it read all that was dropped through the log: what comes next is kept again
        }
    }

    /** What is new since report {@code seq} ({@code -1}: everything kept). */
    public Batch since(long seq) {
        List<Found> fresh = new ArrayList<>();
        for (Found item : found) {
            long itemSeq = item instanceof MarkerFound m ? m.seq() : ((DataFound) item).seq();
            if (itemSeq > seq) {
                fresh.add(item);
            }
        }
        return new Batch(fresh, scannedTo, droppedTo != null);
    }

    public int size() {
        return found.size();
    }

    /** The topic is no longer read: what it kept goes back to the budget. */
    public void release() {
        budget.used -= found.size();
        found.clear();
    }

    private boolean keeps(TopicCursors.Position at) {
        if (compare(at, acknowledged) <= 0) {
            return false;
        }
        if (droppedTo != null) {
            droppedTo = at; // still too far behind: the generator reads this one through the log too
            return false;
        }
        return true;
    }

    private void add(Found item) {
        if (found.size() >= limit || budget.used >= budget.limit) {
            droppedTo = item.last();
            release();
            return;
        }
        found.addLast(item);
        budget.used++;
    }

    static int compare(TopicCursors.Position a, TopicCursors.Position b) {
        int byLedger = Long.compare(a.ledger(), b.ledger());
        return byLedger != 0 ? byLedger : Long.compare(a.entry(), b.entry());
    }
}
