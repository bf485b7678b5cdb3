package org.pulsarwatermarks.cursors;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.UUID;
import java.util.function.Predicate;

/**
 * Every followed topic's cursors with the sequence number of its last change: what a generator
 * that knew sequence {@code n} has to be told. No log of moves is kept, only the latest state per
 * topic, so memory stays one entry per topic (and a bounded number of removed ones), however often
 * cursors move. Pure and thread-safe; the broker's side is {@link CursorTracker}.
 */
public final class CursorReport {
    private static final class Entry {
        long version;
        TopicCursors cursors; // null: removed (no longer served here, or no longer followed)

        Entry(long version, TopicCursors cursors) {
            this.version = version;
            this.cursors = cursors;
        }
    }

    private final String epoch;
    private final int maxRemoved;
    private final Map<String, Entry> topics = new HashMap<>();
    private final Map<String, Long> fresh = new java.util.LinkedHashMap<>(16, 0.75f, false) {
        @Override
        protected boolean removeEldestEntry(Map.Entry<String, Long> eldest) {
            return size() > MAX_FRESH; // a generator that misses one finds it at its next look at the topic list
        }
    };
    private static final int MAX_FRESH = 1_000;
    private long seq;
    private long forgottenUpTo;
    private int removed;
    private Runnable onChange = () -> {};

    /** {@code maxRemoved}: how many removed topics are remembered before a lagging generator gets a full answer. */
    public CursorReport(String epoch, int maxRemoved) {
        this.epoch = epoch;
        this.maxRemoved = maxRemoved;
    }

    public CursorReport() {
        this(UUID.randomUUID().toString(), 10_000);
    }

    public String epoch() {
        return epoch;
    }

    /** Called after every change, outside the lock (to wake generators that wait). */
    public synchronized void onChange(Runnable listener) {
        onChange = listener;
    }

    /** The topic's cursors as read now; a change only if they moved from what was reported. */
    public void update(String topic, TopicCursors cursors) {
        Runnable listener;
        synchronized (this) {
            Entry entry = topics.get(topic);
            if (entry != null && !cursors.movedFrom(entry.cursors)) {
                return;
            }
            if (entry == null) {
                topics.put(topic, new Entry(++seq, cursors));
            } else {
                if (entry.cursors == null) {
                    removed--;
                }
                entry.version = ++seq;
                entry.cursors = cursors;
            }
            listener = onChange;
            notifyAll();
        }
        listener.run();
    }

    /** The topic is no longer served here (unloaded, deleted) or no longer followed. */
    public void remove(String topic) {
        Runnable listener;
        synchronized (this) {
            Entry entry = topics.get(topic);
            if (entry == null || entry.cursors == null) {
                return;
            }
            entry.version = ++seq;
            entry.cursors = null;
            removed++;
            if (removed > maxRemoved) {
                forgetOldestRemoved();
            }
            listener = onChange;
            notifyAll();
        }
        listener.run();
    }

    private void forgetOldestRemoved() {
        String oldest = null;
        long version = Long.MAX_VALUE;
        for (Map.Entry<String, Entry> e : topics.entrySet()) {
            if (e.getValue().cursors == null && e.getValue().version < version) {
                oldest = e.getKey();
                version = e.getValue().version;
            }
        }
        topics.remove(oldest);
        removed--;
        forgottenUpTo = Math.max(forgottenUpTo, version);
    }

    /**
     * Something was found on {@code topic} by the intake: {@code additions} is handed the sequence number to stamp
     * it with, under this report's lock (so a generator told of the topic at that sequence is told of it too), and
     * the topic is news. False, and nothing is added, when the topic is not reported (not followed, or removed).
     */
    public boolean found(String topic, java.util.function.LongConsumer additions) {
        Runnable listener;
        synchronized (this) {
            Entry entry = topics.get(topic);
            if (entry == null || entry.cursors == null) {
                return false;
            }
            entry.version = ++seq;
            additions.accept(seq);
            listener = onChange;
            notifyAll();
        }
        listener.run();
        return true;
    }

    /** Runs {@code action} under this report's lock: what the intake keeps is read and trimmed under it. */
    public synchronized void locked(Runnable action) {
        action.run();
    }

    /** A producer or consumer appeared on {@code topic}, which no generator follows yet. */
    public void announce(String topic) {
        announce(List.of(topic));
    }

    /** Like {@link #announce(String)} for each of {@code topics}, and one change for the listener. */
    public void announce(java.util.Collection<String> topics) {
        Runnable listener;
        synchronized (this) {
            long before = seq;
            for (String topic : topics) {
                Entry entry = this.topics.get(topic);
                if (entry != null && entry.cursors != null) {
                    continue; // followed already
                }
                fresh.remove(topic);
                fresh.put(topic, ++seq);
            }
            if (seq == before) {
                return;
            }
            listener = onChange;
            notifyAll();
        }
        listener.run();
    }

    /** The topics that have cursors reported now. */
    public synchronized Set<String> present() {
        Set<String> present = new java.util.HashSet<>();
        topics.forEach((topic, entry) -> {
            if (entry.cursors != null) {
                present.add(topic);
            }
        });
        return present;
    }

    /** What a generator that knew {@code since} of run {@code knownEpoch} has to be told (maybe nothing). */
    public Changes since(String knownEpoch, long since) {
        return since(knownEpoch, since, topic -> true);
    }

    /** Like {@link #since}, of the topics {@code wanted} only (the namespaces the generator follows). */
    public Changes since(String knownEpoch, long since, Predicate<String> wanted) {
        return since(knownEpoch, since, wanted, null);
    }

    /**
     * Like {@link #since}, with what the intake found on each listed topic since then ({@code intakes}: a topic's
     * {@link TopicIntake}, or null where none reads it); null {@code intakes}: a generator that did not ask.
     */
    public synchronized Changes since(String knownEpoch, long since, Predicate<String> wanted,
            java.util.function.Function<String, TopicIntake> intakes) {
        boolean full = !epoch.equals(knownEpoch) || since < forgottenUpTo || since > seq;
        Map<String, TopicCursors> changed = new TreeMap<>();
        List<String> gone = new ArrayList<>();
        topics.forEach((topic, entry) -> {
            if ((!full && entry.version <= since) || !wanted.test(topic)) {
                return;
            }
            if (entry.cursors != null) {
                changed.put(topic, entry.cursors);
            } else if (!full) {
                gone.add(topic);
            }
        });
        gone.sort(null);
        List<String> announced = new ArrayList<>();
        if (!full) {
            fresh.forEach((topic, version) -> {
                if (version > since && !changed.containsKey(topic) && wanted.test(topic)) {
                    announced.add(topic);
                }
            });
        }
        Map<String, TopicIntake.Batch> intake = new TreeMap<>();
        if (intakes != null) {
            changed.keySet().forEach(topic -> {
                TopicIntake kept = intakes.apply(topic);
                if (kept != null) {
                    intake.put(topic, kept.since(full ? -1 : since));
                }
            });
        }
        return new Changes(epoch, seq, full, changed, gone, announced, intake);
    }

    /** Like {@link #since}, but waits up to {@code timeoutMs} for a change (a long poll on a thread of its own). */
    public synchronized Changes await(String knownEpoch, long since, Predicate<String> wanted, long timeoutMs)
            throws InterruptedException {
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        Changes changes = since(knownEpoch, since, wanted);
        while (changes.isEmpty()) {
            long left = (deadline - System.nanoTime()) / 1_000_000L;
            if (left <= 0) {
                break;
            }
            wait(left);
            changes = since(knownEpoch, since, wanted);
        }
        return changes;
    }
}
