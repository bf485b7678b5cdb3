package org.pulsarwatermarks.cursors;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.LongSupplier;

/**
 * Topics where a producer or consumer just appeared, on their way from the broker's threads to the report.
 *
 * <p>{@link #offer} runs on the thread that created the producer (a broker IO thread) for every persistent
 * topic, followed or not: a reconnect storm after a broker restart calls it thousands of times at once. So it does
 * O(1) work and takes no lock: a topic of a namespace that no generator follows (none named it in a long poll
 * within {@code forgetAfterMs}) is dropped at once; another joins a bounded set, and the first since the last
 * {@link #drain} asks for one. The plugin's own thread drains them into the report in one go. A topic dropped
 * because the set is full is found by its generator at its next look at the topic list, as before the plugin.
 */
final class FreshTopics {
    private final LongSupplier clockMs;
    private final long forgetAfterMs;
    private final int capacity;
    private final Map<String, Long> followedUntil = new ConcurrentHashMap<>(); // namespace -> until (ms)
    private volatile long everyNamespaceUntil = Long.MIN_VALUE;
    private final Set<String> waiting = ConcurrentHashMap.newKeySet();
    private final AtomicInteger size = new AtomicInteger();
    private final AtomicBoolean drainAsked = new AtomicBoolean();

    FreshTopics(LongSupplier clockMs, long forgetAfterMs, int capacity) {
        this.clockMs = clockMs;
        this.forgetAfterMs = forgetAfterMs;
        this.capacity = capacity;
    }

    /** A generator's long poll named {@code namespaces} (empty: it follows every namespace). */
    void followed(Collection<String> namespaces) {
        long until = clockMs.getAsLong() + forgetAfterMs;
        if (namespaces.isEmpty()) {
            everyNamespaceUntil = until;
            return;
        }
        for (String namespace : namespaces) {
            followedUntil.put(namespace, until);
        }
        if (followedUntil.size() > namespaces.size()) {
            long now = clockMs.getAsLong();
            followedUntil.values().removeIf(at -> at <= now); // generators that stopped polling
        }
    }

    /** From the broker's thread: {@code topic} may be new to a generator. Whether a {@link #drain} must follow. */
    boolean offer(String topic) {
        String namespace = Namespaces.namespaceOf(topic);
        if (namespace == null) {
            return false;
        }
        long now = clockMs.getAsLong();
        if (everyNamespaceUntil <= now) {
            Long until = followedUntil.get(namespace);
            if (until == null || until <= now) {
                return false;
            }
        }
        if (size.get() >= capacity || !waiting.add(topic)) {
            return false; // full (a few more may pass at once: bounded all the same), or it waits already
        }
        size.incrementAndGet();
        return drainAsked.compareAndSet(false, true); // after adding: a drain that starts from now on sees it
    }

    /** On the plugin's thread: every topic offered since the last drain, once each. */
    List<String> drain() {
        drainAsked.set(false); // before taking: a topic offered from now on asks for another drain
        List<String> topics = new ArrayList<>();
        for (String topic : waiting) {
            if (waiting.remove(topic)) {
                size.decrementAndGet();
                topics.add(topic);
            }
        }
        return topics;
    }
}
