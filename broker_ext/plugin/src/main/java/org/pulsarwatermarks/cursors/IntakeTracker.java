package org.pulsarwatermarks.cursors;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.function.LongSupplier;
import org.apache.bookkeeper.mledger.Entry;
import org.apache.bookkeeper.mledger.ManagedLedgerException;
import org.apache.bookkeeper.mledger.PositionFactory;
import org.apache.pulsar.broker.service.persistent.PersistentTopic;
import org.apache.pulsar.client.api.transaction.TxnID;
import org.apache.pulsar.common.naming.TopicName;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The generator's intake inside the broker: for each followed topic of a namespace whose generator asked for it,
 * a {@link TopicReader} reads the entries behind the writer, {@link MarkerScanner} finds the markers and sums the
 * data between, and {@link TopicIntake} keeps them until the generator acknowledges past them; each read is news
 * in the {@link CursorReport}, so a waiting long poll is answered with it. The edge where the tracker's topics
 * meet the readers; the logic is in the plain classes. One thread of its own scans every topic's entries.
 */
final class IntakeTracker implements CursorTracker.Followers, AutoCloseable {
    /**
     * A generator behind by this many markers and stretches (a few hundred bytes each) reads the log itself. A
     * generator acknowledges at every snapshot (10 s or 1000 messages by default), so a topic keeps far fewer.
     */
    static final int KEPT_PER_TOPIC = 10_000;
    /** What all the topics of the broker keep together by default ({@code watermarkIntakeMaxItems}). */
    static final long KEPT_PER_BROKER = 500_000;
    /** A namespace whose generator asked for the intake is read this long after its last poll that asked. */
    private static final long ASKED_FOR_MS = 90_000;
    private static final Logger log = LoggerFactory.getLogger(IntakeTracker.class);

    private record Reading(PersistentTopic topic, TopicReader reader, TopicIntake intake) {}

    private final CursorReport report;
    private final LongSupplier clock;
    private final ScheduledExecutorService thread;
    private final TopicIntake.Budget budget; // used under the report's lock, as every TopicIntake is
    private final MarkerScanner scanner = new MarkerScanner(); // used on `thread` only
    private final Map<String, Reading> readings = new ConcurrentHashMap<>();
    private final Map<String, Long> asked = new ConcurrentHashMap<>();
    private volatile long askedForAll;

    IntakeTracker(CursorReport report, LongSupplier clock, long keptPerBroker) {
        this.report = report;
        this.clock = clock;
        this.budget = new TopicIntake.Budget(keptPerBroker);
        this.thread = Executors.newSingleThreadScheduledExecutor(runnable -> {
            Thread t = new Thread(runnable, "watermark-intake");
            t.setDaemon(true);
            return t;
        });
    }

    /** A generator asked for the intake of these namespaces (none: every one); from the request's thread. */
    void asked(java.util.Set<String> namespaces) {
        long now = clock.getAsLong();
        if (namespaces.isEmpty()) {
            askedForAll = now;
        }
        namespaces.forEach(namespace -> asked.put(namespace, now));
    }

    private boolean wanted(String topic) {
        long now = clock.getAsLong();
        if (now - askedForAll < ASKED_FOR_MS) {
            return true;
        }
        Long at = asked.get(TopicName.get(topic).getNamespace());
        return at != null && now - at < ASKED_FOR_MS;
    }

    /** What is kept for {@code topic}, or null where nothing reads it; call under the report's lock. */
    TopicIntake intakeOf(String topic) {
        Reading reading = readings.get(topic);
        return reading == null ? null : reading.intake();
    }

    @Override
    public void followed(PersistentTopic topic, TopicCursors cursors) {
        String name = topic.getName();
        TopicCursors.Position acknowledged = cursors.cursors().get(BrokerCursors.GENERATOR_SUBSCRIPTION);
        Reading reading = readings.get(name);
        if (reading != null && reading.topic() != topic) {
            unfollowed(name); // deleted and created again (or unloaded and loaded) under its name: read it anew
            reading = null;
        }
        if (reading == null) {
            if (!wanted(name) || acknowledged == null) {
                return;
            }
            TopicIntake intake = new TopicIntake(KEPT_PER_TOPIC, budget);
            try {
                TopicReader reader = TopicReader.open(name, topic.getManagedLedger(), topic::getMaxReadPosition,
                        acknowledged, thread, this::read);
                reading = new Reading(topic, reader, intake);
                readings.put(name, reading);
                reader.start();
                log.info("watermark-cursors: reading {} for its markers from {}", name, acknowledged);
            } catch (ManagedLedgerException | RuntimeException e) {
                log.warn("watermark-cursors: cannot read {} for its markers; the next sweep tries again", name, e);
                return;
            }
        } else if (!wanted(name)) {
            unfollowed(name); // no generator asked for it lately
            return;
        }
        TopicIntake intake = reading.intake();
        report.locked(() -> intake.acknowledged(acknowledged));
    }

    @Override
    public void unfollowed(String topic) {
        Reading reading = readings.remove(topic);
        if (reading != null) {
            reading.reader().close();
            report.locked(reading.intake()::release);
        }
    }

    /** On this tracker's thread: one read of a topic's entries, scanned, then kept as one change of the report. */
    private void read(TopicReader reader, String topic, List<Entry> entries) {
        Reading reading = readings.get(topic);
        if (reading == null || reading.reader() != reader || entries.isEmpty()) { // not a closed reader's last read
            return;
        }
        List<java.util.function.ObjLongConsumer<TopicIntake>> found = new ArrayList<>();
        MarkerScanner.Sink sink = new MarkerScanner.Sink() {
            @Override
            public void marker(MarkerScanner.Marker marker) {
                found.add((intake, seq) -> intake.marker(marker, seq));
            }

            @Override
            public void data(String producer, long ledgerId, long entryId, int lastBatchIndex, int messages,
                    long lowestEventTime) {
                found.add((intake, seq) -> intake.data(producer, ledgerId, entryId, lastBatchIndex, messages,
                        lowestEventTime, seq));
            }

            @Override
            public boolean aborted(long txnMostBits, long txnLeastBits, long ledgerId, long entryId) {
                return reading.topic().isTxnAborted(new TxnID(txnMostBits, txnLeastBits),
                        PositionFactory.create(ledgerId, entryId));
            }
        };
        int unreadable = 0;
        for (Entry entry : entries) {
            MarkerScanner.Outcome outcome = scanner.scan(entry.getDataBuffer(), entry.getLedgerId(), entry.getEntryId(),
                    sink);
            if (outcome == MarkerScanner.Outcome.ENCRYPTED || outcome == MarkerScanner.Outcome.MALFORMED) {
                unreadable++;
            }
        }
        if (unreadable > 0) {
            log.debug("watermark-cursors: {} entries of {} could not be read for markers (encrypted or malformed)",
                    unreadable, topic);
        }
        Entry last = entries.get(entries.size() - 1);
        TopicCursors.Position scanned = new TopicCursors.Position(last.getLedgerId(), last.getEntryId());
        TopicIntake intake = reading.intake();
        if (!report.found(topic, seq -> {
            found.forEach(add -> add.accept(intake, seq));
            intake.scannedTo(scanned);
        })) {
            unfollowed(topic); // no longer reported here
        }
    }

    @Override
    public void close() {
        readings.keySet().forEach(this::unfollowed);
        thread.shutdownNow();
    }
}
