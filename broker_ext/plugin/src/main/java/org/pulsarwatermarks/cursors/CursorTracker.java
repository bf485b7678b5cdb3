package org.pulsarwatermarks.cursors;

import java.util.HashSet;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.pulsar.broker.service.BrokerService;
import org.apache.pulsar.broker.service.Topic;
import org.apache.pulsar.broker.service.persistent.PersistentTopic;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Keeps the {@link CursorReport} true to the broker, on one thread of its own.
 *
 * <p>A topic named by the interceptor (an acknowledgement, a consumer come or gone) is read a few
 * milliseconds later, coalescing a burst; anything else (a seek, an admin call such as a reset, an
 * unload or a deletion) reads the topic it names soon after (a namespace-wide call: a sweep of every
 * loaded topic); and a sweep every
 * {@code sweepIntervalMs} catches what passes no hook at all (message expiry, a topic unloaded by the
 * load manager). Only topics with a {@code __wm_generator} subscription are read: others cost a map
 * lookup per acknowledgement and nothing else.
 */
final class CursorTracker implements AutoCloseable {
    private static final Logger log = LoggerFactory.getLogger(CursorTracker.class);
    private static final long COALESCE_MS = 2;
    private static final long[] SWEEPS_AFTER_ADMIN_MS = {100, 600};

    private final BrokerService broker;
    private final CursorReport report;
    private final ScheduledExecutorService thread;
    private final Set<String> touched = ConcurrentHashMap.newKeySet();
    private final AtomicBoolean readScheduled = new AtomicBoolean();

    private final java.util.function.Predicate<String> announceable;
    private final FreshTopics fresh;
    private final Followers followers;

    /** Told, on this tracker's thread, of every followed topic it read, and of each that is no longer reported. */
    interface Followers {
        void followed(PersistentTopic topic, TopicCursors cursors);

        void unfollowed(String topic);
    }

    CursorTracker(BrokerService broker, CursorReport report, long sweepIntervalMs,
            java.util.function.Predicate<String> announceable, FreshTopics fresh, Followers followers) {
        this.broker = broker;
        this.report = report;
        this.announceable = announceable;
        this.fresh = fresh;
        this.followers = followers;
        this.thread = Executors.newSingleThreadScheduledExecutor(runnable -> {
            Thread t = new Thread(runnable, "watermark-cursors");
            t.setDaemon(true);
            return t;
        });
        thread.scheduleWithFixedDelay(this::sweep, 0, sweepIntervalMs, TimeUnit.MILLISECONDS);
    }

    /**
     * What the interceptor calls, by the names it knows them by: JDK types, since the broker loads it in a class
     * loader of its own. Each runs on a broker's thread, in O(1), and never blocks.
     */
    java.util.Map<String, java.util.function.Consumer<String>> hooks() {
        return java.util.Map.of(CursorInterceptor.MOVED, this::moved, CursorInterceptor.FRESH, this::fresh,
                CursorInterceptor.AFTER_ADMIN, this::afterAdmin, CursorInterceptor.SWEEP, topic -> sweepSoon());
    }

    /** The topic's cursors may have moved: it is read in a moment, with the others named meanwhile. */
    void moved(String topic) {
        touched.add(topic);
        if (readScheduled.compareAndSet(false, true)) {
            thread.schedule(this::readTouched, COALESCE_MS, TimeUnit.MILLISECONDS);
        }
    }

    /** A producer or consumer appeared on a topic no generator follows. */
    void fresh(String topic) {
        if (fresh.offer(topic)) { // O(1), no lock: a reconnect storm calls it per producer
            thread.execute(this::announceFresh);
        }
    }

    /** An admin call on the topic: its cursors move after the hook, so it is read a little later. */
    void afterAdmin(String topic) {
        for (long delay : SWEEPS_AFTER_ADMIN_MS) {
            thread.schedule(() -> readAfterAdmin(topic), delay, TimeUnit.MILLISECONDS);
        }
    }

    /** Any topic may have moved (a seek, a namespace-wide admin call): every one is read a little later. */
    void sweepSoon() {
        for (long delay : SWEEPS_AFTER_ADMIN_MS) {
            thread.schedule(this::sweep, delay, TimeUnit.MILLISECONDS);
        }
    }

    /** New topics of namespaces some generator follows, to the report in one change (which wakes the polls). */
    private void announceFresh() {
        try {
            java.util.List<String> topics = fresh.drain();
            topics.removeIf(topic -> !announceable.test(topic));
            report.announce(topics);
        } catch (RuntimeException e) {
            log.warn("watermark-cursors: announcing new topics failed; generators find them at their next look", e);
        }
    }

    private void readTouched() {
        readScheduled.set(false); // before draining: a topic touched from now on schedules another read
        for (String topic : drain()) {
            read(topic);
        }
    }

    /** The topic an admin call named, and its partitions if it is a partitioned topic's name. */
    private void readAfterAdmin(String topic) {
        read(topic);
        String partitions = topic + "-partition-";
        for (String present : report.present()) {
            if (present.startsWith(partitions)) {
                read(present);
            }
        }
    }

    private void read(String topic) {
        try {
            Optional<Topic> loaded = broker.getTopicReference(topic);
            PersistentTopic persistent = loaded.isPresent() && loaded.get() instanceof PersistentTopic p ? p : null;
            TopicCursors cursors = persistent != null ? BrokerCursors.read(persistent) : null;
            if (cursors != null) {
                report.update(topic, cursors);
                followers.followed(persistent, cursors);
            } else {
                report.remove(topic);
                followers.unfollowed(topic);
            }
        } catch (RuntimeException e) {
            log.warn("watermark-cursors: reading {} failed; the next sweep reads it again", topic, e);
        }
    }

    private Set<String> drain() {
        Set<String> topics = new HashSet<>();
        for (String topic : touched) {
            touched.remove(topic);
            topics.add(topic);
        }
        return topics;
    }

    void sweep() {
        try {
            Set<String> seen = new HashSet<>();
            broker.forEachPersistentTopic(topic -> {
                TopicCursors cursors = BrokerCursors.read(topic);
                if (cursors != null) {
                    seen.add(topic.getName());
                    report.update(topic.getName(), cursors);
                    followers.followed(topic, cursors);
                }
            });
            for (String topic : report.present()) {
                if (!seen.contains(topic)) {
                    report.remove(topic);
                    followers.unfollowed(topic);
                }
            }
        } catch (RuntimeException e) {
            log.warn("watermark-cursors: a sweep failed; the next one tries again", e);
        }
    }

    @Override
    public void close() {
        thread.shutdownNow();
    }
}
