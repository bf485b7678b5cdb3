package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

class FreshTopicsTest {
    private final AtomicLong now = new AtomicLong(1_000);

    @Test
    void aTopicOfANamespaceNoGeneratorFollowsIsDroppedAtOnce() {
        FreshTopics fresh = new FreshTopics(now::get, 60_000, 100);
        assertFalse(fresh.offer("persistent://t/ns/a")); // nobody polls yet
        fresh.followed(Set.of("t/ours"));
        assertFalse(fresh.offer("persistent://t/theirs/a"));
        assertTrue(fresh.offer("persistent://t/ours/a")); // the first since a drain asks for one
        assertFalse(fresh.offer("persistent://t/ours/b")); // a drain is due already
        assertEquals(Set.of("persistent://t/ours/a", "persistent://t/ours/b"), Set.copyOf(fresh.drain()));
        assertEquals(List.of(), fresh.drain());
        assertTrue(fresh.offer("persistent://t/ours/c"));
    }

    @Test
    void aPollWithoutNamespacesFollowsEveryNamespace() {
        FreshTopics fresh = new FreshTopics(now::get, 60_000, 100);
        fresh.followed(Set.of());
        assertTrue(fresh.offer("persistent://any/where/a"));
        assertFalse(fresh.offer("non-persistent://any/where/a"));
    }

    @Test
    void aGeneratorThatStoppedPollingIsForgotten() {
        FreshTopics fresh = new FreshTopics(now::get, 60_000, 100);
        fresh.followed(Set.of("t/ours"));
        fresh.followed(Set.of());
        now.addAndGet(59_999);
        assertTrue(fresh.offer("persistent://t/ours/a"));
        fresh.drain();
        now.addAndGet(1);
        assertFalse(fresh.offer("persistent://t/ours/b"));
        assertFalse(fresh.offer("persistent://t/other/b"));
        fresh.followed(Set.of("t/ours")); // it polls again
        assertTrue(fresh.offer("persistent://t/ours/b"));
    }

    @Test
    void theSameTopicTwiceIsToldOnceAndTheQueueIsBounded() {
        FreshTopics fresh = new FreshTopics(now::get, 60_000, 3);
        fresh.followed(Set.of("t/ours"));
        for (String name : List.of("a", "a", "b", "c", "d", "e")) {
            fresh.offer("persistent://t/ours/" + name);
        }
        List<String> drained = fresh.drain();
        assertEquals(Set.of("persistent://t/ours/a", "persistent://t/ours/b", "persistent://t/ours/c"),
                Set.copyOf(drained)); // each once, and no more than 3 waiting: d and e are dropped
        assertEquals(3, drained.size());
        assertTrue(fresh.offer("persistent://t/ours/f")); // room again after the drain
        assertEquals(List.of("persistent://t/ours/f"), fresh.drain());
    }

    @Test
    void offersFromManyThreadsAreEachDrainedOnceWithADrainAskedForWhenNeeded() throws Exception {
        FreshTopics fresh = new FreshTopics(System::currentTimeMillis, 60_000, 100_000);
        fresh.followed(Set.of("t/ours"));
        int threads = 4;
        int each = 5_000;
        CountDownLatch start = new CountDownLatch(1);
        java.util.concurrent.atomic.AtomicInteger drainsAsked = new java.util.concurrent.atomic.AtomicInteger();
        java.util.Set<String> drained = java.util.concurrent.ConcurrentHashMap.newKeySet();
        java.util.concurrent.ExecutorService drainer = java.util.concurrent.Executors.newSingleThreadExecutor();
        Thread[] producers = new Thread[threads];
        for (int t = 0; t < threads; t++) {
            int id = t;
            producers[t] = new Thread(() -> {
                try {
                    start.await();
                } catch (InterruptedException e) {
                    return;
                }
                for (int i = 0; i < each; i++) {
                    if (fresh.offer("persistent://t/ours/p" + id + "-" + i)) {
                        drainsAsked.incrementAndGet();
                        drainer.execute(() -> drained.addAll(fresh.drain()));
                    }
                }
            });
            producers[t].start();
        }
        start.countDown();
        for (Thread producer : producers) {
            producer.join();
        }
        drainer.submit(() -> { }).get();
        drainer.shutdown();
        assertEquals(threads * each, drained.size()); // no offer was left without a drain after it
        assertTrue(drainsAsked.get() < threads * each, "a drain per offer: " + drainsAsked.get());
    }
}
